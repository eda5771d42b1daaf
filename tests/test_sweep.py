"""`infercomm sweep`: nccl-tests' bandwidth arithmetic, and real 2-rank sweeps on CPU over gloo
and MPI (mpich) with -c, from sizes and from a pattern."""

import json
from pathlib import Path

import pytest

from microbench.sweep.busbw import SweepOp, algbw_gbps, busbw_gbps, message, pattern_message
from microbench.sweep.cases import geometric_sizes, pattern_cases
from microbench.sweep.output import COLUMNS, SAMPLE_COLUMNS
from patterns import Layout, Op, OpKind, Workload, from_hf_config, generate
from tests.replay_helpers import infercomm, last_json, needs_mpi, read_csv, tiny_model

ALL_OPS = "allreduce,allgather,reducescatter,gather,broadcast,sendrecv,alltoall"


def test_bandwidths_follow_nccl_tests():
    # 1,000,000 bytes in 100 us: 1e6 B / 1e-4 s = 1e10 B/s = 10 GB/s of algbw for every op.
    assert algbw_gbps(1_000_000, 100.0) == pytest.approx(10.0)
    expected = {  # busbw = algbw x factor (nccl-tests src/<op>.cu, GetBw)
        (SweepOp.ALLREDUCE, 4): 10.0 * 2 * 3 / 4,  # 2(n-1)/n = 1.5 -> 15 GB/s
        (SweepOp.ALLREDUCE, 2): 10.0 * 2 * 1 / 2,  # 1.0 -> 10 GB/s
        (SweepOp.ALLGATHER, 8): 10.0 * 7 / 8,  # (n-1)/n -> 8.75 GB/s
        (SweepOp.REDUCESCATTER, 8): 10.0 * 7 / 8,  # 8.75 GB/s
        (SweepOp.ALLTOALL, 2): 10.0 * 1 / 2,  # 5 GB/s
        (SweepOp.GATHER, 4): 10.0 * 3 / 4,  # 7.5 GB/s
        (SweepOp.BROADCAST, 8): 10.0,  # factor 1
        (SweepOp.SENDRECV, 2): 10.0,  # factor 1
    }
    for (op, n), busbw in expected.items():
        assert busbw_gbps(op, 1_000_000, 100.0, n) == pytest.approx(busbw), (op, n)


def test_sizes_and_counts_follow_nccl_tests():
    # -b 8 -e 1K -f 4: 8, 32, 128, 512 (2048 > 1024 stops it).
    assert geometric_sizes(8, 1024, 4) == [8, 32, 128, 512]
    # allgather: size is the gathered output, count one rank's: 1 MiB / (4 ranks x 2 B) = 131072.
    assert message(SweepOp.ALLGATHER, 1 << 20, 4, "bf16") == (131072, 1 << 20)
    # reducescatter of 100 B fp32 over 3 ranks: 100 // 12 = 8 per rank, 8 x 3 x 4 = 96 B.
    assert message(SweepOp.REDUCESCATTER, 100, 3, "fp32") == (8, 96)
    # allreduce of 7 B bf16: 3 whole elements, 6 B.
    assert message(SweepOp.ALLREDUCE, 7, 4, "bf16") == (3, 6)
    # A pattern allgather of 1024 bf16 elements into [1, 2048]: size 4096 B, count 1024.
    op = Op(OpKind.ALLGATHER, "tp", 2, (1024,), (1, 2048), "bf16", "pp.hidden")
    assert pattern_message(op) == (SweepOp.ALLGATHER, 4096, 1024, 2)
    # A send of 2048 bf16 over a pipeline of 4: a 2-rank sendrecv of 4096 B.
    send = Op(OpKind.SEND, "pp", 4, (2048,), (2048,), "bf16", "pp.hidden", peer=1)
    assert pattern_message(send) == (SweepOp.SENDRECV, 4096, 2048, 2)


def test_pattern_messages_and_their_calls_per_inference(tmp_path):
    # Tiny model (h=64, 4 layers, vocab 1024 padded, bf16), tp2 pp2, prompt 8, decode 4
    # (1 prefill step T=8, 3 decode steps T=1); per step stage 0 issues 5 allreduces and 2
    # sends, stage 1 2 recvs, 2 allgathers, 4 allreduces and 1 gather (test_replay.py).
    model = from_hf_config(tiny_model(tmp_path))
    pattern = generate("vllm-v0", model, Layout(tp=2, pp=2), Workload(prompt=8, decode=4))
    got = [(c.op.value, c.size_bytes, c.count, c.group_size, c.calls_per_inference)
           for c in pattern_cases(pattern)]
    assert got == [
        ("allreduce", 1 * 64 * 2, 64, 2, 3 * 5),  # decode [1,64]; stage 0: 5 per step x 3
        ("allreduce", 8 * 64 * 2, 512, 2, 5),  # prefill [8,64]; stage 0's 5
        ("allgather", 64 * 2, 32, 2, 3 * 2),  # decode: 32 in, [1,64] out = 128 B
        ("allgather", 8 * 64 * 2, 256, 2, 2),  # prefill: 256 in, [8,64] out = 1024 B
        ("gather", 1024 * 2, 512, 2, 4),  # [1,512] per rank into [1,1024]; every step
        ("sendrecv", 32 * 2, 32, 2, 3 * 2),  # decode slices of 64/2 = 32 elements
        ("sendrecv", 256 * 2, 256, 2, 2),  # prefill slices of 8 x 64/2 = 256 elements
        # each transfer also as a one-way stream (its gap; predict.py's docstring)
        ("stream", 32 * 2, 32, 2, 3 * 2),
        ("stream", 256 * 2, 256, 2, 2),
    ]


def _sweep_args(out: Path, backend: str, *extra: str) -> list[str]:
    return ["sweep", "--backend", backend, "--device", "cpu", "-n", "3", "-w", "1",
            "--out", str(out), "--timeout", "60", *extra]


def _check_run(proc, out: Path, ops: list[str], sizes: list[int]) -> dict:
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert line["kind"] == "sweep" and line["world_size"] == 2 and line["wrong"] == 0
    run = Path(line["results_dir"])
    assert run.parent == out
    assert sorted(p.name for p in run.iterdir()) == ["meta.json", "samples.csv", "summary.json",
                                                     "sweep.csv"]
    rows = read_csv(run / "sweep.csv")
    assert list(rows[0]) == COLUMNS
    assert [(r["op"], int(r["size_bytes"])) for r in rows] == [(o, s) for o in ops
                                                               for s in sizes]
    for r in rows:
        assert r["wrong"] == "0" and r["group_size"] == "2" and r["dtype"] == "bf16"
        assert float(r["time_p5_us"]) <= float(r["time_us"]) <= float(r["time_p95_us"])
        n = 2
        chunked = r["op"] in ("allgather", "reducescatter", "gather", "alltoall")
        assert int(r["count"]) == int(r["size_bytes"]) // (2 * (n if chunked else 1))
        assert float(r["busbw_gbps"]) == pytest.approx(
            busbw_gbps(SweepOp(r["op"]), int(r["size_bytes"]), float(r["time_us"]), n),
            rel=1e-3, abs=2e-6)
    samples = read_csv(run / "samples.csv")
    assert list(samples[0]) == SAMPLE_COLUMNS
    assert len(samples) == 3 * len(rows)  # -n 3 rank-max samples per case
    meta = json.loads((run / "meta.json").read_text())
    assert meta["kind"] == "sweep" and meta["ops"] == ops and meta["sizes"] == sizes
    assert meta["argv"][0] == "sweep" and len(meta["hosts"]) == 2 and meta["check"] is True
    return line


def test_sweep_over_gloo_with_check(tmp_path):
    out = tmp_path / "res"
    proc, _ = infercomm(*_sweep_args(out, "torch", "--op", ALL_OPS, "-b", "8", "-e", "64K",
                                     "-f", "64", "-c"))
    line = _check_run(proc, out, ALL_OPS.split(","), [8, 512, 32768])
    assert line["transport"] == "gloo"
    assert "# allreduce over 2 ranks" in proc.stdout and "busbw(GB/s)" in proc.stdout


@needs_mpi
def test_sweep_over_mpi_with_check(tmp_path):
    out = tmp_path / "res"
    proc, _ = infercomm(*_sweep_args(out, "mpi", "--op", ALL_OPS, "--sizes", "8,4K", "-c"))
    line = _check_run(proc, out, ALL_OPS.split(","), [8, 4096])
    assert line["transport"] == "mpi-host"


@needs_mpi
def test_check_counts_wrong_elements(tmp_path):
    proc, _ = infercomm(*_sweep_args(tmp_path, "mpi", "--op", "allreduce,sendrecv", "--sizes",
                                     "64", "-c"), env={"INFERCOMM_FAULT": "corrupt:1"})
    # Rank 1 adds 1 to element 0 of each input it fills: the allreduce's sum is then wrong
    # at element 0 on both ranks (2); rank 1 sends to rank 0 (ring 1 -> 0), whose received
    # element 0 is wrong (1). Any wrong element makes the exit status 1.
    assert proc.returncode == 1, proc.stderr
    line = last_json(proc.stdout)
    assert line["cases"] == 2 and "rows" not in line  # the rows are in the run's files
    rows = json.loads((Path(line["results_dir"]) / "summary.json").read_text())["rows"]
    assert [(r["op"], r["wrong"]) for r in rows] == [("allreduce", 2), ("sendrecv", 1)]


@needs_mpi
def test_sweep_from_pattern(tmp_path):
    model = tiny_model(tmp_path)
    proc, _ = infercomm(*_sweep_args(tmp_path / "res", "mpi", "--from-pattern", "--model",
                                     model, "--engine", "vllm-v0", "--tp", "2", "--pp", "2",
                                     "--prompt", "8",
                                     "--decode", "4", "-c"))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    # The pattern's groups have 2 ranks, so 2 ranks are started (not tp x pp = 4).
    assert line["world_size"] == 2 and line["wrong"] == 0
    got = [(r["op"], r["size_bytes"], r["calls_per_inference"]) for r in
           json.loads((Path(line["results_dir"]) / "summary.json").read_text())["rows"]]
    assert got == [("allreduce", 128, 15), ("allreduce", 1024, 5), ("allgather", 128, 6),
                   ("allgather", 1024, 2), ("gather", 2048, 4), ("sendrecv", 64, 6),
                   ("sendrecv", 512, 2), ("stream", 64, 6),
                   ("stream", 512, 2)]  # as in test_pattern_messages_... above
    run = Path(line["results_dir"])
    assert list(read_csv(run / "sweep.csv")[0])[-1] == "calls_per_inference"
    meta = json.loads((run / "meta.json").read_text())
    assert meta["source"] == "pattern" and meta["pattern"]["layout"]["tp"] == 2


@pytest.mark.parametrize("argv, message", [
    (["-b", "1K", "-e", "8"], "-b 1024 is larger than -e 8"),
    (["-f", "1"], "-f 1 must be at least 2"),
    (["--sizes", "8K", "-b", "8"], "give sizes by -b/-e/-f or by --sizes, not both"),
    (["--from-pattern", "--model", "llama-3.1-8b"], "--from-pattern needs --prompt, --decode"),
    (["--model", "llama-3.1-8b"], "add --from-pattern"),
    (["--op", "sendrecv", "--nproc", "1"], "sendrecv needs at least 2 ranks"),
    (["--sizes", "1", "--dtype", "fp32"], "every size is smaller than one element"),
    (["--dtype", "int7"], "dtype 'int7' is not a model dtype"),
])
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, argv, message):
    out = tmp_path / "res"
    status, stdout, stderr = cli("sweep", "--out", str(out), *argv)
    assert status == 2 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1 and message in stderr, stderr
    assert not out.exists()


def test_unknown_op_is_refused_by_the_parser(cli):
    status, _, stderr = cli("sweep", "--op", "allreduce,reduce")
    assert status == 2 and "unknown op 'reduce'" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_levels_by_ranks_per_node(tmp_path):
    # One rank per node: every pair of the 2-rank world spans two nodes, so every row is
    # inter; the stream's data is checked (-c) like every other op's.
    proc, _ = infercomm(*_sweep_args(tmp_path / "res", "mpi", "--op", "allreduce,stream",
                                     "--sizes", "64,1K", "--ranks-per-node", "1", "-c"))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert line["wrong"] == 0
    rows = read_csv(Path(line["results_dir"]) / "sweep.csv")
    assert [(r["op"], r["size_bytes"], r["level"]) for r in rows] == [
        ("allreduce", "64", "inter"), ("allreduce", "1024", "inter"),
        ("stream", "64", "inter"), ("stream", "1024", "inter")]
    meta = json.loads((Path(line["results_dir"]) / "meta.json").read_text())
    assert meta["ranks_per_node"] == 1 and meta["nodes"] == 2


def test_case_level_by_placement():
    from microbench.sweep.busbw import SweepOp
    from microbench.sweep.cases import Case
    from microbench.sweep.output import case_level, node_ids

    nodes = node_ids(["a"] * 4, 2)  # 4 ranks, 2 per node: [0, 0, 1, 1]
    assert nodes == [0, 0, 1, 1]
    assert node_ids(["h1", "h1", "h2"], None) == [0, 0, 1]  # by host when not given

    def level(op: SweepOp, n: int) -> str:
        return case_level(Case(op, 64, 32, "bf16", n), nodes)

    assert level(SweepOp.ALLREDUCE, 2) == "intra"  # ranks 0, 1: node 0
    assert level(SweepOp.ALLREDUCE, 4) == "inter"  # ranks 0-3 span both
    assert level(SweepOp.SENDRECV, 4) == "inter"  # the ring's 1 -> 2 crosses
    assert level(SweepOp.STREAM, 4) == "intra"  # pairs (0, 1) and (2, 3) stay on a node
    # With a stride of a node (--ranks-per-node 2), the pairs are (0, 2) and (1, 3): both
    # cross; ranks 0 and 1 send, 2 and 3 receive.
    strided = Case(SweepOp.STREAM, 64, 32, "bf16", 4, stride=2)
    assert [strided.stream_peer(g) for g in range(4)] == [(True, 2), (True, 3), (False, 0),
                                                          (False, 1)]
    assert case_level(strided, nodes) == "inter"
    assert Case(SweepOp.STREAM, 64, 32, "bf16", 3).stream_peer(2) is None  # odd: idles


def test_run_time_sums_runs_of_back_to_back_calls():
    import numpy as np

    from microbench.sweep.cases import rank_max, run_time
    # Two ranks taking turns being late: rank 0's calls take 7, 9, 7, 9 ... us, rank 1's
    # 9, 7, 9, 7 ... Every iteration's slowest rank took 9 us, but a run of 10 calls takes
    # each rank 5 x 7 + 5 x 9 = 80 us: 8 us a call.
    turns = [np.array([7.0, 9.0] * 10), np.array([9.0, 7.0] * 10)]
    assert float(np.median(rank_max(turns))) == 9.0
    assert run_time(turns) == pytest.approx(8.0)
    # One call in five woken late (11 us instead of 1): the median call is 1 us, a run of
    # 10 holds two late calls, 8 x 1 + 2 x 11 = 30 us, 3 us a call. A rank outside the
    # group (None) is ignored; 25 iterations make two runs, the last 5 are left over.
    late = np.array([1.0, 1.0, 11.0, 1.0, 1.0] * 5)
    assert float(np.median(late)) == 1.0
    assert run_time([late, None]) == pytest.approx(3.0)
    # Fewer iterations than a run: the median iteration's slowest rank.
    assert run_time([np.array([4.0, 6.0, 5.0])], calls=10) == 5.0


def test_run_time_is_the_mean_run_without_the_slowest_tenth():
    import numpy as np

    from microbench.sweep.cases import run_time
    # Runs in two clusters, as an MPI 16 KiB stream's were (module doc of run_time): 10 runs
    # of 10 calls, five of 29 us and four of 38 us, and one of 200 us (a rank descheduled).
    # The median run would be 29 or 38 as one run moved; the mean of the 9 fastest (the
    # slowest tenth, 1 run of 10, left out) is (5 x 29 + 4 x 38) / 9 = 297 / 9 = 33 us a run,
    # 3.3 us a call.
    runs = [29.0, 38.0] * 4 + [29.0, 200.0]
    calls = np.repeat(np.array(runs) / 10, 10)
    assert run_time([calls]) == pytest.approx(3.3)
    # 25 runs: 22 of 4 us, one of 6, two of 90. Two (a tenth of 25, rounded down) left out:
    # (22 x 4 + 6) / 23 = 94 / 23 us a run (one left out: 184 / 24; three: 4).
    calls = np.array([0.4] * 220 + [0.6] * 10 + [9.0] * 20)
    assert run_time([calls]) == pytest.approx(94 / 23 / 10)
