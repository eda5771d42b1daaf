"""Real multi-process replays on CPU, over gloo and over MPI (mpich wheel).

The tiny model (h=64, 4 layers, vocab 1000 -> 1024 padded, bf16) keeps messages small; the
expected counts below are worked out from the vllm-v0 rules:
  per step, TP2:      1 + 2*4 = 9 allreduces, 1 gather                 -> 10 calls
  per step, PP2:      stage 0: 2 sends; stage 1: 2 recvs                -> 2 calls
  per step, TP2xPP2:  stage 0: 1 + 2*2 = 5 allreduces + 2 sends         -> 7 calls
                      stage 1: 2 recvs + 2 allgathers + 4 allreduces + 1 gather -> 9 calls
With prompt 8 and decode 4 an inference is 1 prefill + 3 decode steps = 4 steps.
"""

import json
from collections import Counter

import pytest

from tests.replay_helpers import infercomm, last_json, needs_mpi, read_csv, tiny_model

STEPS = 4
EXPECTED_CALLS = {  # (tp, pp) -> {rank: Counter of op kinds per inference}
    (2, 1): {r: Counter(allreduce=9 * STEPS, gather=STEPS) for r in (0, 1)},
    (1, 2): {0: Counter(send=2 * STEPS), 1: Counter(recv=2 * STEPS)},
    (2, 2): {**{r: Counter(allreduce=5 * STEPS, send=2 * STEPS) for r in (0, 1)},
             **{r: Counter(recv=2 * STEPS, allgather=2 * STEPS, allreduce=4 * STEPS,
                           gather=STEPS) for r in (2, 3)}},
}
BACKENDS = ["torch", pytest.param("mpi", marks=needs_mpi)]


def replay_args(model: str, tp: int, pp: int, backend: str, out: str, *extra: str) -> list[str]:
    # vllm-v0: the counts above are V0's (a logits gather, no per-step broadcasts).
    return ["replay", "--model", model, "--engine", "vllm-v0", "--tp", str(tp), "--pp", str(pp),
            "--prompt", "8",
            "--decode", "4", "--backend", backend, "-n", "2", "-w", "1", "--out", out,
            "--timeout", "60", *extra]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2), (2, 2)])
def test_calls_issued_equal_the_pattern_and_check_passes(tmp_path, backend, tp, pp):
    model = tiny_model(tmp_path)
    proc, _ = infercomm(*replay_args(model, tp, pp, backend, str(tmp_path / "res"),
                                     "--timing", "op", "--check"))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert (line["world_size"], line["tp"], line["pp"], line["wrong"]) == (tp * pp, tp, pp, 0)
    expected = EXPECTED_CALLS[(tp, pp)]
    assert line["calls_per_inference"] == max(sum(c.values()) for c in expected.values())
    ops = read_csv(tmp_path / "res" / line["results_dir"].split("/")[-1] / "ops.csv")
    for iteration in ("0", "1"):
        for rank, kinds in expected.items():
            issued = Counter(r["op"] for r in ops
                             if r["iteration"] == iteration and r["rank"] == str(rank))
            assert issued == kinds, (rank, issued)


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_detects_a_corrupted_buffer(tmp_path, backend):
    model = tiny_model(tmp_path)
    proc, _ = infercomm(*replay_args(model, 2, 2, backend, str(tmp_path), "--check"),
                        env={"INFERCOMM_FAULT": "corrupt:1"})
    # Rank 1 (stage 0) adds 1 to element 0 of each input it fills. Per step its 5
    # allreduces each leave element 0 wrong on both TP ranks (10) and its 2 sends each
    # arrive wrong on rank 3 (2): 12 wrong elements a step, 48 over 4 steps.
    assert proc.returncode == 1, proc.stderr
    line = last_json(proc.stdout)
    assert line["wrong"] == 48
    assert "CHECK FAILED" in proc.stdout


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_failing_rank_ends_every_rank_within_the_timeout(tmp_path, backend, fault):
    model = tiny_model(tmp_path)
    args = replay_args(model, 2, 1, backend, str(tmp_path), "--timeout", "5")
    args[args.index("--decode") + 1] = "100000"  # far longer than the test would wait
    proc, seconds = infercomm(*args, env={"INFERCOMM_FAULT": f"{fault}:1:30"}, timeout=90)
    assert proc.returncode != 0
    assert seconds < 40, seconds  # start-up (~5 s) + timeout 5 s + poll + grace
    assert "error" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("2*")), "a failed run must leave no result folder"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rank_stuck_holding_the_gil_is_ended_by_its_sentinel(tmp_path, backend):
    # Rank 1 blocks in C with the GIL held before opening its backend, so its watchdog thread
    # cannot run; over MPI, rank 0 then waits in MPI_Init, also with the GIL held.
    model = tiny_model(tmp_path)
    args = replay_args(model, 2, 1, backend, str(tmp_path), "--timeout", "5")
    proc, seconds = infercomm(*args, env={"INFERCOMM_FAULT": "stall:1"}, timeout=90)
    assert proc.returncode != 0
    assert seconds < 40, seconds  # start-up + timeout 5 s + poll + grace
    # Over gloo only rank 1 is stuck. Over MPI rank 0 is stuck too (in MPI_Init, GIL held),
    # so whichever sentinel's 5 s run out first names its own rank: either is right.
    stuck = ["1"] if backend == "torch" else ["0", "1"]
    assert any(f"infercomm replay: error: rank {rank}: no progress for 5 s during start-up "
               "(the interpreter is stuck in a library call); a rank failed or hung, ending "
               "the run" in proc.stderr for rank in stuck), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("2*")), "a failed run must leave no result folder"


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_world_size_is_refused_on_every_rank(tmp_path, backend):
    import sys
    from pathlib import Path
    model = tiny_model(tmp_path)
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    if not Path(mpiexec).exists():
        pytest.skip("no mpiexec beside python")
    import subprocess
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, "-m", "microbench",
                           *replay_args(model, 2, 1, backend, str(tmp_path))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 3  # one line from each of the 3 ranks
    assert all(ln == "infercomm replay: error: world size 3 does not match the layout: "
                      "dp(1) x tp(2) x pp(1) = 2 ranks are needed; give --dp, --tp and --pp "
                      "whose product is 3" for ln in lines)
    assert not list(tmp_path.glob("2*"))


def test_nproc_mismatch_refused_before_starting(tmp_path):
    model = tiny_model(tmp_path)
    proc, _ = infercomm(*replay_args(model, 2, 2, "torch", str(tmp_path / "res"),
                                     "--nproc", "3"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("infercomm replay: error: world size 3 does not match the "
                                   "layout: dp(1) x tp(2) x pp(2) = 4 ranks are needed; give "
                                   "--dp, --tp and --pp whose product is 3")
    assert not (tmp_path / "res").exists()


def test_results_folder_is_complete_and_never_overwritten(tmp_path):
    model = tiny_model(tmp_path)
    out = tmp_path / "res"
    args = replay_args(model, 2, 1, "torch", str(out), "--label", "same")
    first, _ = infercomm(*args)
    second, _ = infercomm(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    dirs = sorted(p.name for p in out.iterdir())
    assert len(dirs) == 2 and all(d.endswith(("-same", "-same-2")) for d in dirs)
    run = out / dirs[0]
    assert sorted(p.name for p in run.iterdir()) == ["iterations.csv", "meta.json",
                                                     "summary.json"]
    meta = json.loads((run / "meta.json").read_text())
    assert meta["argv"][:3] == ["replay", "--model", model]
    assert meta["world_size"] == 2 and meta["transport"] == "gloo"
    assert meta["versions"]["torch"].startswith("2.")
    assert meta["pattern"]["volume_bytes"]["total"] > 0 and len(meta["hosts"]) == 2
    assert "OMP_NUM_THREADS" in meta["environment"]
    rows = read_csv(run / "iterations.csv")
    assert [r["iteration"] for r in rows] == ["0", "1"]
    for r in rows:  # end to end = prefill + decode on the slowest rank, within rounding
        assert float(r["e2e_us"]) >= max(float(r["prefill_us"]), float(r["decode_us"]))
    line = last_json(first.stdout)
    assert set(line) >= {"backend", "device", "world_size", "model", "tp", "pp", "iterations",
                         "prefill_us", "decode_step_us", "e2e_us", "calls_per_inference",
                         "wrong", "results_dir"}
    assert line["wrong"] is None and line["iterations"] == 2


def test_bad_input_leaves_no_results(tmp_path):
    model = tiny_model(tmp_path)
    proc, _ = infercomm(*replay_args(model, 3, 1, "torch", str(tmp_path / "res")))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("infercomm replay: error: tp(3) does not divide")
    assert not (tmp_path / "res").exists()
