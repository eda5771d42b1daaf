"""Megatron-Core itself as the oracle of `--engine megatron`: its static inference engine serves
tiny random-weight GPTs on gloo, on 4 local ranks, one layout after another (model parallel
destroyed and initialised again between them), each request batch under torch's profiler;
then `infercomm validate` holds every rank's trace against the pattern.

    .venv-megatron/bin/python scripts/megatron_cpu_oracle.py --out megatron-oracle

Run it with the Python of a venv that holds megatron-core (`make setup-megatron` makes
`.venv-megatron`). The ranks are scripts/megatron_cpu_ranks.py (what they run, and the CPU
stand-ins Megatron needs). OUT/LAYOUT-WORKLOAD/ holds one `rankR.pt.trace.json.gz` a rank,
OUT/model/config.json and OUT/moe-model/config.json the tiny dense and MoE models as `--model`
reads them, OUT/logs/ each rank's output and
OUT/oracle.json, per trace folder, validate's arguments (and exit status unless
--no-validate). The last line is a short JSON object; exit 1 when a trace differs from its
pattern, 2 on bad arguments or when a rank fails.

Layouts at 4 ranks (LAYOUTS): the dense GPT at TP2 and PP2, each as two data-parallel
replicas (validated as --dp 2), and TP2 x PP2; the MoE GPT at TP2 (--dp 2), TP2 x EP2 (the
expert-parallel group spans both replicas: --dp 2 --ep), TP2 x PP2 and PP2 x EP2 (--dp 2 --ep).
Ranks are ordered tp, pp, dp (Megatron's `order="tp-cp-ep-pp-dp"`), as infercomm's layout
orders them (at dp 1 Megatron's default order too), except PP2 x EP2: Megatron carves the EP
group out of DP, which its own order places inside PP ("tp-cp-ep-dp-pp", its default), so it
runs that and is validated with --rank-order tp-dp-pp.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RANKS = Path(__file__).resolve().parent / "megatron_cpu_ranks.py"
WORLD = 4
HIDDEN, HEADS, LAYERS, VOCAB, FFN = 128, 4, 4, 256, 256  # as megatron_cpu_ranks.py builds
# and its MoE model: 4 experts (top 2) of FFN 128 and a shared expert of 128 in layers 1-3
EXPERTS, TOP_K, MOE_FFN, DENSE_LAYERS = 4, 2, 128, [0]

# Each workload: a static batch of `batch` prompts of `prompt` tokens generating `decode`
# tokens (1 prefill + decode - 1 decode steps); `log_probs`: SamplingParams.return_log_probs.
WORKLOADS = {
    "last": dict(batch=2, prompt=8, decode=4, log_probs=False),
    "log-probs": dict(batch=2, prompt=8, decode=3, log_probs=True),
}
# name: tp, pp, expert_model_parallel_size, MoE model or dense, Megatron's rank order, the
# workloads served. "tp-cp-ep-pp-dp" orders ranks as infercomm's layout does; "tp-cp-ep-dp-pp"
# is Megatron's default (PP outermost), which EP with PP needs (its EP group is carved out of
# DP) and validate reads with --rank-order tp-dp-pp.
INFERCOMM_ORDER, MEGATRON_ORDER = "tp-cp-ep-pp-dp", "tp-cp-ep-dp-pp"
LAYOUTS = {
    "tp2": dict(tp=2, pp=1, ep=1, moe=False, order=INFERCOMM_ORDER, workloads=list(WORKLOADS)),
    "pp2": dict(tp=1, pp=2, ep=1, moe=False, order=INFERCOMM_ORDER, workloads=list(WORKLOADS)),
    "tp2-pp2": dict(tp=2, pp=2, ep=1, moe=False, order=INFERCOMM_ORDER,
                    workloads=list(WORKLOADS)),
    "moe-tp2": dict(tp=2, pp=1, ep=1, moe=True, order=INFERCOMM_ORDER, workloads=["last"]),
    "moe-tp2-ep2": dict(tp=2, pp=1, ep=2, moe=True, order=INFERCOMM_ORDER, workloads=["last"]),
    "moe-tp2-pp2": dict(tp=2, pp=2, ep=1, moe=True, order=INFERCOMM_ORDER, workloads=["last"]),
    "moe-pp2-ep2": dict(tp=1, pp=2, ep=2, moe=True, order=MEGATRON_ORDER, workloads=["last"]),
}


def write_config(path: Path, moe: bool) -> Path:
    """The tiny GPT as a Hugging Face config.json, for --model: Llama's field names, or
    Qwen2-MoE's for the MoE model (num_experts, shared_expert_intermediate_size, and
    mlp_only_layers for the dense layer 0)."""
    path.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
              "intermediate_size": FFN, "vocab_size": VOCAB, "torch_dtype": "float32"}
    if moe:
        config |= {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                   "num_experts": EXPERTS, "num_experts_per_tok": TOP_K,
                   "moe_intermediate_size": MOE_FFN, "shared_expert_intermediate_size": MOE_FFN,
                   "decoder_sparse_step": 1, "mlp_only_layers": DENSE_LAYERS}
    (path / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return path / "config.json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(procs: list[subprocess.Popen]) -> None:
    """End every rank still running: SIGTERM, then SIGKILL after 5 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch(out: Path, plan: list[dict], timeout: float) -> str | None:
    """Run the ranks; None when all ended well, else what went wrong (one line)."""
    logs = out / "logs"
    logs.mkdir()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(WORLD):
            with open(logs / f"rank{rank}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(RANKS), str(out), json.dumps(plan)],
                    env={**env, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                return (f"rank {failed[0]} exited with {procs[failed[0]].returncode}: "
                        f"{_last_line(logs / f'rank{failed[0]}.log')}")
            if time.monotonic() > deadline:
                return f"the ranks ran past {timeout:.0f} s (logs in {logs})"
            time.sleep(0.2)
        failed = [r for r, p in enumerate(procs) if p.returncode]
        if failed:
            return (f"rank {failed[0]} exited with {procs[failed[0]].returncode}: "
                    f"{_last_line(logs / f'rank{failed[0]}.log')}")
        return None
    finally:
        _stop(procs)


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def trace_names(layouts: list[str]) -> list[tuple[str, str]]:
    """(layout, workload) of every trace folder the layouts make, in serving order."""
    return [(name, work) for name in layouts for work in LAYOUTS[name]["workloads"]]


def validate_args(out: Path, layout: str, workload: str) -> list[str]:
    """`infercomm validate` of one trace folder: the options the engine ran with."""
    lay, work = LAYOUTS[layout], WORKLOADS[workload]
    tp, pp = lay["tp"], lay["pp"]
    config = out / ("moe-model" if lay["moe"] else "model") / "config.json"
    traces = sorted(str(p) for p in (out / f"{layout}-{workload}").glob("rank*.pt.trace.json.gz"))
    return ["validate", "--trace", *traces, "--engine", "megatron", "--model", str(config),
            "--tp", str(tp), "--pp", str(pp), "--dp", str(WORLD // (tp * pp)),
            *(["--ep"] if lay["ep"] > 1 else []),
            *(["--rank-order", "tp-dp-pp"] if lay["order"] == MEGATRON_ORDER else []),
            "--prompt", str(work["prompt"]), "--decode", str(work["decode"]),
            "--batch", str(work["batch"]), "--dtype", "fp32",
            *(["--return-log-probs"] if work["log_probs"] else [])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="a folder that does not exist yet")
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS),
                        help="layouts to serve, in turn, on one launch (default all)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds the ranks may run in all (default 600)")
    parser.add_argument("--no-validate", action="store_true",
                        help="only serve and profile; write validate's arguments")
    args = parser.parse_args()
    if args.out.exists():
        print(f"--out {args.out} exists; name a new folder", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print(f"--timeout {args.timeout:g} must be positive (seconds)", file=sys.stderr)
        return 2
    from importlib.metadata import version
    start = time.monotonic()
    write_config(args.out / "model", moe=False)
    write_config(args.out / "moe-model", moe=True)
    plan = [{"name": name, **{k: LAYOUTS[name][k] for k in ("tp", "pp", "ep", "moe", "order")},
             "workloads": [{"name": w, **WORKLOADS[w]} for w in LAYOUTS[name]["workloads"]]}
            for name in args.layouts]
    failure = launch(args.out, plan, args.timeout)
    if failure is not None:
        print(f"megatron oracle: {failure}", file=sys.stderr)
        return 2
    doc: dict = {"megatron_core": version("megatron-core"), "torch": version("torch"),
                 "world_size": WORLD, "serve_s": round(time.monotonic() - start, 1),
                 "traces": {}}
    status = 0
    for layout, workload in trace_names(args.layouts):
        argv = validate_args(args.out, layout, workload)
        entry = doc["traces"][f"{layout}-{workload}"] = {"validate": argv}
        if args.no_validate:
            continue
        # infercomm from this checkout: its patterns and readers import no third party
        proc = subprocess.run([sys.executable, "-m", "microbench", *argv], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, check=False)
        print(f"== {layout}-{workload}: infercomm validate "
              f"{' '.join(argv[argv.index('--engine'):])}")
        print(proc.stdout + proc.stderr, end="")
        entry["exit"] = proc.returncode
        status = max(status, min(proc.returncode, 1))
    doc["seconds"] = round(time.monotonic() - start, 1)
    (args.out / "oracle.json").write_text(json.dumps(doc, indent=1) + "\n")
    short = {"out": str(args.out), "megatron_core": doc["megatron_core"],
             "serve_s": doc["serve_s"], "seconds": doc["seconds"]}
    if not args.no_validate:
        short["validate_exit"] = {k: v["exit"] for k, v in doc["traces"].items()}
    print(json.dumps(short, separators=(",", ":")))
    return status


if __name__ == "__main__":
    # one-line errors, no half-made --out; on Ctrl-C the ranks were stopped on the way out
    # (launch) and the guard says so in one line, 130
    import script_guard  # beside this script
    sys.exit(script_guard.run(main, "megatron_cpu_oracle"))
