"""`predict` against real replays of TP2, PP2, TP2xPP2 and PP4, over MPI and gloo: prefill,
decode step and end to end each within 10% over MPI and 50% over gloo (TOLERANCE: the
benchmark's own spread, and a known bias of gloo's calls), means of two measurements, each
figure a median of its replay.

A claim of a few percent can only be checked with a ruler steadier than that, so every figure
is measured twice: sweep A, the replays, sweep B, the replays again. Where the two replays of a
layout, or the predictions from the two sweeps, differ by more than 5%, the machine did not
repeat itself closely enough to decide, and the case is skipped with the figures (where they
agree, the assertion stands). On the 2-core VM this project is built on they often
do not: two identical MPI TP2 replays seconds apart measured a prefill of 1.38 and 3.97 ms,
and one MPI sweep's 512 KiB all-reduce went from 153 to 415 us over its 6 seconds
(`python benchmarks/predict_accuracy.py` measures this spread alongside the ratios).

Inferences are short (a 4-layer model of hidden size 1024, batch 4, prompt 32, 32 output
tokens, fp32) and many (-n 100), so that a rank descheduled by other work spoils few of them
and the median is the uncontended figure. The messages are 8 KiB to 512 KiB, so that each
figure is tens of microseconds or more: with the tiny model of the other tests the PP2
prefill is two 4 KiB transfers, 4.5 us, and the microsecond by which the ranks leave the
barrier apart is 20% of it. fp32, which MPICH sums itself (bf16 over MPI is a Python sum).
32 output tokens, so that a cost predict does not price, once an inference, is a few percent
of the decode step and not the whole tolerance: the first transfers after the prefill's
512 KiB ones take MPICH 6-9 us longer than warm ones (analysis/predict.py, "Not priced"); with
8 output tokens the MPI PP2 decode step measured 1.10-1.16x its prediction in six rounds of
the benchmark, and a CI run failed at 1.13.

Four-rank layouts need four cores: on fewer, MPICH's ranks spin while they wait and gloo's
sleep and wake, so a rank whose data is ready waits for the scheduler (PP4 prefill over MPI
on the 2-core VM: 3.3 ms measured against 0.3 ms predicted from the same machine's sweep;
with MPICH's progress throttle, MPIR_CVAR_CH4_PROGRESS_THROTTLE, 0.5 ms and still 2x off);
that measures the scheduler, not the library, and those cases are skipped there.
"""

import json
import os
import subprocess
import sys

import pytest

# One workload for this test and the benchmark that measures the same thing over more rounds:
# 4 layers, hidden 1024 (16 KiB decode and 512 KiB prefill activations), vllm-v0, fp32.
from benchmarks.predict_accuracy import HEADLINE, LAYOUTS, PATTERN, SWEEP, WIDE, WORLD
from tests import real_engine_serving
from tests.replay_helpers import infercomm, last_json, needs_mpi


@pytest.fixture(scope="module", autouse=True)
def _engines_paused(request: pytest.FixtureRequest):
    """The engines the session serves in the background stopped while this module times
    (tests/real_engine_serving.py)."""
    with real_engine_serving.paused(request.config):
        yield

BACKENDS = [pytest.param("mpi", marks=needs_mpi), "torch"]
# 10% over MPI (issue 32), where the machine repeats itself within 5%: a hop is priced by
# the sweep's one-way stream, no sooner than the smallest ping-pong's half
# (analysis/costs.latency_us; the later of the stream and half the ping-pong at the hop's
# size put a fresh-clone CI run's PP2 prefill at 0.895 of its prediction). Over gloo the
# replay's one-way sends cost more than the sweep says (a fresh-clone CI run, steady within
# 5%, priced from half the sendrecv: PP2 prefill measured 1.22-1.27x predicted; its 512 KiB
# sends took 234-257 us against half a 341 us sendrecv; from the stream,
# benchmarks/predict_accuracy.py's gloo PP2 medians are 1.04-1.09). And gloo's collectives
# wake sleeping threads: in six sweeps of one minute the 16 KiB all-reduce's median was
# 311-414 us and its mean 410-888 us (p95 up to 3.9 ms), and a TP2 replay's 9 all-reduces a
# decode step cost 540-600 us each. Priced from the median run of 10 calls, five runs of the
# benchmark put gloo's TP2 medians at 1.27-1.44 (decode step); from the mean run
# (sweep/cases.run_time), one run of five rounds at 1.16 (rounds 0.92-1.39), its PP2 e2e
# rounds at 0.39-1.48, the sweeps' own predictions 1.4-4.2x apart (p90 / p10): a known bias
# and a wide noise, so gloo is held to 50%.
TOLERANCE = {"mpi": 0.10, "torch": 0.50}
STEADY = 0.05  # two measurements of the same thing agree this closely, or nothing is decided
# A gap no noise explains (issue 34: a 24x gap was skipped as unsteady). The worst noise seen:
# two identical replays 2.9x apart (1.38 and 3.97 ms, module doc); with 8 jobs on the 2-core
# VM, two sweeps' PP2 prefill predictions 3.7x apart (1737.7 and 6473.2 us) and the closest
# predicted and measured pair 7.5x apart (1737.7 against 231.5 us). The closest pair 10x
# apart fails, however unsteady the machine.
GROSS = 10.0


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _results_dir(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout)["results_dir"]


def _spread(a: float, b: float) -> float:
    return abs(a - b) / ((a + b) / 2)


@pytest.fixture(scope="module", params=BACKENDS)
def twice(request, tmp_path_factory):
    """Per backend: sweep A, each layout replayed, sweep B, each replayed again; for each
    layout the two (predicted, measured) pairs, A with the first replay, B with the second."""
    backend = request.param
    out = tmp_path_factory.mktemp(f"predict-{backend}")
    model = out / "config.json"
    model.write_text(json.dumps(WIDE))
    layouts = [name for name in LAYOUTS if WORLD[name] <= _cores()]
    pairs: dict[str, list[dict]] = {name: [] for name in layouts}
    for round_ in ("a", "b"):
        proc, _ = infercomm("sweep", "--backend", backend, "--device", "cpu", *SWEEP,
                            "--out", str(out / f"sweep-{round_}"), timeout=300)
        sweep = _results_dir(proc)
        for name in layouts:
            proc, _ = infercomm("replay", "--backend", backend, "--device", "cpu", "--model",
                                str(model), *LAYOUTS[name], *PATTERN,
                                "--out", str(out / f"{name}-{round_}"), timeout=300)
            replay = _results_dir(proc)
            proc, _ = infercomm("predict", "--sweep", sweep, "--against", replay)
            assert proc.returncode == 0, proc.stderr
            pairs[name].append(last_json(proc.stdout))
    return backend, pairs


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_predicted_within_ten_percent(twice, layout):
    backend, pairs = twice
    if WORLD[layout] > _cores():
        pytest.skip(f"{WORLD[layout]} ranks on {_cores()} cores: waits measure the scheduler "
                    "(module doc)")
    first, second = pairs[layout]
    figures = []
    for metric in HEADLINE:
        predicted = [first["predicted"][metric], second["predicted"][metric]]
        measured = [first["measured"][metric], second["measured"][metric]]
        ratio = sum(measured) / sum(predicted)
        figures.append((metric, predicted, measured, ratio))
    text = "; ".join(f"{m}: predicted {p[0]:.1f}, {p[1]:.1f} us, measured {v[0]:.1f}, "
                     f"{v[1]:.1f} us, ratio {r:.3f}" for m, p, v, r in figures)
    sys.stderr.write(f"{backend} {layout}: {text}\n")
    unsteady = [f"{m} {kind} {_spread(*pair):.0%} apart"
                for m, p, v, _ in figures
                for kind, pair in (("predictions", p), ("replays", v))
                if _spread(*pair) > STEADY]
    tolerance = TOLERANCE[backend]
    for metric, predicted, measured, _ in figures:  # beyond any noise: no skip can excuse it
        gap = max(min(measured) / max(predicted), min(predicted) / max(measured))
        assert gap < GROSS, (f"{backend} {layout} {metric}: measured {measured} us, predicted "
                             f"{predicted} us: every pair {gap:.1f}x apart, beyond the "
                             f"{GROSS}x no noise of this machine reached")
    if unsteady:
        pytest.skip(f"{backend} {layout}: the machine did not repeat itself within "
                    f"{STEADY:.0%} ({', '.join(unsteady)}), so a {tolerance:.0%} prediction "
                    f"cannot be decided; {text}")
    for metric, predicted, measured, ratio in figures:
        assert 1 - tolerance <= ratio <= 1 + tolerance, (
            f"{backend} {layout} {metric}: measured {measured} us, predicted {predicted} us "
            f"({ratio:.3f}), on a machine that repeated itself within {STEADY:.0%}")

