"""predict over a request workload: each scheduled step priced from a synthetic sweep, per
request the communication under TTFT and TPOT, checked by hand."""

import pytest

from tests.conftest import last_json
from tests.replay_helpers import infercomm, tiny_model
from tests.test_predict import fake_sweep
from tests.test_workload_cli import WORKLOAD


def test_predict_prices_each_request(tmp_path):
    # Fits: all-reduce 10 us + 0.001 us/B, all-gather 20 us + 0.002 us/B (of its output).
    # The workload's steps (tests/test_workload_cli.py): T 32, 18, 2, 22, 2 with logits rows
    # R 1, 2, 2, 3, 2 (every scheduled request). Tiny model at TP2: 9 all-reduces of
    # T x 64 x 2 B and one all-gather of R x 1024 x 2 B output:
    #   step(T, R) = 9 x (10 + 0.128 T) + 20 + 4.096 R = 110 + 1.152 T + 4.096 R
    #   -> 150.96, 138.928, 120.496, 147.632, 120.496 us; all steps 678.512 us.
    # A: prefill steps 0-1 -> 289.888; decode steps 2-3 -> (120.496 + 147.632)/2 = 134.064.
    # B: prefill step 1 -> 138.928; decode 2-4 -> 388.624/3 = 129.541.
    # C: prefill step 3 -> 147.632; decode step 4 -> 120.496.
    # TTFT sorted 138.928, 147.632, 289.888: p50 147.632; p90 at rank 0.9 x 2 = 1.8:
    #   147.632 + 0.8 x 142.256 = 261.437. TPOT sorted 120.496, 129.541, 134.064: p50 129.541.
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.001),
                                            "allgather": (20.0, 0.002)})
    f = tmp_path / "w.jsonl"
    f.write_text(WORKLOAD)
    proc, _ = infercomm("predict", "--sweep", str(sweep), "--model", tiny_model(tmp_path),
                        "--tp", "2", "--requests", str(f), "--step-time-ms", "10",
                        "--max-batched-tokens", "32", "--max-num-seqs", "4")
    assert proc.returncode == 0, proc.stderr
    w = last_json(proc.stdout)["workload"]
    assert (w["requests"], w["steps"]) == (3, 5)
    assert w["all_steps_us"] == pytest.approx(678.512, abs=1e-3)
    assert w["ttft_comm_us"]["p50"] == pytest.approx(147.632, abs=1e-3)
    assert w["ttft_comm_us"]["p90"] == pytest.approx(261.437, abs=1e-3)
    assert w["tpot_comm_us"]["p50"] == pytest.approx(129.541, abs=1e-3)
    assert "communication under TTFT" in proc.stdout


def test_plan_over_a_workload(tmp_path):
    # The same workload and fits on 2 GPUs: TP2 is priced as above (one lane of every
    # request: analysis/workload_plan.py); DP2 is priced too, and PP2 refused: its hops
    # carry activations and the sweep has neither sendrecv nor stream to price them
    # (tests/test_plan_workload.py prices one). Plan ranks by the p90 over requests:
    # TTFT p90 261.437 us; TPOT sorted 120.496, 129.541, 134.064 -> rank 1.8:
    # 129.5413 + 0.8 x (134.064 - 129.5413) = 133.159 us; end to end all steps 678.512 us.
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.001),
                                            "allgather": (20.0, 0.002)})
    f = tmp_path / "w.jsonl"
    f.write_text(WORKLOAD)
    proc, _ = infercomm("plan", "--sweep", str(sweep), "--model", tiny_model(tmp_path),
                        "--gpus", "2", "--gpus-per-node", "2", "--requests", str(f),
                        "--step-time-ms", "10", "--max-batched-tokens", "32",
                        "--max-num-seqs", "4", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = last_json(proc.stdout)
    best = next(r for r in doc["layouts"] if (r["tp"], r["pp"], r["dp"]) == (2, 1, 1))
    assert best["prefill_us"] == pytest.approx(261.437, abs=1e-3)
    assert best["decode_step_us"] == pytest.approx(133.159, abs=1e-3)
    assert best["e2e_us"] == pytest.approx(678.512, abs=1e-3)
    assert len(doc["layouts"]) == 2
    [refused] = doc["refused"]
    assert refused.startswith("tp=1 pp=2 dp=1: not priced: the sweep has no sendrecv")
