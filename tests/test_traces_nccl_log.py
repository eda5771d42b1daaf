"""NCCL / RCCL COLL logs, on lines printed with the exact format strings of NCCL's source.

Formats (NVIDIA/nccl, ROCm/rccl; file and line per tag):
- prefix: src/debug.cc `"%s:%d:%d [%d] NCCL INFO "` (v2.18.1-1:175; v2.30.7-1:330+354, where
  NCCL_DEBUG_TIMESTAMP_LEVELS can put `"[%F %T] "` before it, debug.cc:99).
- call: src/enqueue.cc `"%s: opCount %lx sendbuff %p recvbuff %p count %zi datatype %d op %d
  root %d comm %p [nranks=%d] stream %p"` (v2.18.1-1:1586, v2.21.5-1:2022; `%zu` at
  v2.27.7-1:2419 and v2.30.7-1:3152); RCCL (ROCm/rccl @ 0cbce2a7, src/enqueue.cc:2197) adds
  `" task %d globalrank %d"`.
- init: src/init.cc `"comm %p rank %d nranks %d cudaDev %d busId %lx commId 0x%llx - Init
  COMPLETE"` (v2.18.1-1:1326); `"ncclCommInitRank comm %p rank %d nranks %d cudaDev %d
  nvmlDev %d busId %lx commId 0x%llx - Init COMPLETE"` (v2.21.5-1:1573; `"%s comm ..."` with
  the function name at v2.27.7-1:1469 and v2.30.7-1:1945; RCCL init.cc:2095 adds `localSize
  %zi used %ld bytes on core %d` before ` - Init COMPLETE`).
- look-alikes: TUNING `"%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}"`
  (v2.30.7-1 enqueue.cc:822) and the TRACE line `"opCount %lx slicesteps %d spl %d cpl %d
  nbytes %zi -> protocol %d nchannels %d nthreads %d, nloops %d nsteps %d chunksize %d comm
  %p"` (v2.18.1-1 enqueue.cc:1394, prefix debug.cc:181 `"%s:%d:%d [%d] %f %s:%d NCCL TRACE "`).
"""

# The lines are printed with NCCL's printf formats kept verbatim (%d, %x, %s), not f-strings.
# ruff: noqa: UP031

import json
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm, last_json, tiny_model

COLL = ("%s: opCount %x sendbuff %s recvbuff %s count %d datatype %d op %d root %d comm %s "
        "[nranks=%d] stream %s")
RCCL_TAIL = " task %d globalrank %d"
INIT = {
    "v2.18.1-1": "comm %s rank %d nranks %d cudaDev %d busId %x commId 0x%x - Init COMPLETE",
    "v2.21.5-1": "ncclCommInitRank comm %s rank %d nranks %d cudaDev %d nvmlDev %d busId %x "
                 "commId 0x%x - Init COMPLETE",
    "v2.27.7-1": "%s comm %s rank %d nranks %d cudaDev %d nvmlDev %d busId %x commId 0x%x - "
                 "Init COMPLETE",
    "v2.30.7-1": "%s comm %s rank %d nranks %d cudaDev %d nvmlDev %d busId %x commId 0x%x - "
                 "Init COMPLETE",
    "rccl": "ncclCommInitRank comm %s rank %d nranks %d cudaDev %d nvmlDev %d busId %x commId "
            "0x%x localSize %d used %d bytes on core %d - Init COMPLETE",
}
VERSIONS = list(INIT)


def prefix(host: str, pid: int, dev: int, version: str) -> str:
    # v2.30 with NCCL_DEBUG_TIMESTAMP_LEVELS=INFO prints its default "[%F %T] " first
    stamp = "[2026-11-23 10:00:00] " if version == "v2.30.7-1" else ""
    return stamp + "%s:%d:%d [%d] NCCL INFO " % (host, pid, pid + 7, dev)


def init_line(version: str, pre: str, comm: str, rank: int, nranks: int, dev: int) -> str:
    fmt = INIT[version]
    if version == "v2.18.1-1":
        body = fmt % (comm, rank, nranks, dev, 0x1000 * (dev + 1), 0xABCDEF)
    elif version == "v2.21.5-1":
        body = fmt % (comm, rank, nranks, dev, dev, 0x1000 * (dev + 1), 0xABCDEF)
    elif version == "rccl":
        body = fmt % (comm, rank, nranks, dev, dev, 0x1000 * (dev + 1), 0xABCDEF, 2, 1024, 3)
    else:
        body = fmt % ("ncclCommInitRankConfig", comm, rank, nranks, dev, dev,
                      0x1000 * (dev + 1), 0xABCDEF)
    return pre + body


def coll_line(version: str, pre: str, op: str, count: int, dtype: int, root: int, comm: str,
              nranks: int, opcount: int, globalrank: int = 0) -> str:
    body = COLL % (op, opcount, "0x7f0000001000", "0x7f0000002000", count, dtype, 0, root,
                   comm, nranks, "0x55aa00")
    if version == "rccl":
        body += RCCL_TAIL % (opcount, globalrank)
    return pre + body


def lookalikes(pre: str, host: str, pid: int) -> list[str]:
    return [pre + "AllReduce: %d Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}"
            % (512, "RING", "LL", 0, 1),
            "%s:%d:%d [%d] %f %s:%d NCCL TRACE " % (host, pid, pid + 7, 0, 12.5, "computeColl",
                                                     1394)
            + "opCount %x slicesteps %d spl %d cpl %d nbytes %d -> protocol %d nchannels %d "
              "nthreads %d, nloops %d nsteps %d chunksize %d comm %s"
            % (3, 4, 1, 1, 512, 0, 2, 256, 1, 8, 131072, "0x55d0c0"),
            pre + "Channel 00/02 :    0   1"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_op_of_a_two_process_log(version: str, tmp_path: Path) -> None:
    lines = []
    for rank, (pid, comm) in enumerate(((4100, "0x55d0c0"), (4200, "0x56e1d0"))):
        pre = prefix("node-a", pid, rank, version)
        lines.append(init_line(version, pre, comm, rank, 2, rank))
        lines += lookalikes(pre, "node-a", pid)
        calls = [("AllReduce", 256, 9, 0), ("ReduceScatter", 32, 7, 0),
                 ("AllGather", 16, 6, 0), ("Broadcast", 8, 4, 0),
                 ("Send" if rank == 0 else "Recv", 128, 9, 1 - rank)]
        for i, (op, count, dtype, root) in enumerate(calls):
            lines.append(coll_line(version, pre, op, count, dtype, root, comm, 2, i, rank))
    path = tmp_path / "nccl.log"
    path.write_text("\n".join(lines) + "\n")
    proc, _ = infercomm("trace", str(path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    # 3 look-alike lines per process are not calls; init lines are read, not counted
    assert (doc["ranks"], doc["calls"], doc["unparsed"]) == (2, 10, 6)
    rows = [(r["rank"], r["op"], r["numel"], r["dtype"], r["group_size"], r["bytes"])
            for r in doc["rows"]]
    assert rows[:5] == [
        (0, "allreduce", 256, "bf16", 2, 512),  # datatype 9 = ncclBfloat16, 2 bytes
        (0, "reducescatter", 64, "fp32", 2, 256),  # count is the receive count: 32 x 2 ranks
        (0, "allgather", 16, "fp16", 2, 32),  # count is the send count
        (0, "broadcast", 8, "int64", 2, 64),
        (0, "send", 128, "bf16", 2, 256)]
    assert rows[9] == (1, "recv", 128, "bf16", 2, 256)


def test_communicators_told_apart_and_ranks_from_init_lines(tmp_path: Path) -> None:
    """One process in a TP comm of 2 and a world comm of 4: calls keep their comm's size;
    the process's rank is its rank in the largest comm (3), not its TP rank (1)."""
    version = "v2.21.5-1"
    pre = prefix("node-b", 77, 1, version)
    lines = [init_line(version, pre, "0x1111", 3, 4, 1), init_line(version, pre, "0x2222", 1, 2, 1),
             coll_line(version, pre, "AllReduce", 64, 9, 0, "0x2222", 2, 0),
             coll_line(version, pre, "AllReduce", 1, 7, 0, "0x1111", 4, 0)]
    path = tmp_path / "one.log"
    path.write_text("\n".join(lines) + "\n")
    doc = json.loads(infercomm("trace", str(path), "--format", "json")[0].stdout)
    assert [(r["rank"], r["group_size"], r["numel"], r["dtype"]) for r in doc["rows"]] == [
        (3, 2, 64, "bf16"), (3, 4, 1, "fp32")]


def test_rccl_globalrank_names_the_rank_without_init_lines(tmp_path: Path) -> None:
    """One RCCL process driving two GPUs: cudaDev tells them apart, globalrank numbers them."""
    lines = []
    for dev, grank in ((0, 5), (1, 4)):
        pre = prefix("mi300", 900, dev, "rccl")
        lines.append(coll_line("rccl", pre, "AllReduce", 10 + dev, 9, 0, f"0x90{dev}", 8, 0,
                               grank))
    path = tmp_path / "rccl.log"
    path.write_text("\n".join(lines) + "\n")
    doc = json.loads(infercomm("trace", str(path), "--format", "json")[0].stdout)
    assert [(r["rank"], r["numel"], r["group_size"]) for r in doc["rows"]] == [
        (4, 11, 8), (5, 10, 8)]


def test_a_log_without_calls_is_refused(tmp_path: Path) -> None:
    pre = prefix("node-a", 1, 0, "v2.27.7-1")
    path = tmp_path / "init-only.log"
    path.write_text("\n".join([init_line("v2.27.7-1", pre, "0x1", 0, 2, 0),
                               *lookalikes(pre, "node-a", 1)]) + "\n")
    proc, _ = infercomm("trace", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    # the refusal names what the file holds: the 3 look-alikes (TUNING, TRACE, channel)
    assert proc.stderr == (f"infercomm trace: error: {path}: no communication call found; "
                           "it holds other line x3; "
                           "expected NCCL/RCCL COLL lines (run with NCCL_DEBUG=INFO "
                           "NCCL_DEBUG_SUBSYS=COLL) or a Kineto JSON (.json/.json.gz from "
                           "torch.profiler) with c10d, record_param_comms or gloo:/nccl: events\n")


def _tp2_log(drop_gather_on_step: int | None = None) -> list[str]:
    """What two ranks of vLLM V0 print for the tiny model at TP2, prompt 4, decode 3: each
    step 9 all-reduces of T x 64 bf16, then the logits gather as torch issues it on NCCL
    (rank 0 receives 512 from rank 1, rank 1 sends 512 to rank 0); before it, one barrier
    all-reduce of 1 fp32 on a world communicator (engine start-up, not compared)."""
    version, lines = "v2.27.7-1", []
    for rank in (0, 1):
        pre = prefix("gpu-node", 300 + rank, rank, version)
        tp, world = f"0x7{rank}00", f"0x8{rank}00"
        lines += [init_line(version, pre, world, rank, 2, rank),
                  init_line(version, pre, tp, rank, 2, rank),
                  coll_line(version, pre, "AllReduce", 1, 7, 0, world, 2, 0)]
        for step, tokens in enumerate((4, 1, 1)):
            for i in range(9):
                lines.append(coll_line(version, pre, "AllReduce", tokens * 64, 9, 0, tp, 2, i))
            if step != drop_gather_on_step:
                op = "Recv" if rank == 0 else "Send"
                lines.append(coll_line(version, pre, op, 512, 9, 1 - rank, tp, 2, 9))
    return lines


def test_validate_an_nccl_log_with_gather_as_send_recv(tmp_path: Path) -> None:
    path = tmp_path / "tp2.log"
    path.write_text("\n".join(_tp2_log()) + "\n")
    model = tiny_model(tmp_path)
    args = ("validate", "--trace", str(path), "--model", model, "--tp", "2", "--prompt", "4",
            "--decode", "3", "--engine", "vllm-v0", "--eager")
    proc, _ = infercomm(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = last_json(proc.stdout)
    assert summary["match"] is True
    assert any("grouped Send/Recv" in n for n in summary["notes"])
    assert any("rank 0: 1 before, 0 after" in n for n in summary["notes"])  # the barrier

    path.write_text("\n".join(_tp2_log(drop_gather_on_step=1)) + "\n")
    proc, _ = infercomm(*args)
    assert proc.returncode == 1
    # after the barrier, step 0 is calls 1-10; step 1's 9 all-reduces are calls 11-19 and
    # its gather (call 20) is gone: the trace has step 2's first all-reduce there
    assert last_json(proc.stdout)["first_difference"] == (
        "rank 0: call 20 (decode step 1, op 9 of the step) differs: the trace has allreduce 64 "
        "x bf16 (group of 2), the pattern has recv 512 x bf16 (group of 2 peer 1) [logits]")


def test_replay_of_an_nccl_log_folds_the_grouped_gather(tmp_path: Path) -> None:
    """The TP2 log above, replayed on gloo: rank 0's Recv from 1 and rank 1's Send to 0 on
    the all-reduces' communicator are one gather (root 0) again, so both ranks issue the same
    calls; the barrier before the first step stays in the prefill step (the trace holds it)."""
    path = tmp_path / "tp2.log"
    path.write_text("\n".join(_tp2_log()) + "\n")
    proc, _ = infercomm("replay", "--trace", str(path), "--device", "cpu", "-n", "1", "-w",
                        "0", "--check", "--out", str(tmp_path / "results"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = last_json(proc.stdout)
    # prefill: barrier + 9 all-reduces + gather = 11; two decode steps of 10 (the period
    # that repeats at the end); 11 + 2 x 10 = 31
    assert summary["calls_per_inference"] == 31
    assert (summary["tp"], summary["pp"], summary["decode"], summary["wrong"]) == (2, 1, 3, 0)


def test_without_init_lines_ranks_follow_host_then_device(tmp_path: Path) -> None:
    """COLL only: the process on device 0 is rank 0 even when its pid is the larger."""
    version = "v2.18.1-1"
    lines = [coll_line(version, prefix("node-a", pid, dev, version), "AllReduce", count, 9, 0,
                       f"0x{pid}", 2, 0)
             for pid, dev, count in ((900, 1, 11), (500, 0, 22))]
    path = tmp_path / "coll-only.log"
    path.write_text("\n".join(lines) + "\n")
    doc = json.loads(infercomm("trace", str(path), "--format", "json")[0].stdout)
    assert [(r["rank"], r["numel"]) for r in doc["rows"]] == [(0, 22), (1, 11)]
