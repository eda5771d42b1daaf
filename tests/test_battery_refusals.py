"""Issue 42's battery, what is not a signal: closed and full streams, long or odd arguments,
full and read-only disks, validate's silent wrong answers and absurd work, a KV sweep taken
for a collective sweep, the scripts' bad input, `--ep` without `--dp`. Each is one line,
exit 2 (or a clean end), no traceback, nothing half made."""

import gzip
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.cli import report as report_cli
from tests.replay_helpers import last_json, needs_mpi, tiny_model
from tests.test_fault_battery import REPLAY, full_disk, read_only  # noqa: F401 (fixtures)
from tests.test_traces_nccl_log import coll_line, init_line, prefix

REPO = Path(__file__).resolve().parents[1]
KV_SWEEP = next((REPO / "results" / "examples" / "plan-sweeps").glob("*-kv-intra-nixl"))


def one_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The refusal's one line, after checking the contract (exit 2, nothing on stdout)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert all(w in line for w in words), line
    return line


def replay_argv(tmp_path: Path, backend: str, *extra: str) -> list[str]:
    return ["replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
            "--decode", "4", "-n", "1", "-w", "0", "--backend", backend, "--device", "cpu",
            "--out", str(tmp_path / "o"), *extra]


def run_with(argv: list[str], **streams: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "microbench", *argv], env=env, timeout=120,
                          check=False, text=True, **streams)  # type: ignore[call-overload]


# --- streams -----------------------------------------------------------------------------

def test_a_full_stdout_is_one_line():
    # `pattern > /dev/full`: OSError's traceback
    with open("/dev/full", "w") as full:
        proc = run_with(["pattern", "--model", "llama-3.1-8b", "--tp", "2", "--prompt", "8",
                         "--decode", "4"], stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == ("infercomm pattern: error: the output cannot be written (No space "
                           "left on device); send stdout to a file with room, or a pipe\n")


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
def test_an_mpi_replay_with_a_closed_stream_runs_and_writes(tmp_path, closed):
    # stdout closed: the launcher's thread died with AttributeError; stderr closed: exit 1
    # (mpiexec itself exits 255 without a descriptor 2), nothing measured
    proc = subprocess.run(
        ["bash", "-c", f'exec {closed}>&-; exec "$0" -m microbench "$@"', sys.executable,
         *replay_argv(tmp_path, "mpi")],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr
    assert len(list((tmp_path / "o").glob("2*/meta.json"))) == 1
    if closed == 2:
        assert last_json(proc.stdout)["backend"] == "mpi"


def test_a_gloo_replay_whose_reader_goes_away_ends_quietly(tmp_path):
    # `replay | head -1`: rank 0's print raised BrokenPipeError, said as its error, exit 1.
    # The reader is gone before rank 0 writes (its table comes at the end, in one piece, so
    # a reader of one line is gone by the next write only by chance; here it always is).
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "microbench",
                                 *replay_argv(tmp_path, "torch")],
                                env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=write,
                                stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + 13, err  # as a writer killed by SIGPIPE (13)
    assert err == "", err


# --- long or odd arguments ---------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--disagg", "prefill=tp" + "1" * 21 + ",decode=tp1"], ["tp of 21 digits"]),
    (["--disagg", "prefill=tp" + "1" * 5000 + ",decode=tp1"], ["tp of 5,000 digits"]),
    (["--disagg", "prefill=tp1,decode=tp1", "--connector-version", "a" * 5000],
     ["--connector-version", "(5,000 characters) is no commit"]),
    (["--model", "m" * 100_000], ["(100,000 characters) is neither a preset name nor"]),
    (["--model", "m" * 300], ["(300 characters) is neither a preset name nor"]),
], ids=["21-digits", "5000-digits", "connector-version", "model-100000", "model-300"])
def test_a_long_argument_is_not_printed_back(argv, words):
    # printed back whole (4 KB, 200 KB), or the file system's or int()'s traceback
    proc = run_with(["pattern", *(["--model", "llama-3.1-8b"] if "--model" not in argv
                                  else []), *argv, "--prompt", "8", "--decode", "4"],
                    capture_output=True)
    line = one_line(proc, *words)
    assert len(line) < 400 and "1" * 21 not in line, line


@pytest.mark.parametrize("label", ["a\nb", "a\x1b[31mb", "../x", "a/b", "a..b"])
def test_a_label_that_would_name_another_folder_is_refused(tmp_path, label):
    # --label went into the run folder's name (slugged: "..-x-31my")
    proc = run_with([*replay_argv(tmp_path, "torch"), "--label", label, "--nproc", "3"],
                    capture_output=True)
    one_line(proc, "argument --label", "a label names the run's folder")


def test_ep_without_dp_names_dp(tmp_path):
    # replayed 0 calls, exit 0, end to end 7.7 us; with --nproc 2 the refusal named tp and pp
    moe = ["--model", "qwen3-30b-a3b", "--ep", "--prompt", "8", "--decode", "2", "-n", "1",
           "-w", "0", "--backend", "torch", "--device", "cpu", "--out", str(tmp_path)]
    for extra in ([], ["--nproc", "2"]):
        one_line(run_with(["replay", *moe, *extra], capture_output=True), "--ep", "add --dp")
    assert not list(tmp_path.glob("2*"))
    line = one_line(run_with(replay_argv(tmp_path, "torch", "--nproc", "3"),
                             capture_output=True))
    assert line.endswith("dp(1) x tp(2) x pp(1) = 2 ranks are needed; give --dp, --tp and "
                         "--pp whose product is 3"), line


# --- disks -------------------------------------------------------------------------------

def test_plot_on_a_full_disk_makes_no_folder(cli, full_disk):  # noqa: F811
    # an empty `plots` folder was left
    status, _, err = cli("plot", str(REPLAY), "-o", str(full_disk / "plots" / "here"))
    assert status == 2 and "No space left on device" in err, err
    assert [p.name for p in full_disk.iterdir()] == ["filler"]


def test_report_to_a_read_only_place_is_refused_before_any_run_is_read(cli, read_only,  # noqa: F811
                                                                       monkeypatch):
    # refused only after the figures were drawn (5 s); no run is read now
    monkeypatch.setattr(report_cli, "_inputs", lambda args: pytest.fail("runs were read"))
    for command in (["report", str(REPLAY), "-o", str(read_only / "r.html")],
                    ["plot", str(REPLAY), "-o", str(read_only / "figures")]):
        status, _, err = cli(*command)
        assert status == 2 and "(Read-only file system); pass a writable place" in err, err


def test_interleave_on_a_full_disk_is_one_line_and_makes_nothing(full_disk):  # noqa: F811
    # three lines and a JSON line for one refusal, and OUT/a made
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "interleave.py"), "-k",
                           "1", "--out", str(full_disk / "ab"), "--a", "infercomm", "--b",
                           "infercomm", "--", "replay", "--model", "llama-3.2-1b"],
                          capture_output=True, text=True, timeout=120, check=False)
    one_line(proc, "--out", "No space left on device")
    assert [p.name for p in full_disk.iterdir()] == ["filler"]


# --- validate and sweeps -----------------------------------------------------------------

def tp2_log(ranks: tuple[int, ...] = (0, 1), steps: int = 5) -> str:
    """NCCL 2.27 COLL lines (tests/test_traces_nccl_log.py) of vLLM V0 serving the tiny model
    at TP2, prompt 4: each step 9 all-reduces of T x 64 bf16 and the logits gather as
    grouped Send/Recv; a start-up all-reduce before."""
    version, lines = "v2.27.7-1", []
    for rank in ranks:
        pre = prefix("gpu-node", 300 + rank, rank, version)
        tp, world = f"0x7{rank}00", f"0x8{rank}00"
        lines += [init_line(version, pre, world, rank, 2, rank),
                  init_line(version, pre, tp, rank, 2, rank),
                  coll_line(version, pre, "AllReduce", 1, 7, 0, world, 2, 0)]
        for step in range(steps):
            tokens = 4 if step == 0 else 1
            lines += [coll_line(version, pre, "AllReduce", tokens * 64, 9, 0, tp, 2, i)
                      for i in range(9)]
            lines.append(coll_line(version, pre, "Recv" if rank == 0 else "Send", 512, 9,
                                   1 - rank, tp, 2, 9))
    return "\n".join(lines) + "\n"


def validate_argv(tmp_path: Path, trace: Path, *extra: str) -> list[str]:
    return ["validate", "--trace", str(trace), "--model", tiny_model(tmp_path), "--tp", "2",
            "--engine", "vllm-v0", "--eager", *extra]


def test_validate_of_one_ranks_file_needs_ranks(cli, tmp_path):
    # one rank's file of a TP2 run exited 0, "match"
    trace = tmp_path / "rank0.log"
    trace.write_text(tp2_log(ranks=(0,)))
    pattern = ["--prompt", "4", "--decode", "5"]
    status, _, err = cli(*validate_argv(tmp_path, trace, *pattern))
    assert status == 2 and err == (
        "infercomm validate: error: the trace holds rank 0 of the layout's 2 ranks; pass "
        "every rank's trace, or --ranks 0 to compare that rank alone\n"), err
    status, out, _ = cli(*validate_argv(tmp_path, trace, *pattern, "--ranks", "0"))
    assert status == 0 and last_json(out)["ranks"] == 1
    status, _, err = cli(*validate_argv(tmp_path, trace, *pattern, "--ranks", "5"))
    assert status == 2 and "--ranks 5 is beyond the layout's 2 ranks" in err, err


def test_validate_reads_a_gzipped_nccl_log(cli, tmp_path):
    # refused as "NUL bytes in the first MiB" while its plain form read
    trace = tmp_path / "tp2.log.gz"
    trace.write_bytes(gzip.compress(tp2_log().encode()))
    status, out, err = cli(*validate_argv(tmp_path, trace, "--prompt", "4", "--decode", "5"))
    assert status == 0, err
    # by hand: 2 ranks x (1 start-up all-reduce + 5 steps x 10 calls) = 102 calls
    assert last_json(out)["match"] is True and last_json(out)["calls"] == 102


def test_validate_refuses_a_workload_far_larger_than_the_trace(tmp_path):
    # 10^6 requests against a 5-step trace: no answer in 7 minutes
    trace = tmp_path / "tp2.log"
    trace.write_text(tp2_log())
    proc = run_with(["validate", "--trace", str(trace), "--model", tiny_model(tmp_path),
                     "--tp", "2", "--eager", "--requests",
                     "poisson:rate=100,count=1000000,prompt=4..8,output=1..4",
                     "--step-time-ms", "30"],
                    capture_output=True)
    # by hand: vLLM V1 holds at most min(8,192 tokens, 1,024 sequences) = 1,024 requests a
    # step; 10^6 / 1,024 = 976.6, so 977 steps, each a call on each rank; the trace holds
    # 1 + 5 x 10 = 51 calls a rank (rules.py V1_MAX_NUM_SEQS, V1_MAX_BATCHED_TOKENS)
    one_line(proc, "--requests holds 1,000,000 requests: at least 977 steps of at most 1,024 "
                   "requests", "the trace holds at most 51 calls a rank")


def test_a_bad_request_is_named_by_its_line(cli, tmp_path):
    # named "request 1 in arrival order", which is not its place in a file not in time order
    path = tmp_path / "w.jsonl"
    path.write_text('{"arrival_s": 2, "prompt": 10, "output": 2}\n'
                    '{"arrival_s": 1, "prompt": 10, "output": 2}\n'
                    '{"arrival_s": 0, "prompt": 131000, "output": 100}\n')
    status, _, err = cli("pattern", "--model", "llama-3.1-8b", "--requests", str(path))
    assert status == 2, err
    assert "the request on line 3 of the --requests file (at 0 s): prompt(131000) + " \
           "output(100)" in err, err


@pytest.mark.parametrize("command", [
    ["predict", "--sweep", str(KV_SWEEP), "--model", "llama-3.1-8b", "--tp", "2",
     "--prompt", "8", "--decode", "4"],
    ["plan", "--sweep", str(KV_SWEEP), "--model", "llama-3.1-8b", "--gpus", "8",
     "--gpus-per-node", "8", "--prompt", "8", "--decode", "4"],
    ["report", str(REPLAY), "--sweep", str(KV_SWEEP), "-o", "{tmp}/r.html"],
], ids=["predict", "plan", "report"])
def test_a_kv_sweep_is_not_taken_for_a_collective_sweep(cli, tmp_path, command):
    # plan priced the dp-only layouts alone from it and named tp1 x dp8 best
    status, out, err = cli(*[a.format(tmp=tmp_path) for a in command])
    assert status == 2 and out == "", out
    assert err.endswith("a sweep of the KV transfer (sweep --op kvtransfer), which prices no "
                        "collective; pass a sweep of the collectives (sweep --op "
                        "allreduce,... or --from-pattern)\n"), err


# --- scripts -----------------------------------------------------------------------------

ORACLE, NIXL = REPO / "scripts" / "vllm_cpu_oracle.py", REPO / "scripts" / "vllm_cpu_nixl.py"
MEGATRON = REPO / "scripts" / "megatron_cpu_oracle.py"


@pytest.mark.parametrize("script, argv, words", [
    (ORACLE, [], ["required: case, --out"]),
    (ORACLE, ["no-such-case", "--out", "x"], ["invalid choice: 'no-such-case'"]),
    (ORACLE, ["dense-tp2", "--out", "/proc/self/x"], ["--out /proc/self/x: cannot write in"]),
    (NIXL, ["model", "out"], ["required: prompt, decode, role, tp"]),
    (NIXL, ["model", "/", "x", "3", "prefill", "1"], ["argument prompt: invalid int value"]),
    (ORACLE, ["dense-tp2", "--out", "{tmp}/o"], ["vllm cannot be imported by"]),
    (MEGATRON, ["--out", "/proc/self/x"], ["--out /proc/self/x: cannot write in"]),
    (MEGATRON, ["--out", "{tmp}/o", "--layouts", "tp9"], ["invalid choice: 'tp9'"]),
], ids=["oracle-missing", "oracle-case", "oracle-out", "nixl-missing", "nixl-type",
        "oracle-no-vllm", "megatron-out", "megatron-layout"])
def test_a_script_meets_bad_input_in_one_line(tmp_path, script, argv, words):
    # argparse's usage then error, or a traceback; vllm missing was found after the model
    # was written, and the half-made --out blocked the rerun
    if "vllm cannot be imported by" in words and importlib.util.find_spec("vllm"):
        pytest.skip("this Python has vllm")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "nothing")}
    proc = subprocess.run([sys.executable, str(script), *[a.format(tmp=tmp_path) for a in argv]],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    one_line(proc, *words)
    assert not (tmp_path / "o").exists()


def test_a_script_that_fails_in_its_work_removes_its_half_made_out(tmp_path):
    # an engine that does not start: its traceback, and OUT (the model written) left behind
    if not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "safetensors")):
        pytest.skip("the oracle writes its model with torch, transformers and safetensors")
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "class SamplingParams:\n    def __init__(self, *a, **k): pass\n"
        "class LLM:\n    def __init__(self, *a, **k):\n"
        "        raise RuntimeError('Engine core initialization failed')\n")
    proc = subprocess.run([sys.executable, str(ORACLE), "dense-tp2", "--out",
                           str(tmp_path / "o")], env={**os.environ,
                                                      "PYTHONPATH": str(fake.parent)},
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (
        "vllm_cpu_oracle: error: RuntimeError: Engine core initialization failed; removed "
        f"the half-made --out {tmp_path / 'o'}"), proc.stderr[-2000:]
    assert not (tmp_path / "o").exists()
