"""How close `predict` comes to real replays, and how closely the machine repeats itself.

    python benchmarks/predict_accuracy.py [--backend mpi,torch] [--layouts tp2,pp2]
                                          [--rounds 5] [--out DIR]

Alternates, `--rounds` times: a sweep, then a replay of each layout, each predicted from
that round's sweep (`infercomm predict --against`). Sweeps and replays are taken alternately
over the same minutes, so both sample the same mixture of machine states; the median over
rounds of measured / predicted is the predictor's error where the machine drifts, and the
spread of the same layout's replays over the rounds (p90 / p10 of the round medians) is the
floor under any prediction's error: a predictor cannot be closer to a replay than the
replays are to each other. The last line is one JSON object.

The model is the one of tests/test_predict_replay.py (4 layers, hidden 1024, batch 4,
prompt 32, 32 output tokens, fp32, vllm-v0): 16 KiB decode and 512 KiB prefill messages.
Layouts of more ranks than cores measure the scheduler; they run when asked for, but the
output says so.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = ["--op", "allreduce,allgather,gather,sendrecv,stream", "-b", "4K", "-e", "1M", "-f", "2",
         "--dtype", "fp32", "-n", "200", "-w", "20"]
PATTERN = ["--engine", "vllm-v0", "--prompt", "32", "--decode", "32", "--batch", "4",
           "--dtype", "fp32", "-n", "100", "-w", "5"]
# 4 layers, hidden 1024: a decode step's [4, 1024] fp32 activations are 16 KiB, the
# prefill's [128, 1024] 512 KiB (TP2xPP2 sends halves); vocab 1000 keeps the gather small.
# 31 decode steps, not 7: the first transfers after the prefill's 512 KiB ones cost MPICH's
# shared-memory path 6-9 us more than the sweep's warm stream says, once an inference, which
# predict does not price (analysis/predict.py's "Not priced"); over the 14 transfers of 7
# steps that was 11% of the PP2 decode step (six rounds of this benchmark: 1.10-1.16), over
# the 62 of 31 steps it is about 3%.
# tests/test_predict_replay.py runs the same workload.
WIDE = {"hidden_size": 1024, "num_hidden_layers": 4, "vocab_size": 1000,
        "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096,
        "torch_dtype": "bfloat16", "_name_or_path": "wide"}
LAYOUTS = {"tp2": ["--tp", "2"], "pp2": ["--pp", "2"], "tp2pp2": ["--tp", "2", "--pp", "2"],
           "pp4": ["--pp", "4"]}
WORLD = {"tp2": 2, "pp2": 2, "tp2pp2": 4, "pp4": 4}
HEADLINE = ("prefill_us", "decode_step_us", "e2e_us")


def infercomm(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "microbench", *args], capture_output=True,
                          text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.exit(f"infercomm {args[0]} failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="mpi,torch")
    parser.add_argument("--layouts", default="tp2,pp2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown or args.rounds < 2:  # one line, exit 2
        parser.error(f"--layouts takes {', '.join(LAYOUTS)} (got {args.layouts}); "
                     f"--rounds at least 2 (got {args.rounds})")
    cores = len(os.sched_getaffinity(0))
    out = Path(args.out or tempfile.mkdtemp(prefix="infercomm-accuracy-"))
    model = out / "config.json"
    out.mkdir(parents=True, exist_ok=True)
    model.write_text(json.dumps(WIDE))
    summary: dict = {"cores": cores, "rounds": args.rounds, "load_before": os.getloadavg()[0],
                     "results": []}
    start = time.monotonic()
    for backend in args.backend.split(","):
        rounds: dict[str, list[dict]] = {name: [] for name in layouts}
        for k in range(args.rounds):
            sweep = infercomm("sweep", "--backend", backend, "--device", "cpu", *SWEEP,
                              "--out", str(out / "sweeps"))["results_dir"]
            for name in layouts:
                replay = infercomm("replay", "--backend", backend, "--device", "cpu",
                                   "--model", str(model), *LAYOUTS[name], *PATTERN,
                                   "--out", str(out / "replays"))["results_dir"]
                line = infercomm("predict", "--sweep", sweep, "--against", replay)
                rounds[name].append(line)
                ratios = " ".join(f"{m} {line['measured'][m] / line['predicted'][m]:.3f}"
                                  for m in HEADLINE)
                print(f"{backend} {name} round {k + 1}: measured/predicted {ratios}",
                      flush=True)
        for name in layouts:
            lines = rounds[name]
            row: dict = {"backend": backend, "layout": name,
                         "oversubscribed": WORLD[name] > cores}
            for metric in HEADLINE:
                ratios = [x["measured"][metric] / x["predicted"][metric] for x in lines]
                measured = [x["measured"][metric] for x in lines]
                predicted = [x["predicted"][metric] for x in lines]
                row[metric] = {
                    "median_ratio": round(statistics.median(ratios), 4),
                    "ratios": [round(r, 4) for r in ratios],
                    "replay_spread": round(percentile(measured, 0.9)
                                           / percentile(measured, 0.1), 4),
                    "sweep_spread": round(percentile(predicted, 0.9)
                                          / percentile(predicted, 0.1), 4)}
            summary["results"].append(row)
    summary["seconds"] = round(time.monotonic() - start, 1)
    print()
    print(f"{'backend':8} {'layout':7} {'metric':15} {'median m/p':>10} {'replays p90/p10':>16} "
          f"{'sweeps p90/p10':>15}  verdict")
    for row in summary["results"]:
        for metric in HEADLINE:
            cell = row[metric]
            within = abs(cell["median_ratio"] - 1) <= 0.10
            floor = cell["replay_spread"] - 1
            verdict = ("within 10%" if within else "off by more than 10%") + (
                f"; the replays alone spread {floor:.0%}" if floor > 0.10 else "") + (
                f"; {WORLD[row['layout']]} ranks on {cores} cores" if row["oversubscribed"]
                else "")
            print(f"{row['backend']:8} {row['layout']:7} {metric:15} {cell['median_ratio']:>10.3f} "
                  f"{cell['replay_spread']:>16.3f} {cell['sweep_spread']:>15.3f}  {verdict}")
    print(f"({summary['seconds']} s; runs in {out})")
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
