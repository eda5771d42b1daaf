"""`infercomm predict`: alpha-beta fits recovered from synthetic sweeps (one line and a bent
one), and a pattern's predicted time checked by hand."""

import json
from pathlib import Path

import pytest

from microbench.analysis.fits import fit_points
from microbench.results.store import csv_text
from microbench.sweep.output import COLUMNS, SAMPLE_COLUMNS
from tests.conftest import last_json
from tests.replay_helpers import tiny_model

SIZES = [8 * 4**k for k in range(11)]  # 8 B, 32 B, ... 8 MiB


def fake_sweep(folder: Path, lines: dict[str, tuple[float, float]],
               dtypes: dict[str, str] | None = None) -> Path:
    """A sweep run folder whose median times are exactly alpha + beta x size (2 ranks), each
    op swept in bf16 unless `dtypes` names another."""
    folder.mkdir(parents=True)
    rows, samples = [], []
    for op, (alpha, beta) in lines.items():
        for size in SIZES:
            t = alpha + beta * size
            dtype = (dtypes or {}).get(op, "bf16")
            rows.append({"op": op, "size_bytes": size, "count": size // 2, "dtype": dtype,
                         "group_size": 2, "time_us": t, "time_p5_us": t, "time_p95_us": t,
                         "algbw_gbps": 0, "busbw_gbps": 0, "wrong": ""})
            samples += [{"op": op, "size_bytes": size, "dtype": dtype, "group_size": 2,
                         "iteration": i, "time_us": t} for i in range(3)]
    (folder / "meta.json").write_text(json.dumps({"kind": "sweep", "argv": ["sweep"],
                                                  "backend": "fake", "world_size": 2}))
    (folder / "sweep.csv").write_text(csv_text(rows, COLUMNS))
    (folder / "samples.csv").write_text(csv_text(samples, SAMPLE_COLUMNS))
    return folder


def test_one_line_is_recovered_and_not_split():
    # alpha 5 us, beta 0.001 us/B (1 GB/s): the relative least squares fit is exact.
    fit = fit_points("allreduce", 2, SIZES, [5 + 0.001 * s for s in SIZES])
    assert len(fit.pieces) == 1
    assert fit.pieces[0].alpha_us == pytest.approx(5.0)
    assert fit.pieces[0].beta_us_per_byte == pytest.approx(0.001)
    assert fit.rms_rel_error == pytest.approx(0.0, abs=1e-9)


def test_fits_read_the_run_time_where_the_sweep_has_one():
    from microbench.analysis.fits import fit_sweep
    # The same sizes with median 10 + 0.001 x size but run time twice that: the fit is the
    # run time's line (alpha 20, beta 0.002); a row without a run time (an older sweep)
    # falls back to its median.
    rows = [{"op": "allreduce", "group_size": 2, "size_bytes": s, "time_us": 10 + 0.001 * s,
             "time_run_us": 20 + 0.002 * s} for s in SIZES]
    fit = fit_sweep(rows)[("allreduce", 2)]
    assert fit.pieces[0].alpha_us == pytest.approx(20.0)
    assert fit.pieces[0].beta_us_per_byte == pytest.approx(0.002)
    old = [dict(r, time_run_us=float("nan")) for r in rows]
    assert fit_sweep(old)[("allreduce", 2)].time_us(1000) == pytest.approx(11.0)


def test_a_protocol_switch_is_found():
    # Eager below 128 KiB (10 us + 0.002 us/B), rendezvous from 128 KiB (100 us + 0.0005
    # us/B): 7 sizes below (8 B .. 32 KiB) and 4 from 128 KiB, each piece >= 3 points.
    times = [10 + 0.002 * s if s < 131072 else 100 + 0.0005 * s for s in SIZES]
    fit = fit_points("allreduce", 2, SIZES, times)
    assert [p.from_bytes for p in fit.pieces] == [8, 131072]
    assert fit.pieces[0].alpha_us == pytest.approx(10.0)
    assert fit.pieces[0].beta_us_per_byte == pytest.approx(0.002)
    assert fit.pieces[1].alpha_us == pytest.approx(100.0)
    assert fit.pieces[1].beta_us_per_byte == pytest.approx(0.0005)
    # 32 KiB uses the lower piece: 10 + 0.002 x 32768 = 75.536 us; 8 MiB the upper one:
    # 100 + 0.0005 x 8388608 = 4294.304 us.
    assert fit.time_us(32768) == pytest.approx(75.536)
    assert fit.time_us(8 << 20) == pytest.approx(4294.304)


def test_a_regime_of_the_last_two_sizes_gets_its_piece():
    # MPICH's all-reduce over 2 ranks in a sweep of 4 KiB .. 1 MiB (x2), as measured here:
    # 0.2 ns/B below 512 KiB (the 256 KiB point: 1 + 0.0002 x 262144 = 53.4 us), then
    # 305 us at 512 KiB and 598 us at 1 MiB. One line over both regimes put 512 KiB near
    # 127 us (a 512 KiB replay then read 2.4x its prediction); the upper piece is the line
    # through its two points: beta (598 - 305) / 524288, alpha 305 - 524288 beta = 12 us.
    sizes = [4096 << i for i in range(9)]
    times = [1 + 0.0002 * s for s in sizes[:7]] + [305.0, 598.0]
    fit = fit_points("allreduce", 2, sizes, times)
    assert [p.from_bytes for p in fit.pieces] == [4096, 524288]
    assert fit.pieces[1].beta_us_per_byte == pytest.approx(293 / 524288)
    assert fit.pieces[1].alpha_us == pytest.approx(12.0)
    assert fit.time_us(524288) == pytest.approx(305.0)
    assert fit.time_us(262144) == pytest.approx(53.4288)


def test_predicted_tp2_pattern_by_hand(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.01), "gather": (20.0, 0.001),
                                            "sendrecv": (4.0, 0.002)})
    model = tiny_model(tmp_path)
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm-v0",
                           "--model", model, "--tp", "2",
                           "--prompt", "8", "--decode", "4")
    assert status == 0, err
    p = last_json(out)["predicted"]
    # Tiny model tp2 (test_replay.py): per step 9 allreduces and 1 gather.
    # prefill: allreduce [8,64] bf16 = 1024 B: 10 + 0.01 x 1024 = 20.24 us, x 9 = 182.16;
    #   gather [1,512] into [1,1024] bf16 = 2048 B (nccl-tests size): 20 + 2.048 = 22.048.
    assert p["prefill_us"] == pytest.approx(182.16 + 22.048)  # 204.208
    # decode step: allreduce [1,64] = 128 B: 10 + 1.28 = 11.28 x 9 = 101.52; + 22.048.
    assert p["decode_step_us"] == pytest.approx(101.52 + 22.048)  # 123.568
    # end to end: prefill + 3 decode steps = 204.208 + 370.704.
    assert p["e2e_us"] == pytest.approx(574.912)
    assert p["allreduce_us"] == pytest.approx(182.16 + 3 * 101.52)  # 486.72
    assert p["gather_us"] == pytest.approx(4 * 22.048)  # 88.192


def test_predicted_pp2_pattern_by_hand(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"sendrecv": (4.0, 0.002)})
    model = tiny_model(tmp_path)
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm-v0",
                           "--model", model, "--pp", "2",
                           "--prompt", "8", "--decode", "4")
    assert status == 0, err
    p = last_json(out)["predicted"]
    # pp2: stage 0 sends 2 tensors of T x 64 bf16 per step, stage 1 receives them. A send is
    # half a sendrecv iteration: prefill 1024 B -> (4 + 2.048) / 2 = 3.024 us, x 2 = 6.048;
    # decode 128 B -> (4 + 0.256) / 2 = 2.128, x 2 = 4.256 a step.
    assert p["prefill_us"] == pytest.approx(6.048)
    assert p["decode_step_us"] == pytest.approx(4.256)
    assert p["e2e_us"] == pytest.approx(6.048 + 3 * 4.256)  # 18.816
    assert p["send_us"] == pytest.approx(18.816) and p["recv_us"] == pytest.approx(18.816)


def test_missing_collective_is_one_line(cli, tmp_path):
    # TP2's all-reduces carry the activations, and nothing stands in for an all-reduce
    # (analysis/fits.py SUBSTITUTES); a sweep of sendrecv alone cannot price them.
    sweep = fake_sweep(tmp_path / "sweep", {"sendrecv": (10.0, 0.01)})
    model = tiny_model(tmp_path)
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm-v0",
                           "--model", model, "--tp", "2",
                           "--prompt", "8", "--decode", "4")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert ("the sweep has no allreduce over 2 ranks (it has sendrecv n=2), and nothing that "
            "stands in for it") in err
    status, _, err = cli("predict", "--sweep", str(sweep))
    assert status == 2 and "give the pattern options" in err


@pytest.mark.parametrize("dtypes, warned", [
    ({"allreduce": "fp32"}, True),   # the tiny model's all-reduces are bf16
    ({"gather": "fp32"}, False),     # a gather moves bytes whatever their type
    ({}, False),
])
def test_a_reduction_priced_from_another_dtype_is_said(cli, tmp_path, dtypes, warned):
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.01), "gather": (20.0, 0.001)},
                       dtypes)
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm-v0",
                           "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
                           "--decode", "4")
    assert status == 0, err
    said = [w for w in last_json(out)["warnings"] if "dtype" in w]
    assert said == ([
        "the pattern's allreduce calls are bf16 and the sweep measured allreduce in fp32 "
        "only: a reduction's time depends on its dtype, so these calls are priced from "
        "another dtype's times (sweep with --dtype bf16)"] if warned else [])
    assert ("infercomm predict: warning: the pattern's allreduce calls are bf16" in err) == warned


def test_against_a_committed_replay(cli):
    samples = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
    replay = next(samples.glob("*-replay-llama-3.2-1b-tp2-mpi"))
    sweep = next(samples.glob("*-sweep-mpi-mpi-host-w2"))
    status, out, err = cli("predict", "--sweep", str(sweep), "--against", str(replay))
    assert status == 0, err
    line = last_json(out)
    assert line["model"] == "llama-3.2-1b" and line["tp"] == 2
    assert set(line["measured"]) == set(line["predicted"])
    assert "measured/predicted" in out


TINY8 = {"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 1000,
         "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 256,
         "torch_dtype": "bfloat16", "_name_or_path": "tiny8"}


def _flat(table: dict[tuple[str, int], float]) -> dict:
    """Fits whose every size takes the same time (alpha = the time, beta 0), by hand."""
    return {key: fit_points(key[0], key[1], SIZES, [t] * len(SIZES))
            for key, t in table.items()}


def _two_levels(tmp_path, tp: int, pp: int, ranks_per_node: int):
    from microbench.analysis.fits import Topology
    from microbench.analysis.predict import predict_pattern
    from patterns import Layout, Workload, from_hf_config, generate

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY8))
    pattern = generate("vllm-v0", from_hf_config(str(path)), Layout(tp=tp, pp=pp),
                       Workload(prompt=8, decode=4))
    intra = _flat({("allreduce", 4): 10, ("allreduce", 8): 10, ("gather", 4): 20,
                   ("gather", 8): 20, ("allgather", 4): 30, ("sendrecv", 2): 4})
    inter = _flat({("allreduce", 8): 100, ("gather", 8): 200, ("sendrecv", 2): 40})
    topology = Topology(intra, inter, ranks_per_node)
    predicted, _ = predict_pattern(pattern, topology)
    return predicted, topology.used


def test_tp8_over_two_nodes_uses_the_inter_node_fits(tmp_path):
    # TP8, 4 ranks a node: the TP group (ranks 0-7) spans both nodes. A step is 9 allreduces
    # and 1 gather (tiny model, 4 layers): 9 x 100 + 200 = 1100 us inter-node.
    p, used = _two_levels(tmp_path, 8, 1, 4)
    assert used == {"inter"}
    assert p["prefill_us"] == pytest.approx(1100)
    assert p["decode_step_us"] == pytest.approx(1100)
    assert p["e2e_us"] == pytest.approx(4 * 1100)  # prefill + 3 decode steps
    # On one node of 8: 9 x 10 + 20 = 110 us.
    p, used = _two_levels(tmp_path, 8, 1, 8)
    assert used == {"intra"} and p["decode_step_us"] == pytest.approx(110)


def test_tp4pp2_over_two_nodes_uses_the_inter_fit_only_for_its_sends(tmp_path):
    # TP4 x PP2, 4 ranks a node: stage 0 = ranks 0-3 (node 0), stage 1 = ranks 4-7 (node 1).
    # TP groups stay on a node (intra); each send crosses: latency = gap = 40 / 2 = 20 us
    # (the inter sweep has no stream). Per step stage 0: 5 allreduces (10) then 2 sends;
    # stage 1: recv, allgather (30), recv, allgather, 4 allreduces, gather (20).
    # Prefill: stage 0 sends at 50 and 70 (arrive 70, 90), ends at 90. Stage 1: recv
    # max(0 + 20, 70) = 70, allgather 100, recv max(120, 90) = 120, allgather 150,
    # allreduces 190, gather 210.
    # Decode step 1: stage 0 from 90: allreduces 140, sends arrive 160 and 180. Stage 1 from
    # 210: recv max(230, 160) = 230, 260, recv max(280, 180) = 280, 310, 350, 370: 160 a
    # step, stage 1's own calls (stage 0 needs 90), so 3 steps end at 210 + 480 = 690.
    p, used = _two_levels(tmp_path, 4, 2, 4)
    assert used == {"intra", "inter"}
    assert p["prefill_us"] == pytest.approx(210)
    assert p["decode_step_us"] == pytest.approx(160)
    assert p["e2e_us"] == pytest.approx(690)
    # allreduce stays intra: stage 0's 5 x 10 x 4 steps = 200 (inter would be 8-rank only).
    assert p["allreduce_us"] == pytest.approx(200)
    assert p["send_us"] == pytest.approx(2 * 20 * 4)  # 160: inter gap of 20 per send


@pytest.mark.parametrize("decode, e2e", [(4, 27.0), (100, 15 + 99 * 4.0)])
def test_pp4_costs_the_chain_along_the_pipeline(tmp_path, decode, e2e):
    from microbench.analysis.fits import Topology
    from microbench.analysis.predict import predict_pattern
    from patterns import Layout, Workload, from_hf_config, generate

    pattern = generate("vllm-v0", from_hf_config(tiny_model(tmp_path)), Layout(pp=4),
                       Workload(prompt=8, decode=decode))
    # Latency 8 / 2 = 4 us, gap 1 us. Per step stage 0 sends 2, stages 1-2 recv 2 then send
    # 2, stage 3 recvs 2. Prefill: stage 0 sends at 0, 1 (arrive 4, 5); stage 1 recvs at 4,
    # 5, sends at 5, 6 (arrive 9, 10); stage 2 recvs 9, 10, sends (arrive 14, 15); stage 3
    # ends at 15: the chain, where each stage's own calls add up to at most 4 x 4 = 16.
    # Decode: stages 1 and 2 each need 4 gaps a step, so after the first step (stage 3 from
    # 15 to 19) every step adds 4: 3 steps end at 27; 99 steps (extrapolated from the
    # steady state) at 15 + 396 = 411.
    topology = Topology(_flat({("sendrecv", 2): 8, ("stream", 2): 1}))
    p, _ = predict_pattern(pattern, topology)
    assert p["prefill_us"] == pytest.approx(15)
    assert p["decode_step_us"] == pytest.approx(4)
    assert p["e2e_us"] == pytest.approx(e2e)


def test_a_hop_arrives_no_sooner_than_its_stream_time(tmp_path):
    from microbench.analysis.fits import Topology
    from microbench.analysis.predict import predict_pattern
    from patterns import Layout, Workload, from_hf_config, generate

    pattern = generate("vllm-v0", from_hf_config(tiny_model(tmp_path)), Layout(pp=4),
                       Workload(prompt=8, decode=4))
    # A ping-pong of 2 us (half: 1) but a stream of 3 us a message: the link takes 3 us to
    # carry one, so each arrives 3 us after its send begins (not 1). Stage 0 sends at 0, 3
    # (arrive 3, 6); stage 1 recvs at 3, 6, sends at 6, 9 (arrive 9, 12); stage 2 recvs 9,
    # 12, sends at 12, 15 (arrive 15, 18); stage 3 ends at 18. Half the ping-pong would
    # have put it at 14 (arrivals 1 after each send: 11, 14).
    topology = Topology(_flat({("sendrecv", 2): 2, ("stream", 2): 3}))
    p, _ = predict_pattern(pattern, topology)
    assert p["prefill_us"] == pytest.approx(18)


def test_a_large_hop_is_priced_by_the_stream_not_half_the_ping_pong(tmp_path):
    from microbench.analysis.fits import Topology
    from microbench.analysis.predict import predict_pattern
    from patterns import Layout, Workload, from_hf_config, generate

    pattern = generate("vllm-v0", from_hf_config(tiny_model(tmp_path)), Layout(pp=2),
                       Workload(prompt=8, decode=4))
    # Ping-pong 2 + 0.01 us/B, stream 3 us a message (flat). The prefill's two sends are
    # 8 x 64 bf16 = 1024 B: half the ping-pong there is (2 + 10.24) / 2 = 6.12 us, above
    # the stream, but the floor is half the ping-pong at the sweep's smallest size, 8 B:
    # (2 + 0.08) / 2 = 1.04. So latency = gap = 3: stage 0 sends at 0 and 3, the data
    # arrives at 3 and 6, and stage 1's prefill ends at 6 (with half the ping-pong at
    # 1024 B as the latency: 6.12 and 9.12).
    # Decode sends are 128 B: half the ping-pong (2 + 1.28) / 2 = 1.64, still below the
    # stream's 3: each step is stage 1's two receives, 3 apart, 6 a step.
    fits = _flat({("stream", 2): 3})
    fits[("sendrecv", 2)] = fit_points("sendrecv", 2, SIZES, [2 + 0.01 * s for s in SIZES])
    p, _ = predict_pattern(pattern, Topology(fits))
    assert p["prefill_us"] == pytest.approx(6)
    assert p["decode_step_us"] == pytest.approx(6)
    assert p["e2e_us"] == pytest.approx(6 + 3 * 6)  # 24


def test_a_hop_is_priced_at_the_stream_the_sweep_measured_not_its_line(tmp_path):
    from microbench.analysis.fits import Topology
    from microbench.analysis.predict import predict_pattern
    from patterns import Layout, Workload, from_hf_config, generate

    pattern = generate("vllm-v0", from_hf_config(tiny_model(tmp_path)), Layout(pp=2),
                       Workload(prompt=8, decode=4))
    # A stream that leaves a cache between 512 B and 2 KiB: 1 + s/512 us up to 512 B
    # (128 B: 1.25, 512 B: 2), then 20 + 0.01 (s - 2048) (2 KiB: 20). The prefill's sends
    # are 8 x 64 bf16 = 1024 B, between two measured sizes: 2 + (20 - 2) x (1024 - 512) /
    # (2048 - 512) = 8 us, a send every 8 us, the second's data there at 16. A decode step's
    # two sends are 1 x 64 bf16 = 128 B, a measured size: 1.25 each, 2.5 a step. The
    # ping-pong's floor,
    # (2 + 0.08) / 2 = 1.04, is below both. A line through these points prices 1024 B
    # otherwise (the fit's pieces cannot bend twice).
    stream = [1 + s / 512 if s <= 512 else 20 + 0.01 * (s - 2048) for s in SIZES]
    fits = {("stream", 2): fit_points("stream", 2, SIZES, stream),
            ("sendrecv", 2): fit_points("sendrecv", 2, SIZES, [2 + 0.01 * s for s in SIZES])}
    assert fits[("stream", 2)].time_us(1024) != pytest.approx(8, rel=0.01)
    p, _ = predict_pattern(pattern, Topology(fits))
    assert p["prefill_us"] == pytest.approx(16)
    assert p["decode_step_us"] == pytest.approx(2.5)
    assert p["e2e_us"] == pytest.approx(16 + 3 * 2.5)  # 23.5


def test_measured_times_are_the_points_between_them_a_line_and_the_fit_beyond():
    import numpy as np

    fit = fit_points("stream", 2, [1024, 4096, 2048], [10.0, 70.0, 30.0])
    # 3 KiB: 30 + (70 - 30) / 2 = 50; the swept sizes their own times; beyond 4 KiB the fit.
    sizes = [1024, 2048, 3072, 4096, 8192, 512]
    expected = [10.0, 30.0, 50.0, 70.0, fit.time_us(8192), fit.time_us(512)]
    assert [fit.measured_us(s) for s in sizes] == pytest.approx(expected)
    assert list(fit.measured_times_us(np.array(sizes, dtype=float))) == [
        fit.measured_us(s) for s in sizes]  # the vector path gives the same floats


def test_an_outlier_is_left_out_and_named():
    # 5 us + 0.001 us/B, but the 2 KiB median is 8000 us (a descheduled rank). Its
    # neighbours allow at most 5.512 x 4 = 22.0 us (512 B's time, growing with size) and
    # 13.192 us (8 KiB's, flat): 8000 / 22.0 = 363x, over 5x on both sides; left out, and
    # the line is exact again.
    times = [5 + 0.001 * s for s in SIZES]
    times[4] = 8000.0  # SIZES[4] = 8 x 4^4 = 2048 B
    fit = fit_points("allreduce", 2, SIZES, times)
    assert fit.dropped == (2048,)
    assert fit.pieces[0].alpha_us == pytest.approx(5.0)
    assert fit.pieces[0].beta_us_per_byte == pytest.approx(0.001)
    assert fit.points == len(SIZES) - 1 and fit.max_bytes == SIZES[-1]


def test_a_sweep_of_another_backend_is_said_loudly(cli):
    samples = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
    replay = next(samples.glob("*-replay-llama-3.2-1b-tp2-mpi"))
    sweep = next(samples.glob("*-sweep-torch-gloo-w2"))
    status, out, err = cli("predict", "--sweep", str(sweep), "--against", str(replay))
    assert status == 0, err
    warning = ("the sweep ran with backend torch and the replay with mpi: the prediction "
               "prices another setup than the one measured")
    assert warning in err and f"WARNING: {warning}" in out
    assert warning in last_json(out)["warnings"]
