"""The battery run on the features landed for issue 34's round (connectors, scheduling
modes, MoE backends, workload readers, settings grids, plan's memory and objective): every
case here passed silently, printed a traceback or several lines, or ran a job before this
file's fixes. Bad input is one line on stderr naming what is wrong, exit status 2, nothing
on stdout, nothing started."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "results" / "examples" / "plan-sweeps"
INTRA = next(SWEEPS.glob("*-intra-shm"))
KV_INTRA = next(SWEEPS.glob("*-kv-intra-nixl"))
TRACE = ROOT / "tests" / "fixtures" / "traces" / "nccl_interleaved_tp2.log"
PLAN = ("plan", "--model", "llama-3.1-8b", "--gpus", "8", "--gpus-per-node", "8",
        "--sweep", str(INTRA), "--prompt", "128", "--decode", "4")
PATTERN = ("pattern", "--model", "llama-3.1-8b", "--prompt", "128", "--decode", "4")
REPLAY = ("replay", "--model", "llama-3.2-1b", "--prompt", "16", "--decode", "2", "-n", "1",
          "-w", "0", "--tp", "2", "--nproc", "2")
DISAGG = ("--disagg", "prefill=tp2,decode=tp2")

# (argv, a piece of the one line that must say what is wrong)
REFUSED = [
    # plan: --gpu-memory 1e300 was an OverflowError traceback (GiB x 2^30 is inf)
    ((*PLAN, "--gpu-memory", "1e300"),
     "--gpu-memory 1e+300 must be a positive, finite number of GiB, at most 1,048,576"),
    # plan: 1e400 reads as inf, which passed "> 0" and was a budget nothing fails
    ((*PLAN, "--budget-tpot-ms", "1e400"),
     "--budget-tpot-ms inf must be a positive number of milliseconds, a finite one"),
    ((*PLAN, "--budget-ttft-ms", "inf"),
     "--budget-ttft-ms inf must be a positive number of milliseconds, a finite one"),
    # plan: options that act only with another were ignored without it
    ((*PLAN, "--dp-routing", "least-loaded"), "--dp-routing acts only with --requests"),
    ((*PLAN, "--kv-sweep", str(KV_INTRA)), "--kv-sweep acts only with --disagg"),
    ((*PLAN, "--kv-sweep-inter", str(KV_INTRA)), "--kv-sweep-inter acts only with --disagg"),
    # plan: an option the engine or model refuses, whatever the layout, was said as "no
    # layout of 8 ranks suits llama-3.1-8b: tp must divide ..." with the reason in brackets
    ((*PLAN, "--engine", "trtllm", "--no-async-scheduling"),
     "error: --async-scheduling / --no-async-scheduling does not apply to engine trtllm"),
    ((*PLAN, "--moe-backend", "triton"), "error: moe-backend picks the kernel of mxfp4"),
    ((*PLAN, "--engine", "sglang", "--model-runner", "v2"),
     "error: --model-runner does not apply to engine sglang"),
    # plan --disagg auto with another engine's connector version left every candidate out
    # ("left out: ... is not modelled for sglang" on each line) and exited 0
    ((*PLAN, "--disagg", "auto", "--kv-sweep", str(KV_INTRA), "--engine", "sglang",
      "--connector-version", "c8109375"),
     "--connector-version 'c8109375' is not modelled for sglang; use 8905cbd4"),
    # --disable-overlap-schedule is refused on a batch pattern; with --disagg it was ignored
    (PATTERN + DISAGG + ("--engine", "sglang", "--disable-overlap-schedule"),
     "--disable-overlap-schedule is not modelled with it"),
    # full-width digits: int() and re's \d read them, so 'tp\uff12' was a layout of tp 2
    ((*PATTERN, "--disagg", "prefill=tp\uff12,decode=tp2"), "is not a layout"),
    ((*PATTERN, "--tp", "\uff12"), "is not an integer"),
    ((*PATTERN, "--tp", "1_0"), "is not an integer"),
    (("pattern", "--model", "llama-3.1-8b", "--requests",
      "poisson:rate=1,count=5,prompt=1\uff10,output=3,seed=1"), "must be a token count"),
    # settings grids: --env-runs without --env ran one plain job
    ((*REPLAY, "--env-runs", "3"), "--env-runs repeats the combinations of --env"),
    (("sweep", "--op", "allreduce", "--nproc", "2", "--env-runs", "3"),
     "--env-runs repeats the combinations of --env"),
    # 2 combinations x 100,000 runs: the 64-combination cap did not count the repeats
    ((*REPLAY, "--env", "A=1,2", "--env-runs", "100000"),
     "2 combinations x --env-runs 100,000 = 200,000 runs, more than 640"),
    # a sweep of sizes ran, ignoring every pattern option (--connector, --moe-backend,
    # --requests...), and the KV transfer's options with another op
    (("sweep", "--op", "allreduce", "--nproc", "2", "--moe-backend", "triton"),
     "--moe-backend describes a pattern, which a sweep of sizes does not make"),
    (("sweep", "--op", "allreduce", "--nproc", "2", "--requests",
      "poisson:rate=1,count=5,prompt=10,output=3,seed=1"), "--requests describes a pattern"),
    (("sweep", "--op", "kvtransfer", "--nproc", "2", "--connector", "nixl"),
     "--connector describes a pattern, which a sweep of sizes does not make; drop them"),
    (("sweep", "--op", "allreduce", "--nproc", "2", "--kv-direction", "write"),
     "--kv-direction acts only with --op kvtransfer"),
    (("sweep", "--op", "kvtransfer", "--nproc", "2", "--with-collectives"),
     "--with-collectives acts with replay --disagg"),
    # replay --trace replayed the trace, ignoring the pattern options given with it
    (("replay", "--trace", str(TRACE), "--engine", "sglang", "--moe-backend", "triton"),
     "--trace replays the trace's own calls on its own layout; drop --engine, --moe-backend"),
    (("replay", "--trace", str(TRACE), "--connector", "nixl"), "drop --connector"),
    (("replay", "--trace", str(TRACE), "--kv-transport", "rma"),
     "--kv-transport describe(s) the KV transfer of --disagg"),
    # --name is printed in every header: a terminal escape in it was printed raw, an empty
    # one named the model ""
    ((*PATTERN, "--name", "a\x1b]0;pwn\x07b"), "'a\\x1b]0;pwn\\x07b': a name is at most 120"),
    ((*PATTERN, "--name", ""), "an empty name names nothing"),
    # bad input in a grid: the first run started, then four lines (progress, the run's
    # refusal, 'the run with A=1 failed', 'nothing kept'); now its refusal alone
    ((*REPLAY[:-4], "--tp", "3", "--nproc", "3", "--env", "A=1,2"),
     "tp(3) does not divide num_attention_heads(32)"),
]


@pytest.mark.parametrize("argv, said", REFUSED, ids=[" ".join(a[-3:]) for a, _ in REFUSED])
def test_refused_in_one_line(cli, argv, said):
    status, out, err = cli(*argv)
    assert status == 2, err
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert said in err, err
    assert "Traceback" not in err


def test_a_request_with_a_key_twice_is_refused(cli, tmp_path):
    # {"prompt": 10, "prompt": 20}: json.loads keeps the last, so the request was 20 tokens
    path = tmp_path / "twice.jsonl"
    path.write_text('{"arrival_s": 0, "prompt": 10, "prompt": 20, "output": 3}\n')
    status, out, err = cli("pattern", "--model", "llama-3.1-8b", "--requests", str(path))
    assert status == 2 and out == "", err
    assert f"{path}:1: key 'prompt' is given twice" in err, err


def test_plan_still_routes_a_workload(cli):
    # --dp-routing with --requests is what it is for: the refusal above must not catch it
    status, out, err = cli(*PLAN[:-4], "--requests",
                           "poisson:rate=2,count=8,prompt=64,output=4,seed=1",
                           "--step-time-ms", "30", "--dp-routing", "least-loaded")
    assert status == 0, err
    assert json.loads(out.strip().splitlines()[-1])["gpus"] == 8


def test_a_grid_checks_its_input_without_a_run(cli, tmp_path):
    # the check ends where ranks would start: nothing in --out, one line
    out_dir = tmp_path / "runs"
    status, out, err = cli(*REPLAY, "--env", "A=1,2", "--out", str(out_dir),
                           "--moe-backend", "triton")
    assert status == 2 and out == "", err
    assert err.count("\n") == 1 and "drop --moe-backend" in err, err
    assert not out_dir.exists() or not any(out_dir.iterdir())


CONFIGS = ROOT / "tests" / "data" / "configs"


def _variant(tmp_path, base: str, **fields):
    raw = json.loads((CONFIGS / base / "config.json").read_text())
    target = raw.get("text_config", raw)
    target.update(fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return path


# sliding windows read from a config.json: each of these was read as full attention (all
# layers' blocks moved), silently; gpt-oss-20b has 24 layers, sliding every other one
SLIDING = [
    ("gpt-oss-20b", {"sliding_window": -5}, "sliding_window is -5; it must be a positive"),
    ("gpt-oss-20b", {"sliding_window": "128"}, "sliding_window is '128'"),
    ("gpt-oss-20b", {"layer_types": ["sliding_attention"] * 3},
     "layer_types is 3 entries; it must list one attention kind a layer (24)"),
    ("gpt-oss-20b", {"layer_types": "sliding_attention"}, "layer_types is str"),
    ("gemma-3-4b", {"sliding_window_pattern": 0}, "sliding_window_pattern is 0"),
    ("gemma-3-4b", {"sliding_window_pattern": 2.5}, "sliding_window_pattern is 2.5"),
]


@pytest.mark.parametrize("base, fields, said", SLIDING, ids=[str(f) for _, f, _ in SLIDING])
def test_a_malformed_sliding_window_is_refused(cli, tmp_path, base, fields, said):
    status, out, err = cli("pattern", "--model", str(_variant(tmp_path, base, **fields)),
                           "--prompt", "2000", "--decode", "4",
                           "--disagg", "prefill=tp2,decode=tp2")
    assert status == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and said in err, err


def _interleave_main():
    import importlib.util
    spec = importlib.util.spec_from_file_location("interleave", ROOT / "scripts" /
                                                  "interleave.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


# scripts/interleave.py: usage errors were argparse's three lines; a --compare-args shlex
# cannot split was a ValueError traceback after every run; --env in the command made grids
# that compare refused after every run; an --out no run can create failed run a-1
INTERLEAVE = [
    (("-k", "0"), "-k 0: take 1 to 100 runs a side"),
    (("--compare-args", '"open'), "--compare-args '\"open': No closing quotation"),
    (("--a", ""), "--a is empty"),
    (("--", "replay", "--env", "A=1,2"), "--env after --: interleave gives each run"),
    (("--", "pattern"), "interleave runs replay or sweep"),
    (("--out", "/proc/self/x"), "--out '/proc/self/x' cannot be created"),
]


@pytest.mark.parametrize("given, said", INTERLEAVE, ids=[g[0] + g[-1] for g, _ in INTERLEAVE])
def test_interleave_refuses_in_one_line(capsys, tmp_path, given, said):
    options = {"-k": "2", "--a": "infercomm", "--b": "infercomm", "--out": str(tmp_path)}
    command = ["--", "replay", "--model", "llama-3.2-1b", "--tp", "2"]
    if "--" in given:
        command = list(given)
    else:
        options.update(zip(given[::2], given[1::2], strict=True))
    argv = [*(x for kv in options.items() for x in kv), *command]
    with pytest.raises(SystemExit) as ended:
        _interleave_main()(argv)
    out, err = capsys.readouterr()
    assert ended.value.code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and said in err, err


def test_a_configs_name_is_printed_escaped(cli, tmp_path):
    # _name_or_path is a file's text: the pattern's header printed it raw (an OSC sequence
    # that sets the terminal's title here)
    path = _variant(tmp_path, "qwen3-8b", _name_or_path="x\x1b]0;pwn\x07y")
    status, out, err = cli("pattern", "--model", str(path), "--prompt", "8", "--decode", "2",
                           "--tp", "2")
    assert status == 0, err
    assert "\x1b" not in out and "x\\x1b]0;pwn\\x07y" in out.splitlines()[0]


@pytest.mark.parametrize("value", ["big", 10 ** 400, -1, True])
def test_a_kv_transfer_runs_counts_are_checked(cli, tmp_path, value):
    # report of a KV-transfer run whose meta.json says kv_transfer_bytes "big" (or 10^400)
    # was a ValueError (OverflowError) traceback from the report's table
    run = tmp_path / "run"
    run.mkdir()
    meta = {"kind": "kvtransfer", "argv": ["replay"], "backend": "torch", "world_size": 2,
            "kv_transfer_bytes": value}
    (run / "meta.json").write_text(json.dumps(meta))
    status, out, err = cli("report", str(run), "-o", str(tmp_path / "r.html"))
    assert status == 2 and out == "", err
    assert "meta.json: kv_transfer_bytes is " in err and "not a count" in err, err
    assert not (tmp_path / "r.html").exists()


def test_mpi_without_mpi4py_is_one_line_before_any_rank(cli, tmp_path, monkeypatch):
    # mpiexec started the ranks, each failed importing mpi4py: three lines, exit 1
    import sys
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # `import mpi4py` raises ImportError
    status, out, err = cli(*REPLAY, "--backend", "mpi", "--out", str(tmp_path / "runs"))
    assert status == 2 and out == "", err
    assert err.strip() == ("infercomm replay: error: --backend mpi needs mpi4py in this "
                           "Python: pip install 'infercomm[mpi]', or use --backend torch")
