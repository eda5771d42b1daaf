"""`infercomm replay --disagg`: prefill and decode ranks in one job, one request's KV blocks
moved over MPI one-sided (Get for vLLM's READ, Put for SGLang's WRITE), MPI send/recv and
NIXL, with --check counting wrong bytes; refusals before any rank starts."""

import json
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm, last_json, needs_mpi, tiny_model


def nixl_importable() -> bool:
    from microbench.backends.kv_transports import import_nixl
    try:
        import_nixl()
    except Exception:
        return False
    return True


needs_nixl = pytest.mark.skipif(not nixl_importable(),
                                reason="NIXL is not installed (pip install 'infercomm[nixl]')")


def replay(tmp_path, *argv, env=None):
    model = tiny_model(tmp_path)
    proc, _ = infercomm("replay", "--model", model, "--prompt", "20", "--decode", "4", "-n", "3",
                        "-w", "1", "--check", "--out", str(tmp_path / "runs"), *argv, env=env)
    return proc


# tiny: 4 layers, 4 KV heads of 16 (hidden 64 / 4 heads), bf16: K and V of a head, a token,
# a layer = 2 x 16 x 2 = 64 bytes; 4 layers x 4 heads x 64 = 1,024 bytes a token.
# vLLM: 20 tokens fill ceil(20/16) = 2 blocks = 32 slots: 32,768 bytes moved in all.
# SGLang: pages of 1 token: 20 x 1,024 = 20,480 bytes.

@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("argv, moved", [
    (["--disagg", "prefill=tp1,decode=tp2", "--kv-transport", "rma"], 32_768),
    (["--disagg", "prefill=tp2,decode=tp1", "--engine", "sglang", "--kv-transport", "rma"],
     20_480),
    (["--disagg", "prefill=tp2,decode=tp1", "--kv-transport", "p2p"], 32_768),
    # vLLM's push connector: the prefill rank WRITEs each decode rank its 2 heads.
    (["--disagg", "prefill=tp1,decode=tp2", "--connector", "nixl-push", "--kv-transport",
      "rma"], 32_768),
])
def test_mpi_replay_moves_every_byte(tmp_path, argv, moved):
    proc = replay(tmp_path, "--backend", "mpi", *argv)
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert (last["kv_transfer_bytes"], last["wrong"]) == (moved, 0)
    run = Path(last["results_dir"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 3 and summary["kv_transfer_us"] > 0
    meta = json.loads((run / "meta.json").read_text())
    assert meta["pattern"]["kv_transfer_bytes"] == moved and "mpi_library" in meta["versions"]
    # one row per timed iteration, and every rank's times beside it
    assert len((run / "iterations.csv").read_text().splitlines()) == 1 + 3
    assert len((run / "ranks.csv").read_text().splitlines()) == 1 + 3 * 3


@needs_mpi
@pytest.mark.mpi
def test_check_counts_a_corrupted_byte(tmp_path):
    proc = replay(tmp_path, "--backend", "mpi", "--disagg", "prefill=tp1,decode=tp2",
                  "--kv-transport", "rma", env={"INFERCOMM_FAULT": "corrupt:0:kv"})
    assert proc.returncode == 1
    assert last_json(proc.stdout)["wrong"] == 1  # the one byte prefill rank 0 changed
    # issue 34, fault 13: it read "rank 1 (pid P on HOST) ended with exit status 1".
    assert "--check found wrong data (rank 1: 1 wrong element)" in proc.stderr, proc.stderr
    assert "exit status" not in proc.stderr
    # ... and `plot` of the run exited 0 with no file and no word.
    run = last_json(proc.stdout)["results_dir"]
    plot, _ = infercomm("plot", run, "-o", str(tmp_path / "figures"))
    assert plot.returncode == 2 and "no figure to draw from these runs (kvtransfer)" in \
        plot.stderr and not (tmp_path / "figures").exists(), plot.stderr


@needs_nixl
def test_nixl_replay_over_ucx(tmp_path):
    # The connectors' own library: agents, registered DRAM, prepared descriptor lists, READ
    # (vLLM) and WRITE (SGLang) with notifications; control over gloo.
    for engine, moved in (("vllm", 32_768), ("sglang", 20_480)):
        proc = replay(tmp_path, "--backend", "torch", "--disagg", "prefill=tp1,decode=tp1",
                      "--engine", engine, "--kv-transport", "nixl")
        assert proc.returncode == 0, proc.stderr
        last = last_json(proc.stdout)
        assert (last["kv_transport"], last["kv_transfer_bytes"], last["wrong"]) == \
            ("nixl", moved, 0)
        # NIXL's Python logger writes to stdout and its C++ log refuses "WARNING": neither
        # its INFO lines nor a complaint about NIXL_LOG_LEVEL reach the output
        assert "NIXL" not in proc.stdout and "Invalid NIXL_LOG_LEVEL" not in proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["--disagg", "prefill=tp1,decode=tp2", "--kv-transport", "rma"], "add --backend mpi"),
    (["--disagg", "prefill=tp1,decode=tp2", "--backend", "mpi", "--nproc", "2"],
     "use --nproc 3"),
    (["--disagg", "prefill=tp1dp2,decode=tp2", "--backend", "mpi"], "drop dpN"),
    (["--disagg", "prefill=tp1,decode=tp2", "--backend", "mpi", "--tp", "2"], "drop --tp"),
])
def test_bad_input_one_line(tmp_path, argv, words):
    proc = replay(tmp_path, *argv)
    assert proc.returncode == 2 and proc.stdout == ""
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["rma", pytest.param("nixl", marks=needs_nixl)])
def test_kvtransfer_sweep(tmp_path, transport):
    # Two sizes, 8 descriptors each: a row a size, count = descriptors, checked byte by byte.
    proc, _ = infercomm("sweep", "--op", "kvtransfer", "--backend", "mpi", "--kv-transport",
                        transport, "--sizes", "1K,16K", "--kv-descriptors", "8", "-n", "5",
                        "-w", "1", "-c", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert (last["cases"], last["wrong"], last["transport"]) == (2, 0, transport)
    rows = (Path(last["results_dir"]) / "sweep.csv").read_text().splitlines()
    assert rows[1].startswith("kvtransfer,1024,8,uint8,2,")
    assert rows[2].startswith("kvtransfer,16384,8,uint8,2,")


def test_torch_send_recv_packs_each_pair(tmp_path):
    # gloo: each prefill rank packs its pair's descriptors, one isend; the decode rank
    # unpacks them into place (two prefill ranks fill one decode rank's heads).
    proc = replay(tmp_path, "--backend", "torch", "--disagg", "prefill=tp2,decode=tp1",
                  "--kv-transport", "torch")
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert (last["kv_transport"], last["kv_transfer_bytes"], last["wrong"]) == \
        ("torch", 32_768, 0)


def test_torch_moves_sglang_sliding_window_runs(tmp_path):
    # gpt-oss-20b (tests/data/configs: 24 layers, 12 sliding of window 128, 8 KV heads of
    # 64, bf16: 1,024 bytes a token a layer for K, the same for V) on SGLang, prompt 200:
    # the 12 full layers move 200 tokens, the 12 sliding ones tokens [200 - 127, 200) in
    # runs of their own (descriptors of two sizes, gathered slice by slice):
    # 12 x 2 x 200 x 1,024 + 12 x 2 x 127 x 1,024 = 4,915,200 + 3,121,152 = 8,036,352.
    proc, _ = infercomm("replay", "--model", "tests/data/configs/gpt-oss-20b", "--engine",
                        "sglang", "--disagg", "prefill=tp1,decode=tp1", "--prompt", "200",
                        "--decode", "4", "-n", "2", "-w", "1", "--check", "--backend", "torch",
                        "--kv-transport", "torch", "--out", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert (last["kv_transfer_bytes"], last["wrong"]) == (8_036_352, 0)


@needs_mpi
@pytest.mark.mpi
def test_compare_and_report_of_two_kv_transports(tmp_path):
    # A disaggregated replay's results are read like a replay's: compare -A/-B of MPI
    # one-sided against send/recv names the KV transport that differs; report shows both
    # transfers; runs of different requests are refused in one line.
    from tests.replay_helpers import infercomm as run

    base = ["--disagg", "prefill=tp1,decode=tp2", "--backend", "mpi"]
    runs = []
    for transport in ("rma", "p2p"):
        proc = replay(tmp_path, *base, "--kv-transport", transport, "-n", "5")
        assert proc.returncode == 0, proc.stderr
        runs.append(last_json(proc.stdout)["results_dir"])
    proc, _ = run("compare", runs[0], runs[1], "--inconclusive-ok")
    assert proc.returncode in (0, 1), proc.stderr
    doc = last_json(proc.stdout)
    assert doc["kind"] == "kvtransfer"
    assert [m["metric"] for m in doc["metrics"]] == ["kv_transfer_us"]
    assert {"what": "KV transport", "a": "rma", "b": "p2p"} in doc["differences"]["B"]
    proc, _ = run("report", *runs, "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "r.html").read_text()
    assert "KV transfer of one request" in page and "32.00 KiB" in page  # 32,768 B above
    assert "<title>" in page and "2 runs: rma, MPICH" in page
    other = tmp_path / "other"
    other.mkdir()
    proc, _ = infercomm("replay", "--model", tiny_model(other), "--prompt", "40", "--decode",
                        "4", "-n", "5", "-w", "1", "--out", str(other / "runs"), *base,
                        "--kv-transport", "rma")
    assert proc.returncode == 0, proc.stderr
    proc, _ = run("compare", runs[0], last_json(proc.stdout)["results_dir"])
    assert proc.returncode == 2 and "prompt differs: 20 in A, 40 in B" in proc.stderr


@needs_mpi
@pytest.mark.mpi
def test_with_collectives_times_each_side_beside_the_transfer(tmp_path):
    # prefill tp2 and decode tp2 in one job of 4 ranks. vLLM at tp 2 on the tiny model
    # (4 layers): a step is 1 embedding + 4 x 2 layer all-reduces + 1 logits all-gather = 10
    # calls, on each side (the prefill side's prefill step, the decode side's first decode
    # step); TTFT's communication is the prefill collectives plus the transfer, iteration by
    # iteration.
    proc = replay(tmp_path, "--backend", "mpi", "--disagg", "prefill=tp2,decode=tp2",
                  "--kv-transport", "rma", "--with-collectives")
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert last["wrong"] == 0 and last["prefill_comm_us"] > 0
    summary = json.loads((Path(last["results_dir"]) / "summary.json").read_text())
    assert (summary["prefill_calls"], summary["decode_calls"]) == (10, 10)
    assert summary["decode_step_us"] > 0
    rows = (Path(last["results_dir"]) / "iterations.csv").read_text().splitlines()
    assert rows[0] == "iteration,kv_transfer_us,prefill_comm_us,ttft_comm_us,decode_step_us"
    for row in rows[1:]:
        _, kv, prefill, ttft, _ = map(float, row.split(","))
        assert ttft == pytest.approx(kv + prefill, abs=0.002)
    assert "communication under TTFT (the two)" in proc.stdout
    # the results read back like any run's (compare/report/load)
    from tests.replay_helpers import infercomm as run
    done, _ = run("report", last["results_dir"], "-o", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
