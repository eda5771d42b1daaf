"""Trace files that are not what `trace`, `validate` and `replay --trace` expect: each is
refused in one line naming what is wrong, exit status 2, no traceback (the faults an outside
battery found: logs of separate runs together, a sparse 2 GB file, negative counts, one log
twice, a damaged .json.gz, Kineto fields of the wrong type, JSON nested 100,000 deep, a
directory or FIFO as a trace); and a `replay --trace` run read back by `report`."""

import gzip
import json
import os
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm

# NCCL v2.27.7-1 src/enqueue.cc:2419 COLL line with the src/debug.cc prefix
LINE = ("{host}:{pid}:{tid} [{dev}] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f01 recvbuff "
        "0x7f02 count {count} datatype 9 op 0 root 0 comm {comm} [nranks=2] stream 0x55aa\n")


def tp2_log(path: Path, host: str, count: int = 8) -> Path:
    path.write_text(LINE.format(host=host, pid=11, tid=12, dev=0, count=count, comm="0x11")
                    + LINE.format(host=host, pid=21, tid=22, dev=1, count=count, comm="0x22"))
    return path


def refused(*args: str, says: str) -> None:
    out, _ = infercomm(*args)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, \
        out.stderr
    assert says in out.stderr, out.stderr


def test_two_tp2_runs_are_not_one_tp2_pp2(tmp_path: Path) -> None:
    # item 5: 4 processes, no communicator of more than 2 ranks, no send/recv
    # (`trace` reads them and says so: DP replicas whose DP traffic is on gloo look alike)
    a, b = tp2_log(tmp_path / "a.log", "node-a"), tp2_log(tmp_path / "b.log", "node-b")
    out, _ = infercomm("trace", str(a), str(b))
    assert out.returncode == 0 and "separate runs" in out.stdout, out.stdout + out.stderr
    refused("replay", "--trace", str(a), str(b), "--out", str(tmp_path / "r"),
            says="separate runs")
    refused("validate", "--trace", str(a), str(b), "--model", "llama-3.2-1b", "--tp", "2",
            "--pp", "2", "--prompt", "4", "--decode", "1", says="separate runs")
    assert not (tmp_path / "r").exists()


def test_sparse_2gb_file_refused_without_reading_it(tmp_path: Path) -> None:
    # item 7: a 2 GiB hole reads as NUL bytes; only the first MiB is looked at
    sparse = tmp_path / "sparse.log"
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)
    refused("trace", str(sparse), says="NUL bytes")


def test_negative_count_refused(tmp_path: Path) -> None:
    # item 10
    log = tp2_log(tmp_path / "neg.log", "node-a", count=-5)
    refused("replay", "--trace", str(log), "--out", str(tmp_path / "r"), says="negative count")


def test_same_log_twice_refused(tmp_path: Path) -> None:
    # item 11: the same path twice, and a copy of it (the same processes again)
    log = tp2_log(tmp_path / "a.log", "node-a")
    refused("validate", "--trace", str(log), str(log), "--model", "llama-3.2-1b", "--tp", "2",
            "--prompt", "4", "--decode", "1",
            says="given twice")
    copy = tmp_path / "copy.log"
    copy.write_text(log.read_text())
    refused("trace", str(log), str(copy), says="given twice")


@pytest.mark.parametrize("case", ["gz", "args-list", "dims-int", "type-dict", "pg-junk",
                                  "name-list", "deep"])
def test_broken_kineto_refused(tmp_path: Path, case: str) -> None:
    # item 13
    path = tmp_path / ("t.json.gz" if case == "gz" else "t.json")
    if case == "gz":
        path.write_bytes(gzip.compress(b'{"traceEvents": []}' * 100)[:30] + b"\x00junk")
    elif case == "deep":
        path.write_text('{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    else:
        event = {"ph": "X", "name": "c10d::allreduce_", "ts": 1,
                 "args": {"Input Dims": [[4]], "Input type": ["float"]}}
        doc: dict = {"traceEvents": [event]}
        if case == "args-list":
            event["args"] = [1]
        elif case == "dims-int":
            event["args"]["Input Dims"] = 5
        elif case == "type-dict":
            event["args"]["Input type"] = {"0": "float"}
        elif case == "pg-junk":
            doc["distributedInfo"] = {"rank": 0, "pg_config": "junk"}
        else:
            doc["traceEvents"] = [{"ph": "X", "name": "record_param_comms", "ts": 1, "args": {
                "Collective name": ["allreduce"], "dtype": "Float", "In msg nelems": 4}}]
        path.write_text(json.dumps(doc))
    refused("trace", str(path), says=path.name)


def test_directory_and_fifo_are_not_missing_files(tmp_path: Path) -> None:
    # item 15: named for what they are, not "does not exist"
    refused("trace", str(tmp_path), says="is a directory")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused("trace", str(fifo), says="not a regular file")


def test_report_of_a_trace_replay(tmp_path: Path) -> None:
    # item 15: report (and predict --against) of a `replay --trace` run read its meta.json,
    # whose pattern fields are null: no NoneType error
    log = tp2_log(tmp_path / "a.log", "node-a")
    out, _ = infercomm("replay", "--trace", str(log), "--iters", "2", "--warmup", "1",
                       "--out", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr
    run = next((tmp_path / "runs").iterdir())
    out, _ = infercomm("report", str(run), "-o", str(tmp_path / "r.html"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert (tmp_path / "r.html").stat().st_size > 0
    sweep = Path(__file__).parents[1] / "results" / "examples" / "samples" / \
        "20261122T035613Z-sweep-torch-gloo-w2"
    out, _ = infercomm("predict", "--sweep", str(sweep), "--against", str(run))
    # the trace is read again for its pattern: measured beside predicted, exit 0
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "measured/predicted" in out.stdout, out.stdout
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["model"] == "trace" and last["tp"] == 2 and "prefill_us" in last["measured"]
    # with pattern options the options are priced, even where the trace is gone
    log.unlink()
    out, _ = infercomm("predict", "--sweep", str(sweep), "--against", str(run),
                       "--model", "llama-3.2-1b", "--tp", "2", "--prompt", "8", "--decode", "4")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["model"] == "llama-3.2-1b"
    out, _ = infercomm("predict", "--sweep", str(sweep), "--against", str(run))
    assert out.returncode == 2 and "which is not here" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_replay_of_a_trace_without_sizes_refused(tmp_path: Path) -> None:
    # DeepEP kernels only (tests/fixtures/traces): counted, nothing with a size to replay
    fixture = Path(__file__).parent / "fixtures" / "traces" / "kineto_deepep_kernels_rank0.json"
    refused("replay", "--trace", str(fixture), "--out", str(tmp_path / "a"),
            says="no call with a size")
    # a trace recorded without shapes: c10d::allreduce_ and nccl:all_reduce with no args
    events = [{"ph": "X", "name": n, "cat": "cpu_op", "ts": t, "dur": 1}
              for t, n in enumerate(["c10d::allreduce_", "nccl:all_reduce"] * 2)]
    path = tmp_path / "noshapes.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    refused("replay", "--trace", str(path), "--out", str(tmp_path / "b"),
            says="record_shapes=True")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
