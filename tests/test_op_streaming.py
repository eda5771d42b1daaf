"""--timing op streams call times to disk: memory does not grow with --decode, ops.csv holds
every call exactly once, and its size is known before anything starts (issue 9, item 5)."""

import json
import os
import subprocess
import sys

from tests.replay_helpers import infercomm, last_json, needs_mpi, read_csv, tiny_model

# Peak RSS of the largest process of a run (the ranks), in KiB: RUSAGE_CHILDREN covers every
# waited-for descendant, so the ranks the launcher waited for are counted.
MEASURE = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "microbench", *sys.argv[1:]],
                      capture_output=True, text=True)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write(done.stderr)
"""


def peak_rss_kib(tmp_path, decode: int) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, "replay", "--model", tiny_model(tmp_path), "--tp", "2",
         "--prompt", "4", "--decode", str(decode), "-n", "1", "-w", "0", "--device", "cpu",
         "--timing", "op", "--backend", "mpi", "--out", str(tmp_path / f"o{decode}")],
        capture_output=True, text=True, timeout=300, check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    status, kib = proc.stdout.split()
    assert status == "0", proc.stderr
    return int(kib)


@needs_mpi  # over MPI 100,000 calls take seconds; over gloo here 35-150 s
def test_rank_memory_does_not_grow_with_the_number_of_calls(tmp_path):
    short = peak_rss_kib(tmp_path, 200)     # 10 calls x 200 steps = 2,000 calls a rank
    long = peak_rss_kib(tmp_path, 10_000)   # 10 calls x 10,000 steps = 100,000 calls a rank
    # Kept per rank at 100,000 calls: one inference's marks (100,001 x ~36 B = 3.6 MB), their
    # float64 copies (0.8 MB each) and one 2 MiB chunk in transit; holding every row as before
    # took over 100 MB more on rank 0. 40 MiB leaves room for the allocator.
    assert long - short < 40 * 1024, (short, long)


def test_ops_csv_has_every_call_once_in_todays_columns(tmp_path):
    # vllm-v0: its logits are one gather to TP rank 0 (vllm's are an all-gather)
    proc, _ = infercomm("replay", "--engine", "vllm-v0", "--model", tiny_model(tmp_path),
                        "--tp", "2", "--prompt", "8", "--decode", "300", "-n", "2", "-w", "1",
                        "--device", "cpu", "--timing", "op", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    # 2 ranks x 2 timed inferences x 300 steps x 10 calls (9 allreduces + 1 gather)
    assert "ops.csv will hold 12,000 rows" in proc.stderr
    folder = tmp_path / last_json(proc.stdout)["results_dir"].split("/")[-1]
    rows = read_csv(folder / "ops.csv")
    assert list(rows[0]) == ["iteration", "rank", "stage", "phase", "step", "call", "op", "tag",
                             "group", "bytes", "time_us"]
    assert len(rows) == 2 * 2 * 300 * 10
    keys = {(r["iteration"], r["rank"], r["step"], r["call"]) for r in rows}
    assert len(keys) == len(rows)  # no call twice
    summary = json.loads((folder / "summary.json").read_text())
    # the per-kind figures come from the same samples: 9 allreduces and 1 gather a step
    assert summary["by_op"]["allreduce"]["calls"] == 9 * 300
    assert summary["by_op"]["gather"]["calls"] == 300


def test_an_ops_csv_beyond_the_limit_is_refused_up_front(tmp_path):
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt",
                        "8", "--decode", "300", "-n", "2", "--device", "cpu", "--timing", "op",
                        "--max-ops-csv", "100K", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("infercomm replay: error: --timing op would write an ops.csv "
                                  "of 12,000 rows, about ")
    assert "above --max-ops-csv 100.00 KiB" in proc.stderr
    assert not (tmp_path / "o").exists()
