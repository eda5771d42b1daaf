"""The real engines' cases served in the background of a test session.

Starting an engine is most of what an engine test costs (vLLM's CPU build: some 10 CPU s of
imports in the engine's process, 6 more in each worker's, a few seconds of work), and on a
2-core machine the rest of the suite leaves much of the CPUs idle: measured, the suite
without its engine files took 533 s of wall time and 705 CPU s (132% of 200). So when a
session has engine tests, tests/conftest.py lists the cases they will ask for, moves those
tests to the end of the session, and tests/real_engine_runner.py serves the cases one after
another at the lowest priority while the other tests run; a test that asks for a case waits
for it. The single-engine vLLM cases share one process (tests/vllm_oracle_batch.py), and so
one import of vLLM. A case nobody listed is served in the foreground, as before.

A case is served by the command a person would run (scripts/vllm_cpu_oracle.py CASE, the
Megatron oracle), traces only; each test still validates the traces itself.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).with_name("real_engine_runner.py")
NICE = 19


@dataclass(frozen=True)
class Job:
    """One engine case: the command that serves it and the folder it writes; `case` where
    tests/vllm_oracle_batch.py can serve it beside others in one process (a single-engine
    vLLM case on this CPU's own kernels)."""
    key: str
    argv: list[str]
    out: Path
    timeout: int
    env: dict[str, str] = field(default_factory=dict)
    case: str | None = None


@dataclass
class Served:
    """How a job ended: its exit status and the end of its output."""
    rc: int
    output: str


def vllm_job(case: str, isa: str, folder: Path) -> Job:
    """scripts/vllm_cpu_oracle.py serving `case` (traces only; the tests validate)."""
    python = REPO / ".venv-vllm" / "bin" / "python"
    out = folder / f"vllm-{case}-{isa}" / "out"
    return Job(f"vllm:{case}:{isa}",
               [str(python), str(REPO / "scripts" / "vllm_cpu_oracle.py"), case, "--out",
                str(out), "--no-validate", "--isa", isa], out, timeout=420,
               env={**os.environ, "PYTHONPATH": ""},
               case=case if isa == "native" and case in _single_engine_cases() else None)


@functools.cache
def _single_engine_cases() -> frozenset[str]:
    """scripts/vllm_cpu_cases.py's cases of one `vllm.LLM` (not the NIXL pair or DP)."""
    name = "_infercomm_tests_vllm_cpu_cases"
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "vllm_cpu_cases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return frozenset({*module.CASES, *module.PROBES})


def megatron_job(folder: Path) -> Job:
    """scripts/megatron_cpu_oracle.py: every layout on one launch of 4 ranks."""
    python = REPO / ".venv-megatron" / "bin" / "python"
    out = folder / "megatron" / "out"
    return Job("megatron", [str(python), str(REPO / "scripts" / "megatron_cpu_oracle.py"),
                            "--out", str(out), "--no-validate", "--timeout", "420"], out,
               timeout=480, env={**os.environ, "PYTHONPATH": ""})


def served_out(config: pytest.Config, keys: tuple[str, ...],
               make: Callable[[], Job]) -> Path:
    """The folder of a case served: by the session's background where it lists one of
    `keys` (the first it lists), else here and now (`make()`); a failed serving fails the
    test with the end of its output."""
    background = config.stash.get(BACKGROUND, None)
    listed = [job for key in keys if background and (job := background.job(key))]
    if listed:
        job, result = listed[0], background.result(listed[0].key)
    else:
        job = make()
        result = run_in_foreground(job)
    assert result.rc == 0, result.output
    return job.out


def run_in_foreground(job: Job) -> Served:
    """Serve a job here and now (a case the session did not list)."""
    job.out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(job.argv, cwd=REPO, capture_output=True, text=True,
                          timeout=job.timeout, env=job.env)
    return Served(proc.returncode, (proc.stdout + proc.stderr)[-4000:])


class Background:
    """The runner serving a session's listed jobs, and what each came to. The vLLM cases
    it can batch (Job.case) are served first, in one process (tests/vllm_oracle_batch.py),
    then the others, one process each."""

    def __init__(self, jobs: list[Job], folder: Path) -> None:
        self.folder = folder
        batched = [job for job in jobs if job.case is not None]
        entries: list[dict] = []
        # key -> (the runner's entry that serves it, its job, the file saying it was served)
        self.jobs: dict[str, tuple[int, Job, Path | None]] = {}
        if batched:
            argv = [batched[0].argv[0], str(Path(__file__).with_name("vllm_oracle_batch.py"))]
            for job in batched:
                argv += [str(job.out), str(job.case)]
                self.jobs[job.key] = (0, job, job.out.parent / "served.json")
            entries.append({"argv": argv, "env": batched[0].env,
                            "timeout": sum(job.timeout for job in batched)})
        for job in jobs:
            if job.case is None:
                self.jobs[job.key] = (len(entries), job, None)
                entries.append({"argv": job.argv, "env": job.env, "timeout": job.timeout})
        for job in jobs:
            job.out.parent.mkdir(parents=True, exist_ok=True)
        (folder / "jobs.json").write_text(json.dumps(
            [{**entry, "cwd": str(REPO)} for entry in entries]))
        self.timeouts = [entry["timeout"] for entry in entries]
        with open(folder / "runner.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(RUNNER), str(folder)], cwd=REPO,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                preexec_fn=lambda: os.nice(NICE))

    def job(self, key: str) -> Job | None:
        entry = self.jobs.get(key)
        return entry[1] if entry else None

    def result(self, key: str) -> Served:
        """Wait for a listed job to be served (the runner's timeouts bound the wait)."""
        number, _job, served = self.jobs[key]
        done = self.folder / f"{number}.done"
        deadline = time.monotonic() + 60 + sum(self.timeouts[:number + 1])
        while not (served is not None and served.exists()) and not done.exists():
            if self.proc.poll() is not None and not done.exists():
                return Served(-1, f"the background runner ended (status "
                                  f"{self.proc.returncode}) before {key} was served: "
                                  f"{(self.folder / 'runner.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                return Served(-1, f"{key} was not served in time")
            time.sleep(0.2)
        log = (self.folder / f"{number}.log").read_text(errors="replace")[-4000:]
        if served is not None and served.exists():
            return Served(json.loads(served.read_text())["rc"], log)
        rc = json.loads(done.read_text())["rc"]
        return Served(rc if served is None or rc != 0 else -1, log)

    def _processes(self) -> list[int]:
        """The runner and every process below it (an engine server in a session of its own
        included), parents before children."""
        return [self.proc.pid, *descendants(self.proc.pid)]

    def pause(self) -> None:
        """Stop the runner and everything it serves (SIGSTOP) while a test measures time:
        at the lowest priority they still take what the test leaves idle, and on 2 cores
        an MPI decode step of 100 us measured 10% slower beside them (1.104 of its
        prediction, where the suite alone measures within 5%)."""
        if self.proc.poll() is None:
            for _ in range(2):  # a process started while the first pass ran
                for pid in self._processes():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in reversed(self._processes()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        """End the runner and the job it is serving (the runner ends its job's group)."""
        self.resume()  # a stopped process hears no SIGTERM
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def descendants(root: int) -> list[int]:
    """The process ids below `root`, nearest first, from each process's parent in /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], {root}
    while frontier:
        below = [pid for pid, parent in parents.items() if parent in frontier]
        found += below
        frontier = set(below)
    return found


@contextlib.contextmanager
def paused(config: pytest.Config):
    """The session's background serving stopped for the duration (tests that time)."""
    background = config.stash.get(BACKGROUND, None)
    if background is None:
        yield
        return
    background.pause()
    try:
        yield
    finally:
        background.resume()


BACKGROUND = pytest.StashKey[Background]()
_FOLDER = pytest.StashKey[Path]()


@functools.cache
def cpu_has_avx512() -> bool:
    """As vLLM's CPU build asks it (torch.cpu._is_avx512_supported): on a CPU without
    AVX-512 a case asked for at isa avx2 is the case served natively."""
    import torch
    return bool(torch.cpu._is_avx512_supported())


def _skipped(item: pytest.Item) -> bool:
    return any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))


ENGINE_MODULES = ("test_real_engine_vllm", "test_real_engine_hybrid", "test_real_engine_megatron")


def _module(item: pytest.Item) -> str:
    return getattr(getattr(item, "module", None), "__name__", "").rsplit(".", 1)[-1]


def engine_tests_last(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests of served engines after all others (in their order): the runner then has
    the whole rest of the session's idle CPU time to serve their cases."""
    return ([item for item in items if _module(item) not in ENGINE_MODULES]
            + [item for item in items if _module(item) in ENGINE_MODULES])


def listed_jobs(items: list[pytest.Item], folder: Path) -> list[Job]:
    """The engine cases the selected tests will ask for, in the order they will ask."""
    keys: dict[str, Job] = {}
    for item in items:
        name = _module(item)
        if _skipped(item) or name not in ENGINE_MODULES:
            continue
        if name == "test_real_engine_megatron":
            job = megatron_job(folder)
        elif name == "test_real_engine_hybrid":
            job = vllm_job("nemotron-h-tp2", "native", folder)
        else:
            params = getattr(getattr(item, "callspec", None), "params", {})
            marker = item.get_closest_marker("vllm_case")
            case = params.get("case", marker.args[0] if marker else None)
            if case is None:
                continue
            isa = params.get("isa", "native")
            if isa == "avx2":
                isa = isa if cpu_has_avx512() else "native"
            job = vllm_job(case, isa, folder)
        keys.setdefault(job.key, job)
    return list(keys.values())


def start(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Serve the session's engine cases in the background (conftest, after collection)."""
    folder = Path(tempfile.mkdtemp(prefix="infercomm-engines-"))
    try:
        jobs = [job for job in listed_jobs(items, folder) if Path(job.argv[0]).exists()]
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if not jobs:
        shutil.rmtree(folder, ignore_errors=True)
        return
    config.stash[_FOLDER] = folder
    config.stash[BACKGROUND] = Background(jobs, folder)


def stop(config: pytest.Config) -> None:
    """End what is still serving and remove its folder (conftest, at the session's end)."""
    background = config.stash.get(BACKGROUND, None)
    if background is not None:
        background.stop()
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
