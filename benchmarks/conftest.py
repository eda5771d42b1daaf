"""Shared by the benchmarks: the ratios they exist to show, printed after pytest-benchmark's
table; and quiet ranks beyond 0 when run under mpiexec (bench_replay_overhead.py)."""

import os

import pytest

# (group, name) -> median seconds, filled by the benchmarks as they finish.
MEDIANS: dict[tuple[str, str], float] = {}
# (group, name) -> minimum seconds: for CPU-bound code on a shared machine, noise only adds
# time, so the minimum is the steadier figure to compare.
MINIMA: dict[tuple[str, str], float] = {}
# group -> (numerator, denominator, goal text): the ratio to print for that group.
RATIOS: dict[str, tuple[str, str, str]] = {}


def rank() -> int:
    return int(os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)


def record(benchmark, group: str, name: str) -> float:
    """Keep a finished benchmark's median (seconds) for the ratios; returns it."""
    median = float(benchmark.stats.stats.median)
    MEDIANS[(group, name)] = median
    MINIMA[(group, name)] = float(benchmark.stats.stats.min)
    return median


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if rank() != 0:
        # Every rank runs the same benchmarks in the same order (their calls must match);
        # one table is enough, and only rank 0 saves results. Failures still end the run
        # through the exit status.
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)
        config.option.benchmark_autosave = False
        config.option.benchmark_save = None
        config.option.benchmark_json = None
        config.option.benchmark_compare = False


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter) -> None:
    lines = []
    for group, (num, den, goal) in RATIOS.items():
        a, b = MEDIANS.get((group, num)), MEDIANS.get((group, den))
        if a is not None and b is not None and b > 0:
            line = (f"{group}: {num} / {den} = {a / b:.3f} (median {a * 1e3:.3f} ms / "
                    f"{b * 1e3:.3f} ms")
            lo_a, lo_b = MINIMA.get((group, num)), MINIMA.get((group, den))
            if lo_a is not None and lo_b:
                line += f"; of minima {lo_a / lo_b:.3f}: {lo_a * 1e3:.3f} ms / {lo_b * 1e3:.3f} ms"
            lines.append(f"{line}; {goal})")
    if lines:
        terminalreporter.write_sep("-", "ratios")
        for line in lines:
            terminalreporter.write_line(line)
