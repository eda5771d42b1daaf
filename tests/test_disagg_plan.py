"""`plan --disagg`: disaggregated candidates priced beside the colocated layouts, from flat
fits checked by hand (the prefill side's collectives, the KV transfer, the decode steps)."""

import json
from pathlib import Path

from microbench.cli.sweep import COLUMNS
from microbench.results.store import csv_text
from tests.replay_helpers import tiny_model
from tests.test_predict import fake_sweep

FLAT = {"allreduce": (10.0, 0.0), "allgather": (30.0, 0.0), "gather": (20.0, 0.0),
        "sendrecv": (4.0, 0.0), "stream": (1.0, 0.0)}


def kv_sweep(folder: Path, alpha: float, descriptors: int) -> Path:
    """A kvtransfer sweep whose transfers of K descriptors take alpha us at every size."""
    fake_sweep(folder, {"kvtransfer": (alpha, 0.0)})
    rows = [{"op": "kvtransfer", "size_bytes": s, "count": descriptors, "dtype": "uint8",
             "group_size": 2, "time_us": alpha, "time_p5_us": alpha, "time_p95_us": alpha,
             "algbw_gbps": 0, "busbw_gbps": 0, "wrong": 0} for s in (256, 4096, 65536)]
    (folder / "sweep.csv").write_text(csv_text(rows, COLUMNS))  # count: K descriptors
    return folder


def plan(cli, tmp_path, *extra):
    return cli("plan", "--model", tiny_model(tmp_path), "--gpus", "4", "--gpus-per-node", "2",
               "--prompt", "8", "--decode", "4", "--engine", "vllm",
               "--sweep", str(fake_sweep(tmp_path / "sweep", FLAT)),
               "--sweep-inter", str(fake_sweep(tmp_path / "inter", FLAT)), *extra)


def test_disagg_candidate_priced_by_hand(cli, tmp_path):
    status, out, err = plan(cli, tmp_path, "--disagg", "prefill=tp2,decode=tp2", "--format",
                            "json", "--kv-sweep", str(kv_sweep(tmp_path / "kv", 100.0, 10)),
                            "--kv-sweep-inter", str(kv_sweep(tmp_path / "kvx", 1000.0, 10)))
    assert status == 0, err
    doc = json.loads(out)
    [row] = doc["disagg_layouts"]
    # Prefill side TP2 (ranks 0, 1: one node), vLLM V1 on tiny: 9 all-reduces (1 + 2 a layer
    # of 4) at 10 us and the logits all-gather at 30: 120 us; the decode step the same calls:
    # 120 us. KV: tiny has 4 KV heads of 16 (hidden 64 / 4 heads), 4 layers; TP2 -> TP2 is
    # 2 pairs (prefill 0 -> decode rank 2, 1 -> 3), each 4 layers x 2 (K, V) x 1 block
    # (8 tokens in a block of 16) = 8 descriptors, across nodes (ranks 0, 1 | 2, 3): 8/10 of
    # the inter-node transfer of 10 descriptors, 1000 us: 800 us; each rank is in one pair.
    assert (row["prefill_us"], row["decode_step_us"], row["kv_transfer_us"]) == (120, 120, 800)
    # TTFT's communication 120 + 800; end to end adds 3 decode steps: 920 + 360 = 1,280.
    assert (row["ttft_comm_us"], row["e2e_us"]) == (920, 1280)
    # 2 pairs x 8 descriptors x 16 tokens x 2 heads x 16 x 2 bytes = 16,384 bytes.
    assert row["kv_transfer_bytes"] == 16_384 and row["crosses_nodes"] and row["best"]
    assert doc["best_overall"].startswith(("colocated", "disaggregated"))
    assert doc["layouts"]  # the colocated layouts are still there


def test_auto_and_refusals(cli, tmp_path):
    status, out, err = plan(cli, tmp_path, "--disagg", "auto", "--kv-sweep",
                            str(kv_sweep(tmp_path / "kv", 100.0, 10)))
    assert status == 0, err
    # Sides at node boundaries (2 + 2 GPUs), tp 1 or 2 each: 4 candidates, crossing pairs
    # priced by the inter-node stream fit without --kv-sweep-inter (said in a note).
    assert "disaggregated candidates" in out and out.count(" tp1") + out.count(" tp2") >= 8
    assert "inter-node stream fit" in out
    for i, (extra, words) in enumerate((
            (["--disagg", "prefill=tp2,decode=tp1", "--kv-sweep",
              str(kv_sweep(tmp_path / "kv2", 100.0, 10))], "add dpN"),
            (["--disagg", "prefill=tp2,decode=tp2"], "sweep --op kvtransfer"))):
        (tmp_path / f"again{i}").mkdir()
        status, out, err = plan(cli, tmp_path / f"again{i}", *extra)
        assert status == 2 and out == "" and words in err and len(err.splitlines()) == 1
