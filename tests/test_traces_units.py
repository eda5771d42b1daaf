"""The pieces of patterns.traces on small inputs whose answers are worked out by hand."""

import gzip
import json
from pathlib import Path

import pytest

from patterns import ConfigError
from patterns.traces import kineto_stream as kineto
from patterns.traces.steps import find_period, fold, split_steps


def test_period_of_a_prefill_then_repeated_decode_steps() -> None:
    # prefill: 3 calls of kind 1 then a 2; decode: 3 calls of kind 3 then a 4, five times
    ids = [1, 1, 1, 2] + [3, 3, 3, 4] * 5
    assert find_period(ids) == 4  # the last call (4) recurs every 4 calls
    steps = split_steps(ids, None)
    assert steps == [(0, 4)] + [(b, b + 4) for b in range(4, 24, 4)]
    assert fold(ids, steps) == [((1, 1, 1, 2), 1), ((3, 3, 3, 4), 5)]


def test_a_head_that_is_not_whole_periods_is_one_step() -> None:
    ids = [5, 7] + [3, 3, 4] * 3  # 2 calls, then 3 periods of 3
    assert split_steps(ids, None) == [(0, 2), (2, 5), (5, 8), (8, 11)]


def test_no_period_without_two_repeats() -> None:
    assert find_period([1, 2, 3]) is None
    assert split_steps([1, 2, 3], None) == [(0, 3)]


def test_annotated_steps_win_over_the_period() -> None:
    ids = [1, 1, 1, 1]
    assert split_steps(ids, [0, 3]) == [(0, 3), (3, 4)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_incremental_reader_across_chunk_boundaries(tmp_path: Path, chunk: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event and the header come out as json.load reads them, whatever the chunk."""
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4},
           "traceEvents": [{"ph": "X", "name": f"e{i}", "ts": 1234.5 + i, "dur": 10 ** i,
                            "args": {"Input Dims": [[i, 64]], "s": "a, ]}\" b"}}
                           for i in range(12)],
           "after": [1, 2, {"x": "y"}]}
    text = json.dumps(doc, indent=1)
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(text)
    monkeypatch.setattr(kineto, "CHUNK", chunk)
    header = {"distributedInfo": None, "after": None}
    events = list(kineto.iter_events(path, header))
    assert events == doc["traceEvents"]
    assert header == {"distributedInfo": doc["distributedInfo"], "after": doc["after"]}


def test_a_cut_off_trace_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "c10d::allreduce_", "ts": 1')
    from patterns.traces import read_traces
    with pytest.raises(ConfigError, match="not a readable Kineto JSON trace"):
        read_traces([str(path)])


def _event(name: str, ts: float, args: dict) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": 1.0, "args": args}


def test_record_param_comms_wins_over_c10d_events(tmp_path: Path) -> None:
    """On NCCL torch emits both a c10d op and record_param_comms (args named in
    torch/csrc/profiler/util.h: Collective name, dtype, In msg nelems, Group size, Rank);
    each call is counted once, from record_param_comms, which has the group size."""
    events = [
        _event("c10d::allreduce_", 1.0, {"Input Dims": [[[4, 64]], []],
                                         "Input type": ["TensorList", ""]}),
        _event("record_param_comms", 1.1, {"Collective name": "allreduce", "dtype": "BFloat16",
                                           "In msg nelems": 256, "Out msg nelems": 256,
                                           "Group size": 4, "Process Group Name": "3"}),
        _event("record_param_comms", 2.0, {"Collective name": "send", "dtype": "Half",
                                           "In msg nelems": 128, "Out msg nelems": 128,
                                           "Group size": 2, "Rank": 1}),
        _event("record_param_comms", 3.0, {"Collective name": "barrier", "dtype": "Float",
                                           "In msg nelems": 1, "Group size": 4}),
    ]
    path = tmp_path / "nccl_rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    from patterns.traces import read_traces
    trace = read_traces([str(path)])
    calls = trace.rank_calls(trace.ranks[0])
    assert [(c.op, c.numel, c.dtype, c.group_size, c.peer) for c in calls] == [
        ("allreduce", 256, "bf16", 4, None), ("send", 128, "fp16", 2, 1)]
    assert trace.unparsed == 1 and trace.unknown == {"record_param_comms barrier": 1}


def test_validate_refuses_missing_files_and_ranks_outside_the_layout(tmp_path: Path) -> None:
    from tests.replay_helpers import infercomm
    proc, _ = infercomm("validate", "--trace", str(tmp_path / "nope.log"), "--model",
                        "llama-3.1-8b", "--tp", "2", "--prompt", "4", "--decode", "2")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("infercomm validate: error: trace file ")
    path = tmp_path / "rank5.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 5}, "traceEvents": [
        _event("c10d::allreduce_", 1.0, {"Input Dims": [[[4, 4096]]],
                                         "Input type": ["TensorList"]})]}))
    proc, _ = infercomm("validate", "--trace", str(path), "--model", "llama-3.1-8b", "--tp",
                        "2", "--prompt", "4", "--decode", "2")
    assert proc.returncode == 2
    assert proc.stderr == ("infercomm validate: error: trace rank 5 (rank5 (rank5.json)) is "
                           "outside the layout's 2 ranks; pass the --tp/--pp/--dp the engine "
                           "ran with\n")


def test_validate_counts_steps_with_a_drafters_own_logits_gathers() -> None:
    """vLLM EAGLE at TP2, k = 2, every draft accepted (acceptance length 3), synchronous
    scheduling (as vLLM's CPU build runs it: tests/test_real_engine_vllm.py's eagle-tp2): one
    request of prompt 8, output 7 is a prefill and 2 verify steps (1 + 2 x 3 = 7); after each the
    drafter's 2 passes gather their own logits on the same group: 3 all-gathers a step.
    The trace's steps are its gathers / 3, not its gathers (9)."""
    from patterns import EngineOptions, Layout, resolve_model
    from patterns.engines.workloads import workload_pattern
    from patterns.speculative import parse_spec
    from patterns.traces.calls import Call, RankCalls, Trace
    from patterns.traces.validate import validate
    from patterns.workload.requests import Request
    spec = parse_spec('{"method": "eagle", "num_speculative_tokens": 2}', 3, None)
    pattern = workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                               [Request(0, 8, 7)], None, EngineOptions(
                                   model_runner="v1", async_scheduling=False), None, spec)
    trace = Trace()
    steps = [[trace.intern(Call(op.kind.value, op.numel, op.dtype, op.group_size))
              for op in run.step.ops] for run in pattern.stages[0] for _ in range(run.repeat)]
    assert [sum(trace.table[i].op == "allgather" for i in step) for step in steps] == [3] * 3
    for rank in range(2):
        trace.ranks.append(RankCalls(rank, f"rank{rank}"))
        for step in steps:
            trace.ranks[rank].ids.extend(step)
    assert validate(trace, pattern).steps == {0: (3, 3), 1: (3, 3)}
    trace.ranks[0].ids.extend(steps[-1])  # one verify step more, after the pattern's
    result = validate(trace, pattern)
    assert result.match and result.steps == {0: (4, 3), 1: (3, 3)}
