"""`plan --disagg`: disaggregated candidates priced beside the colocated layouts, from flat
fits checked by hand (the prefill side's collectives, the KV transfer, the decode steps)."""

import json
from pathlib import Path

from microbench.results.store import csv_text
from microbench.sweep.output import COLUMNS
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
    # 2 pairs (prefill 0 -> decode rank 2, 1 -> 3), each 4 layers x 1 region (K and V packed)
    # x 1 block (8 tokens in a block of 16) = 4 descriptors, across nodes (ranks 0, 1 | 2, 3):
    # 4/10 of the inter-node transfer of 10 descriptors, 1000 us: 400 us; each rank is in
    # one pair.
    assert (row["prefill_us"], row["decode_step_us"], row["kv_transfer_us"]) == (120, 120, 400)
    # TTFT's communication 120 + 400; end to end adds 3 decode steps: 520 + 360 = 880.
    assert (row["ttft_comm_us"], row["e2e_us"]) == (520, 880)
    # 2 pairs x 4 descriptors x 16 tokens x 2 heads x (K 16 + V 16) x 2 bytes = 16,384 bytes.
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


def test_a_layout_larger_than_the_gpus_is_told_to_shrink(cli, tmp_path):
    # prefill tp2 dp2 (4 ranks) + decode tp2 (2) = 6 ranks on --gpus 4: 2 too many. Adding
    # dpN (what plan said before) would only make it larger.
    status, out, err = plan(cli, tmp_path, "--disagg", "prefill=tp2dp2,decode=tp2",
                            "--kv-sweep", str(kv_sweep(tmp_path / "kv", 100.0, 10)))
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert ("--disagg prefill=tp2dp2,decode=tp2 has 6 ranks and --gpus is 4: 2 too many; "
            "lower a side's dp or tp, or give --gpus 6") in err
    assert "add dpN" not in err


def test_auto_prices_each_pair_of_sides_once_however_many_gpus():
    import argparse

    from microbench.analysis.kv_plan import candidates
    auto = argparse.Namespace(disagg="auto")
    # 64 GPUs, 8 a node, 16 heads: by enumeration, every prefill world P in 8, 16, ..., 56
    # and every tp a | P, b | 64 - P among the divisors of 16 (1, 2, 4, 8, 16).
    triples = [(p, a, b) for p in range(8, 64, 8) for a in (1, 2, 4, 8, 16)
               for b in (1, 2, 4, 8, 16) if p % a == 0 and (64 - p) % b == 0]
    got = candidates(auto, 64, 8, 16)
    # Each (a, b) once, standing for every split it fits, at the split nearest 32.
    assert sorted((c.prefill.tp, c.decode.tp) for c, _ in got) == sorted(
        {(a, b) for _, a, b in triples})
    assert sum(n for _, n in got) == len(triples)
    by_tp = {(c.prefill.tp, c.decode.tp): c for c, _ in got}
    # a = 16 needs P in 16, 32, 48 and b = 16 needs 64 - P in 16, 32, 48: P = 32 is even.
    assert by_tp[(16, 16)].prefill.world_size == 32
    # 4096 and 1,048,576 GPUs of 128 heads (8 divisors): at most 8 x 8 = 64 candidates
    # (enumerating splits gave 511 x up to 64 for 4096, and never ended for 2^20).
    for gpus in (4096, 1 << 20):
        got = candidates(auto, gpus, 8, 128)
        assert len(got) <= 64
        assert all(c.world_size == gpus and c.decode_offset % 8 == 0 for c, _ in got)


def test_auto_on_a_million_gpus_answers(tmp_path):
    # The whole command, tiny model (4 heads: 3 tp a side) at 2^20 GPUs, 8 a node: a generous
    # bound; before, every split of the GPUs was generated and priced (no answer in minutes).
    from tests.replay_helpers import infercomm, last_json
    proc, seconds = infercomm(
        "plan", "--model", tiny_model(tmp_path), "--gpus", str(1 << 20), "--gpus-per-node",
        "8", "--prompt", "8", "--decode", "4", "--engine", "vllm",
        "--sweep", str(fake_sweep(tmp_path / "sweep", FLAT)),
        "--sweep-inter", str(fake_sweep(tmp_path / "inter", FLAT)), "--disagg", "auto",
        "--kv-sweep", str(kv_sweep(tmp_path / "kv", 100.0, 10)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert seconds < 60 and last_json(proc.stdout)["gpus"] == 1 << 20


def test_decode_tp_above_kv_heads_priced(cli, tmp_path):
    # Tiny with 2 KV heads: prefill TP2 (1 head a rank, node 0) -> decode TP4 (heads
    # replicated on 2 ranks each, nodes 1 and 2), accepted since vLLM #45879. Decode rank d
    # reads its head from prefill rank d // 2: 4 pairs of 4 layers x 1 block = 4 descriptors
    # (16 tokens x 1 head x (16 + 16) x 2 bytes = 1,024 bytes each), all across nodes: 4/10
    # x 1000 us = 400 us a pair; prefill rank 0 serves 2 pairs: 800 us, the slowest rank.
    config = json.loads(Path(tiny_model(tmp_path)).read_text())
    gqa = tmp_path / "gqa.json"
    gqa.write_text(json.dumps({**config, "num_key_value_heads": 2}))
    sweeps = ["--sweep", str(fake_sweep(tmp_path / "sweep", FLAT)),
              "--sweep-inter", str(fake_sweep(tmp_path / "inter", FLAT)),
              "--kv-sweep", str(kv_sweep(tmp_path / "kv", 100.0, 10)),
              "--kv-sweep-inter", str(kv_sweep(tmp_path / "kvx", 1000.0, 10))]
    base = ["plan", "--model", str(gqa), "--gpus", "6", "--gpus-per-node", "2", "--prompt", "8",
            "--decode", "4", "--engine", "vllm", "--format", "json", *sweeps]
    status, out, err = cli(*base, "--disagg", "auto")
    assert status == 0, err
    rows = {r["disagg"]: r for r in json.loads(out)["disagg_layouts"]}
    row = rows["prefill=tp2,decode=tp4"]
    assert (row["kv_transfer_us"], row["kv_transfer_bytes"]) == (800, 4 * 4 * 1_024)
    # The connector before #45879 refuses that layout (said under disagg_refused).
    status, out, err = cli(*base, "--disagg", "prefill=tp2,decode=tp4", "--connector-version",
                           "cda19ecf")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["disagg_layouts"] == [] and "before #45879" in doc["disagg_refused"][0]


def test_best_overall_compares_communication_with_the_least_of_the_colocated():
    from types import SimpleNamespace

    from microbench.analysis.kv_plan import best_overall

    def colocated(tp, pp, e2e, fits=True):
        return SimpleNamespace(shape=SimpleNamespace(tp=tp, pp=pp, dp=1, ep=False),
                               e2e_us=e2e, meets_budget=True, fits_memory=fits)

    # Ranked by floor (communication + compute) the TP4 layout comes first, but its
    # communication (7,000 us) is more than TP1 PP2's (7 us) and the disaggregated 6,000 us;
    # a layout that does not fit (1 us) is never it.
    disagg = SimpleNamespace(meets_budget=True, e2e_us=6_000.0,
                             disagg=SimpleNamespace(text=lambda: "prefill=tp2,decode=tp2"))
    ranked = [colocated(4, 1, 7_000.0), colocated(1, 2, 7.0), colocated(1, 1, 1.0, fits=False)]
    assert best_overall(ranked, [disagg]) == "colocated tp=1 pp=2 dp=1"
    assert best_overall(ranked[:1], [disagg]) == "disaggregated prefill=tp2,decode=tp2"
