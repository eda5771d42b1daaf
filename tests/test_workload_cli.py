"""`--requests` from the command line: the trace readers, bad input (one line, exit 2, before
any work), and a workload's steps replayed over gloo and MPI with --check."""

from collections import Counter

import pytest

from patterns import ConfigError
from patterns.workload.requests import Request, read_requests
from tests.replay_helpers import infercomm, last_json, needs_mpi, read_csv, tiny_model


def test_azure_csv(tmp_path):
    # AzureLLMInferenceTrace_conv.csv's header and TIMESTAMP format (7 fractional digits).
    f = tmp_path / "azure.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n")
    # 50.9951690 - 46.6805900 = 4.314579 s after the first line.
    assert read_requests(str(f)) == [Request(0.0, 374, 44), Request(4.314579, 396, 109)]


def test_mooncake_and_plain_jsonl(tmp_path):
    moon = tmp_path / "mooncake.jsonl"  # timestamp in ms; hash_ids ignored
    moon.write_text('{"timestamp": 27482, "input_length": 6955, "output_length": 52, '
                    '"hash_ids": [46, 47]}\n{"timestamp": 0, "input_length": 10, '
                    '"output_length": 1, "hash_ids": []}\n')
    # Sorted by arrival: 0 ms first, then 27482 ms = 27.482 s.
    assert read_requests(str(moon)) == [Request(0.0, 10, 1), Request(27.482, 6955, 52)]
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"arrival_s": 0.5, "prompt": 100, "output": 3}\n\n')
    assert read_requests(str(plain)) == [Request(0.5, 100, 3)]


def test_poisson_is_seeded_and_starts_at_zero():
    a = read_requests("poisson:rate=100,count=50,prompt=10..20,output=4,seed=3")
    assert a == read_requests("poisson:rate=100,count=50,prompt=10..20,output=4,seed=3")
    assert len(a) == 50 and a[0].arrival_s == 0.0
    assert all(10 <= r.prompt <= 20 and r.output == 4 for r in a)
    assert a != read_requests("poisson:rate=100,count=50,prompt=10..20,output=4,seed=4")


@pytest.mark.parametrize("spec, words", [
    ("poisson:rate=1,count=2000000,prompt=1,output=1", "more than 1,000,000 requests"),
    ("poisson:rate=1,count=2,prompt=1000000000000,output=1", "between 1 and 100,000,000"),
    ("poisson:rate=0,count=2,prompt=1,output=1", "positive number"),
    ("poisson:rate=1,count=2,prompt=1", "missing output"),
])
def test_bad_generators_refused(spec, words):
    with pytest.raises(ConfigError, match=words):
        read_requests(spec)


BASE = ["pattern", "--model", "llama-3.1-8b", "--tp", "2"]


@pytest.mark.parametrize("line, extra, words", [
    ('{"arrival_s": 0, "prompt": 10}', [], "missing output"),
    ('{"arrival_s": 0, "prompt": 1000000000000, "output": 1}', [], "between 1 and"),
    ("not json", [], "not JSON"),
    ('{"arrival_s": 1.5, "prompt": 10, "output": 2}', [], "give --step-time-ms"),
    ('{"arrival_s": 0, "prompt": 10, "output": 2}', ["--prompt", "8"], "drop --prompt"),
    ('{"arrival_s": 0, "prompt": 10, "output": 2}', ["--engine", "trtllm"],
     "in-flight batching"),
    # --dp 2 is routed to DP ranks (test_dp_workload.py); DP x PP is not modelled
    ('{"arrival_s": 0, "prompt": 10, "output": 2}', ["--dp", "2", "--pp", "2"], "use --pp 1"),
    ('{"arrival_s": 0, "prompt": 200000, "output": 2}', [], "max_position_embeddings"),
])
def test_bad_input_one_line_exit_2(tmp_path, line, extra, words):
    f = tmp_path / "w.jsonl"
    f.write_text(line + "\n")
    proc, _ = infercomm(*BASE, "--requests", str(f), *extra)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


def test_step_time_without_requests_refused():
    proc, _ = infercomm(*BASE, "--prompt", "8", "--decode", "2", "--step-time-ms", "5")
    assert proc.returncode == 2 and "goes with --requests" in proc.stderr


@pytest.mark.parametrize("flag, engine, words", [
    ("--async-scheduling", "sglang", "--async-scheduling / --no-async-scheduling does not "
     "apply to engine sglang; it applies to vllm"),
    ("--no-async-scheduling", "sglang", "it applies to vllm"),
    ("--disable-overlap-schedule", "vllm", "--disable-overlap-schedule does not apply to "
     "engine vllm; it applies to sglang"),
    ("--disable-overlap-schedule", "sglang-batch", "--disable-overlap-schedule goes with "
     "--requests"),
])
def test_scheduling_switch_of_another_engine_refused(tmp_path, flag, engine, words):
    if engine == "sglang-batch":  # a batch pattern: the switch changes nothing there
        proc, _ = infercomm(*BASE, "--prompt", "8", "--decode", "2", "--engine", "sglang",
                            flag)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        return
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0, "prompt": 8, "output": 2}\n')
    proc, _ = infercomm(*BASE, "--requests", str(f), "--engine", engine, flag)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""


# The workload replayed below: the tiny model (h 64, 4 layers, vocab 1000) at TP2, vLLM V1,
# budget 32, max_num_seqs 4, step time 10 ms.
# A (0 s, prompt 40, output 3), B (0 s, 10, 4), C (30 ms -> clock step 3, 20, 2):
# step 0: A 32 of 40 (the budget)          T 32
# step 1: A's last 8 + B's 10              T 18 (both sample)
# step 2: A, B decode                      T 2 (the run stops at C's arrival)
# step 3: A, B decode + C's 20             T 22 (A's last token)
# step 4: B, C decode                      T 2 (both end)
# Every step: 1 + 2 x 4 = 9 all-reduces and 1 logits all-gather: 5 steps -> 45 + 5 calls.
WORKLOAD = ('{"arrival_s": 0.0, "prompt": 40, "output": 3}\n'
            '{"arrival_s": 0.0, "prompt": 10, "output": 4}\n'
            '{"arrival_s": 0.03, "prompt": 20, "output": 2}\n')


def test_pattern_json_of_the_workload(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text(WORKLOAD)
    proc, _ = infercomm("pattern", "--model", tiny_model(tmp_path), "--tp", "2", "--requests",
                        str(f), "--step-time-ms", "10", "--max-batched-tokens", "32",
                        "--max-num-seqs", "4", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = last_json(proc.stdout)
    assert [(r["first_step"], r["repeat"], r["tokens"]) for r in doc["step_rows"]] == [
        (0, 1, 32), (1, 1, 18), (2, 1, 2), (3, 1, 22), (4, 1, 2)]
    assert [r["calls"] for r in doc["step_rows"]] == [10] * 5
    # C's TTFT is step 3 alone: 9 all-reduces of 22 x 64 x 2 B = 25,344 B plus the logits
    # all-gather's input [3 rows, 1024/2] x 2 B = 3,072 B -> 28,416 B.
    assert doc["per_request"][2]["ttft_bytes"] == 28_416
    assert doc["per_request"][2]["waited_steps"] == 0


@pytest.mark.parametrize("backend", ["torch", pytest.param("mpi", marks=needs_mpi)])
def test_replay_workload_with_check(tmp_path, backend):
    f = tmp_path / "w.jsonl"
    f.write_text(WORKLOAD)
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--requests",
                        str(f), "--step-time-ms", "10", "--max-batched-tokens", "32",
                        "--max-num-seqs", "4", "--backend", backend, "-n", "2", "-w", "1",
                        "--timing", "op", "--check", "--out", str(tmp_path / "res"),
                        "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert (line["wrong"], line["calls_per_inference"]) == (0, 50)
    assert line["workload"]["requests"] == 3 and line["workload"]["steps"] == 5
    assert all(v > 0 for v in line["workload"]["ttft_comm_us"].values())
    run = tmp_path / "res" / line["results_dir"].split("/")[-1]
    ops = read_csv(run / "ops.csv")
    for rank in ("0", "1"):
        issued = Counter(r["op"] for r in ops if r["iteration"] == "0" and r["rank"] == rank)
        assert issued == Counter(allreduce=45, allgather=5)
    steps = read_csv(run / "workload_steps.csv")
    assert [(r["first_step"], r["tokens"]) for r in steps] == [
        ("0", "32"), ("1", "18"), ("2", "2"), ("3", "22"), ("4", "2")]
    requests = read_csv(run / "workload_requests.csv")
    assert [r["ttft_steps"] for r in requests] == ["2", "1", "1"]  # A: steps 0-1; B: 1; C: 3


def test_predict_against_a_workload_replay_shows_both(tmp_path):
    from tests.test_predict import fake_sweep
    f = tmp_path / "w.jsonl"
    f.write_text(WORKLOAD)
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--requests",
                        str(f), "--step-time-ms", "10", "--max-batched-tokens", "32",
                        "--max-num-seqs", "4", "--backend", "torch", "-n", "2", "-w", "1",
                        "--out", str(tmp_path / "res"), "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    measured = last_json(proc.stdout)["workload"]
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.001),
                                            "allgather": (20.0, 0.002)})
    proc, _ = infercomm("predict", "--sweep", str(sweep), "--against",
                        last_json(proc.stdout)["results_dir"])
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    # The replay's own pattern (rebuilt from its arguments) priced, its measured figures
    # shown beside: the same three requests, TTFT p50 as tests/test_workload_predict.py.
    assert line["workload"]["ttft_comm_us"]["p50"] == pytest.approx(147.632, abs=1e-3)
    assert line["measured_workload"] == {k: measured[k] for k in ("ttft_comm_us",
                                                                  "tpot_comm_us")}


def test_sweep_from_a_workloads_pattern(tmp_path):
    # The workload's steps above: 32, 18, 2, 22 and 2 tokens, none padded (decodes of 2 are a
    # capture size; the rest exceed the largest, min(2 x 4, 512, 32) = 8), 9 all-reduces of
    # [T, 64] bf16 a step: 4,096, 2,304, 256 (twice) and 2,816 bytes; one logits all-gather a
    # step of [R, 1024 / 2] (R = requests whose token is sampled).
    f = tmp_path / "w.jsonl"
    f.write_text(WORKLOAD)
    proc, _ = infercomm("sweep", "--from-pattern", "--model", tiny_model(tmp_path), "--tp", "2",
                        "--requests", str(f), "--step-time-ms", "10",
                        "--max-batched-tokens", "32", "--max-num-seqs", "4", "--backend",
                        "torch", "-n", "1", "-w", "0", "--out", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(f"{last_json(proc.stdout)['results_dir']}/sweep.csv")
    allreduces = {int(r["size_bytes"]): int(r["calls_per_inference"]) for r in rows
                  if r["op"] == "allreduce"}
    assert allreduces == {256: 18, 2304: 9, 2816: 9, 4096: 9}


@pytest.mark.parametrize("flag, rows, waited", [
    # The workload above at --max-num-seqs 2 (budget 32, step time 10 ms):
    # step 0: A 32 of 40; budget spent, B waits       T 32
    # step 1: A's last 8 + B's 10                     T 18 (running 2 = max_num_seqs)
    # steps 2-3: A, B decode; C arrives at clock 3    T 2 (A's last token at step 3)
    # --no-async-scheduling: A gone at step 4:
    # step 4: B's last decode + C's 20                T 21
    # step 5: C decodes                               T 1; C waited step 3 only.
    ("--no-async-scheduling", [(0, 1, 32), (1, 1, 18), (2, 2, 2), (4, 1, 21), (5, 1, 1)], 1),
    # vLLM's default (async): A, done at step 3, still holds its slot at step 4
    # (schedule(4) before update_from_output(3)), so C waits one step more:
    # step 4: B's last decode                         T 1
    # step 5: C's 20 (B done, holding a slot: 1 + 1)  T 20
    # step 6: C decodes                               T 1; C waited steps 3 and 4.
    (None, [(0, 1, 32), (1, 1, 18), (2, 2, 2), (4, 1, 1), (5, 1, 20), (6, 1, 1)], 2),
    ("--async-scheduling", [(0, 1, 32), (1, 1, 18), (2, 2, 2), (4, 1, 1), (5, 1, 20),
                            (6, 1, 1)], 2),
])
def test_async_scheduling_moves_an_admission(tmp_path, flag, rows, waited):
    f = tmp_path / "w.jsonl"
    f.write_text(WORKLOAD)
    proc, _ = infercomm("pattern", "--model", tiny_model(tmp_path), "--tp", "2", "--requests",
                        str(f), "--step-time-ms", "10", "--max-batched-tokens", "32",
                        "--max-num-seqs", "2", "--format", "json", *([flag] if flag else []))
    assert proc.returncode == 0, proc.stderr
    doc = last_json(proc.stdout)
    assert [(r["first_step"], r["repeat"], r["tokens"]) for r in doc["step_rows"]] == rows
    assert doc["per_request"][2]["waited_steps"] == waited
