"""`plan` answers any --gpus in bounded time, or refuses above its stated bound (fault battery
item 6: --gpus 10**9 gave no answer after 300 s, 10**6 took over 120 s), and refuses an
infinite --gpu-memory in one line (item 13)."""

import json
from pathlib import Path

from microbench.analysis.layouts import _divisors
from microbench.cli.plan import MAX_GPUS
from tests.replay_helpers import infercomm

SWEEP = next(Path("results/examples/plan-sweeps").glob("*-intra-shm"))
PLAN = ("plan", "--gpus-per-node", "8", "--sweep", str(SWEEP), "--sweep-inter", str(SWEEP),
        "--model", "llama-3.1-8b", "--prompt", "128", "--decode", "16")


def test_divisors_by_trial_to_the_square_root():
    assert _divisors(1) == [1]
    assert _divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    # 2**20 has the 21 divisors 2**0 .. 2**20; 10**9 = 2**9 5**9 has 10 x 10 = 100.
    assert _divisors(1 << 20) == [1 << k for k in range(21)]
    assert len(_divisors(10**9)) == 100


def test_the_largest_gpu_count_is_priced_within_a_minute():
    # Before: every DP replica of a dense layout was walked and hashed (2**20 of them).
    proc, _ = infercomm(*PLAN, "--gpus", str(MAX_GPUS), "--format", "json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    best = [row for row in doc["layouts"] if row.get("best")]
    assert len(best) == 1


def test_beyond_the_bound_is_refused_at_once():
    proc, _ = infercomm(*PLAN, "--gpus", str(10**9), timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith(f"plan prices at most {MAX_GPUS:,} ranks")


def test_an_infinite_gpu_memory_is_refused():
    proc, _ = infercomm(*PLAN, "--gpus", "16", "--gpu-memory", "inf", timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--gpu-memory inf must be a positive, finite number of GiB" in proc.stderr
