"""Messages issue 34's battery found wrong (fault 11's terminal escapes, fault 13): text a
trace carries is printed escaped, options that do not go together are named for what they
are, and `report` without -o does not replace ./report.html."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "fixtures" / "traces" / "nccl_interleaved_tp2.log"
SAMPLES = ROOT / "results" / "examples" / "samples"
REPLAY = next(SAMPLES.glob("*-replay-llama-3.2-1b-tp2-mpi"))
# An OSC sequence (set the terminal's title) and a colour change inside the host name.
HOSTILE = "node\x1b]0;pwned\x07\x1b[31ma"


@pytest.fixture
def hostile_log(tmp_path):
    path = tmp_path / "hostile.log"
    path.write_text(LOG.read_text().replace("node-a", HOSTILE))
    return path


def test_a_traces_host_names_are_printed_escaped(cli, hostile_log):
    # fault 11: `trace` printed "rank 0 (node<ESC>]0;pwned<BEL>...": the trace drove the
    # terminal. Escaped, the name reads as written.
    status, out, err = cli("trace", str(hostile_log))
    assert status == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "rank 0 (node\\x1b]0;pwned\\x07\\x1b[31ma:501:0)" in out
    status, out, err = cli("validate", "--trace", str(hostile_log), "--model", "llama-3.1-8b",
                           "--tp", "2", "--prompt", "8", "--decode", "2")
    assert "\x1b" not in out + err


def test_an_error_line_never_carries_control_characters(cli):
    # fault 11: a refusal quoting its input printed it raw (here, a poisson key).
    status, out, err = cli("pattern", "--model", "llama-3.1-8b", "--requests",
                           "poisson:rate=1,count=2,prompt=5,output=3,\x1b[2J=1")
    assert status == 2 and out == "" and "\x1b" not in err and "unknown \\x1b[2J" in err, err
    assert len(err.strip().splitlines()) == 1


def test_replay_trace_does_not_ignore_requests(cli):
    # fault 13: --requests was dropped silently and the trace replayed.
    status, _, err = cli("replay", "--trace", str(LOG), "--requests",
                         str(ROOT / "examples" / "workloads" / "small.jsonl"))
    assert status == 2 and "--trace replays the trace's own calls on its own layout; drop " \
        "--requests" in err, err


@pytest.mark.parametrize("command", ["pattern", "replay"])
def test_disagg_with_requests_says_so(cli, command, tmp_path):
    # fault 13: "prompt length None must be a positive integer" (pattern), "--disagg needs
    # --prompt, --decode" (replay) to a command that gave --requests.
    status, _, err = cli(command, "--model", "llama-3.2-1b", "--disagg", "1P1D", "--requests",
                         str(ROOT / "examples" / "workloads" / "small.jsonl"), "--out",
                         str(tmp_path / "o")) if command == "replay" else cli(
        command, "--model", "llama-3.2-1b", "--disagg", "1P1D", "--requests",
        str(ROOT / "examples" / "workloads" / "small.jsonl"))
    assert status == 2 and "None" not in err, err
    assert "--disagg models one request's KV-cache transfer (--prompt, --decode); --requests " \
        "is not modelled with it" in err, err


def test_report_without_o_does_not_replace_report_html(cli, tmp_path, monkeypatch):
    # newcomer: `report RUN` wrote ./report.html over whatever was there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.html").write_text("mine")
    status, _, err = cli("report", str(REPLAY))
    assert status == 2 and "./report.html exists; pass -o FILE" in err, err
    assert (tmp_path / "report.html").read_text() == "mine"


@pytest.mark.parametrize("option", ["--prompt", "--tp", "--batch"])
def test_a_number_of_hundreds_of_digits_is_not_printed_back(cli, option):
    # fault 13: "prompt(99999...) + decode(2)" printed all 300 digits back.
    argv = {"--prompt": "8", "--decode": "2", option: "9" * 300}
    status, _, err = cli("pattern", "--model", "llama-3.1-8b",
                         *[w for kv in argv.items() for w in kv])
    assert status == 2 and "9" * 19 not in err and "an integer of 300 digits" in err, err


def test_gloo_is_named_as_the_torch_backend_on_cpu(cli):
    # newcomer: "invalid choice: 'gloo'" said nothing of where gloo is.
    status, _, err = cli("sweep", "--backend", "gloo")
    assert status == 2 and "gloo is --backend torch --device cpu" in err, err


def test_device_cuda_without_a_gpu_is_said_once(tmp_path):
    # newcomer: every rank said it, then the launcher: three lines for one mistake.
    import subprocess
    import sys

    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    proc = subprocess.run([sys.executable, "-m", "microbench", "replay", "--model",
                           "llama-3.2-1b", "--tp", "2", "--prompt", "4", "--decode", "2",
                           "--device", "cuda", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "infercomm replay: error: --device cuda asked for, but no CUDA device is visible; use "
        "--device cpu"], proc.stderr


def test_replay_names_only_the_missing_options(cli):
    # newcomer: "required: --model, --prompt, --decode" to a command that gave --model.
    status, _, err = cli("replay", "--model", "llama-3.1-70b", "--tp", "8")
    assert status == 2 and "required: --prompt, --decode (or --trace" in err, err


def test_user_output_carries_no_internal_references(cli):
    # newcomer: "engine spec section 5", "(patterns/moe.py lists them)" in `infercomm engines`.
    status, out, _ = cli("engines")
    assert status == 0
    assert "engine spec" not in out and "patterns/" not in out


def test_a_workload_is_named_by_its_requests(cli):
    # newcomer: the header named the workload's largest request ("prompt=2600 decode=12").
    # examples/workloads/small.jsonl: 6 requests, prompts 120 to 2,600, outputs 3 to 12.
    status, out, err = cli("pattern", "--model", "llama-3.1-70b", "--tp", "8", "--requests",
                           str(ROOT / "examples" / "workloads" / "small.jsonl"),
                           "--step-time-ms", "30", "--max-batched-tokens", "2048")
    assert status == 0, err
    assert "requests: prompt 120..2,600 tokens, output 3..12 tokens" in out
    # ... and so does a replay's title (the same pattern, built as replay builds it)
    from microbench.cli import build_parser
    from microbench.options.pattern_args import pattern_from_args
    from microbench.views.pattern import title
    argv = ["replay", "--model", "llama-3.1-70b", "--tp", "8", "--requests",
            str(ROOT / "examples" / "workloads" / "small.jsonl"), "--step-time-ms", "30"]
    pattern = pattern_from_args(build_parser(argv).parse_args(argv))
    assert "| 6 requests (prompt 120..2,600, output 3..12) bf16" in title(pattern)
    assert "prompt=2600" not in title(pattern)


def test_replay_names_its_allreduce_algorithm(tmp_path):
    # newcomer: --allreduce-algo was in meta.json only; a ring replay read like any other.
    from tests.replay_helpers import infercomm, last_json, tiny_model
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt",
                        "4", "--decode", "2", "-n", "1", "-w", "0", "--backend", "torch",
                        "--device", "cpu", "--allreduce-algo", "ring", "--out",
                        str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert last["allreduce_algo"] == "ring" and last["results_dir"].endswith("-torch-ring")
    assert any(line.startswith("backend torch") and "all-reduce: ring" in line
               for line in proc.stdout.splitlines())


def test_per_rank_and_whole_deployment_are_named_and_defined(cli):
    # newcomer: "calls per inference on the busiest rank" and "volume of one inference"
    # left per rank and per deployment, input bytes and bus bytes, to be guessed.
    # llama-3.1-8b TP2, 128 + 128 tokens, vLLM: 65 all-reduces of 128 x 4096 x 2 B = 1 MiB,
    # 8,255 of 8 KiB, 128 logits all-gathers of a [1, 64128] bf16 input (125.25 KiB):
    # sent by a rank: 65 MiB + 8,255 x 8 KiB (64.49 MiB) + 128 x
    # 125.25 KiB (15.66 MiB) = 145.15 MiB. On the wire at n = 2: an all-reduce 2(n-1)/n = 1
    # x its size, an all-gather (n-1)/n of its 250.5 KiB output = 125.25 KiB: 145.15 MiB.
    status, out, _ = cli("pattern", "--model", "llama-3.1-8b", "--tp", "2", "--prompt", "128",
                         "--decode", "128")
    assert status == 0
    assert "per rank (busiest): 8,448 calls, 145.15 MiB sent per inference (bytes sent: " \
        "each call's input buffer" in out
    assert "whole deployment: 145.15 MiB on the wire per inference (bus volume: every call " \
        "of every rank once, an all-reduce 2(n-1)/n of its size" in out
    assert "allreduce 129.49 MiB, allgather 15.66 MiB" in out


def test_predict_names_its_allreduce_algorithm(cli):
    sweep = next(SAMPLES.glob("*-sweep-torch-gloo-w2"))
    status, out, err = cli("predict", "--sweep", str(sweep), "--model", "llama-3.2-1b",
                           "--tp", "2", "--prompt", "8", "--decode", "4", "--allreduce-algo",
                           "ring")
    assert status == 0, err
    assert "; all-reduce: ring" in out.splitlines()[1]
    assert json.loads(out.strip().splitlines()[-1])["allreduce_algo"] == "ring"
