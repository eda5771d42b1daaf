"""The --requests and --speculative-config readers under a hostile battery (issue 34, faults
5, 10, 11, 12 and 13's reader items): every bad file is one line naming its place, exit 2,
no traceback and none of the file's raw bytes; a workload beyond the model's positions is
refused before any scheduling; Azure arrivals read as UTC."""

import os
import subprocess
import sys

import pytest

from patterns import ConfigError
from patterns.engines.vllm import scheduler as scheduler_vllm
from patterns.workload.requests import MAX_LINE, Request, read_requests, read_workload

PATTERN = ["pattern", "--model", "llama-3.1-8b", "--tp", "2", "--step-time-ms", "30"]
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def refused(cli, *argv: str) -> str:
    status, out, err = cli(*argv)
    assert status == 2 and out == "" and "Traceback" not in err, (status, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("body, words", [
    # fault 12: each was a traceback (ValueError, OverflowError, RecursionError, csv.Error)
    ('{"arrival_s": 0, "prompt": NaN, "output": 3}', "w.jsonl:1: NaN is not a number"),
    ('{"arrival_s": 0, "prompt": Infinity, "output": 3}', "w.jsonl:1: Infinity is not"),
    ('{"arrival_s": 0, "prompt": 1e400, "output": 3}', "w.jsonl:1: 1e400 is beyond any float"),
    ('{"arrival_s": 0, "prompt": ' + "9" * 5000 + ', "output": 3}',
     "w.jsonl:1: an integer of 5,000 digits"),
    ('{"arrival_s": ' + "9" * 400 + ', "prompt": 3, "output": 3}',
     "w.jsonl:1: an integer of 400 digits"),  # was a 400-digit number in the message
    ("[" * 100_000, "w.jsonl:1: JSON nested too deep"),
])
def test_hostile_jsonl_is_one_line(cli, tmp_path, body, words):
    (tmp_path / "w.jsonl").write_text(body + "\n")
    line = refused(cli, *PATTERN, "--requests", str(tmp_path / "w.jsonl"))
    assert words in line and len(line) < 400, line


def test_a_one_line_file_is_refused_after_a_bounded_read(cli, tmp_path):
    # fault 12: a 1 GB file of one line was read whole (memory, then a traceback). 3 MiB
    # here: read at most MAX_LINE + 1 characters of it, then refused.
    path = tmp_path / "w.jsonl"
    path.write_text("x" * (3 * MAX_LINE))
    assert "w.jsonl:1: a line longer than 1 MiB" in refused(cli, *PATTERN, "--requests",
                                                             str(path))


def test_a_csv_field_beyond_the_csv_limit_names_its_line(cli, tmp_path):
    # fault 12: csv.Error "field larger than field limit (131072)" was a traceback.
    path = tmp_path / "w.csv"
    path.write_text(HEADER + '"' + "x" * 200_000 + '",1,1\n')
    assert "w.csv:2: not a CSV line" in refused(cli, *PATTERN, "--requests", str(path))


def test_a_file_given_by_mistake_is_not_printed(cli, tmp_path):
    # fault 11: "line 1 is 'sk-...'" printed the first line of any .csv (a key file linked
    # as the trace); terminal escapes in a field were printed raw.
    secret = tmp_path / "key.csv"
    secret.write_text("sk-THE-SECRET-KEY-0123456789\n")
    line = refused(cli, *PATTERN, "--requests", str(secret))
    assert "THE-SECRET" not in line and "key.csv:1: not the header of an Azure trace" in line
    escapes = tmp_path / "esc.csv"
    escapes.write_text(HEADER + "2023-11-16 18:15:46.68,\x1b[31mred\x1b[0m,3\n")
    line = refused(cli, *PATTERN, "--requests", str(escapes))
    assert "\x1b" not in line and "\\x1b[31mred" in line and "esc.csv:2" in line


@pytest.mark.parametrize("given, words", [
    ("folder", "a folder"),
    ("fifo", "not a regular file (a named pipe"),
])
def test_what_is_no_file_is_said_for_what_it_is(cli, tmp_path, given, words):
    # fault 13: a FIFO, /dev/stdin (a pipe here) or a folder was "no such file".
    path = tmp_path / given
    if given == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)
    assert words in refused(cli, *PATTERN, "--requests", str(path))


def test_stdin_as_a_pipe_is_refused_without_waiting(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "microbench", *PATTERN, "--requests",
                           "/dev/stdin"], stdin=subprocess.PIPE, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


def test_a_poisson_key_given_twice_is_refused():
    # fault 13: rate=1 ... rate=3 took the last silently.
    with pytest.raises(ConfigError, match="rate is given twice"):
        read_requests("poisson:rate=1,count=2,prompt=5,output=3,rate=3")


AZURE_DST = (HEADER + "2023-11-05 01:59:00.0,10,2\n"  # the night US clocks went back
             "2023-11-05 02:01:00.0,10,2\n")


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_azure_arrivals_do_not_depend_on_the_time_zone(tmp_path, zone):
    # fault 10: TIMESTAMPs were read in the machine's zone; in New York 01:59 is EDT and
    # 02:01 EST, which put the second request 3,720 s after the first. As UTC: 120 s.
    path = tmp_path / "w.csv"
    path.write_text(AZURE_DST)
    code = ("from patterns.workload.requests import read_requests; import sys; "
            "print([r.arrival_s for r in read_requests(sys.argv[1])])")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, env={**os.environ, "TZ": zone}, timeout=60, check=True)
    assert proc.stdout.strip() == "[0.0, 120.0]"


def test_azure_with_a_bom_and_out_of_order_is_read_and_said(tmp_path, cli):
    # fault 10: a UTF-8 BOM made the header "\ufeffTIMESTAMP" (refused); a line earlier than
    # the first gave "arrival -1.68059 s" although the file was merely unsorted. Now the
    # arrivals count from the earliest, 18:15:45.0: 46.68059 - 45.0 = 1.68059 s.
    path = tmp_path / "w.csv"
    path.write_bytes(("\ufeff" + HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
                      "2023-11-16 18:15:45.0,10,2\n").encode())
    requests, note = read_workload(str(path))
    assert requests == [Request(0.0, 10, 2), Request(1.68059, 374, 44)]
    assert note is not None and "not in time order (request 2 of the file arrives before "\
        "request 1; one place in all)" in note
    status, _, err = cli(*PATTERN, "--requests", str(path))
    assert status == 0 and "infercomm: note: --requests" in err and "not in time order" in err


def test_positions_are_checked_before_scheduling(cli, tmp_path, monkeypatch):
    # fault 5: llama-2-7b has 4,096 positions (tests/test_bad_input.py); the third request
    # in arrival order asks 4,000 + 97 = 4,097. It was found only after the whole schedule
    # (44-74 s for 10^6 requests; no answer in 60 s with --max-batched-tokens 1).
    scheduled = []
    monkeypatch.setattr(scheduler_vllm, "arrival_steps",
                        lambda *a: scheduled.append(a) or [0, 0, 0])
    path = tmp_path / "w.jsonl"
    path.write_text('{"arrival_s": 0.0, "prompt": 10, "output": 2}\n'
                    '{"arrival_s": 0.2, "prompt": 4000, "output": 97}\n'
                    '{"arrival_s": 0.1, "prompt": 10, "output": 2}\n')
    line = refused(cli, "pattern", "--model", "llama-2-7b", "--requests", str(path),
                   "--step-time-ms", "30", "--max-batched-tokens", "1")
    assert scheduled == []
    # issue 42: named by its line (2), not by its place in arrival order (3)
    assert ("the request on line 2 of the --requests file (at 0.2 s): prompt(4000) + "
            "output(97) = 4097 tokens exceed max_position_embeddings(4096)") in line


def test_a_large_workload_says_its_progress(cli, tmp_path, monkeypatch):
    # fault 5: 10^6 requests took 29 s with no word; from PROGRESS_FROM requests (100,000)
    # each phase is said on stderr. Lowered to 3 here to keep the test fast.
    from microbench.options import workload_args
    monkeypatch.setattr(workload_args, "PROGRESS_FROM", 3)
    status, _, err = cli(*PATTERN, "--requests", "poisson:rate=10,count=3,prompt=8,output=2")
    assert status == 0, err
    assert err.splitlines() == [
        "[infercomm] 3 requests read and checked; scheduling them under vllm",
        # 3 requests at 10 a second, 30 ms steps: their prefills and single decodes
        next(line for line in err.splitlines() if line.startswith("[infercomm] scheduled: "))]


def test_a_step_time_of_1e_320_ms_is_refused(cli, tmp_path):
    # fault 12: 1e-320 ms -> arrival / step time = inf -> OverflowError in math.ceil.
    line = refused(cli, "pattern", "--model", "llama-3.1-8b", "--tp", "2", "--requests",
                   "poisson:rate=10,count=3,prompt=8,output=2", "--step-time-ms", "1e-320")
    assert "--step-time-ms 1e-320" in line and "at least a microsecond" in line


@pytest.mark.parametrize("config, words", [
    ("[" * 3000, "nested too deep"),
    ('{"method": "eagle", "num_speculative_tokens": NaN}', "NaN is not a value it takes"),
    ('{"method": "eagle", "num_speculative_tokens": ' + "9" * 3000 + "}",
     "an integer of 3,000 digits"),
    ('{"method": "' + "x" * 5000 + '"}', "of 5,014 characters"),  # 12 + 5,000 + 2 characters
])
def test_hostile_speculative_configs_are_one_line(cli, config, words):
    # fault 12: RecursionError and ValueError (int digits) were tracebacks.
    line = refused(cli, "pattern", "--model", "llama-3.1-8b", "--tp", "4", "--prompt", "16",
                   "--decode", "9", "--speculative-config", config, "--acceptance-length", "2")
    assert words in line and len(line) < 300, line


def test_speculative_with_trtllm_is_refused_as_speculative(cli):
    # fault 13: it said "--requests with engine trtllm: ..." to a command without --requests.
    line = refused(cli, "pattern", "--model", "llama-3.1-8b", "--tp", "4", "--prompt", "16",
                   "--decode", "9", "--engine", "trtllm", "--speculative-config",
                   '{"method": "eagle", "num_speculative_tokens": 3}', "--acceptance-length",
                   "2")
    assert "--requests" not in line and "--speculative-config is modelled for engines vllm " \
        "and sglang, not trtllm" in line


def test_a_workload_of_too_many_steps_is_refused_before_scheduling(cli, monkeypatch):
    # fault 5: with --max-batched-tokens 1 a workload of long prompts gave no answer in 60 s.
    # 1,001 prompts of 100,000 tokens at 1 token a step: 100,100,000 steps at least, above
    # 10^8 (llama-3.1-8b takes 131,072 positions: 100,000 + 2 fit).
    scheduled = []
    monkeypatch.setattr(scheduler_vllm, "arrival_steps", lambda *a: scheduled.append(a) or [])
    line = refused(cli, *PATTERN, "--requests",
                   "poisson:rate=10,count=1001,prompt=100000,output=2",
                   "--max-batched-tokens", "1")
    assert scheduled == []
    assert "100,100,000 prompt tokens at 1 a step (--max-batched-tokens) need at least " \
        "100,100,000 steps, more than 100,000,000" in line
