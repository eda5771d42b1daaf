"""The trace formats of tests/fixtures/traces (see its README for the source of each): RCCL
2.27's `acc` field, RCCL driving several GPUs from one process, lines cut into one another
by concurrent writers, NCCL 2.32's new operations, torch <= 2.1 Kineto and DeepEP kernels."""

from collections import Counter
from pathlib import Path

from patterns.traces import Call, read_traces
from patterns.traces.summary import trace_rows

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def counted(*names: str) -> tuple[Counter, object]:
    trace = read_traces([str(FIXTURES / n) for n in names])
    calls: Counter = Counter()
    for row in trace_rows(trace):
        calls[(row["rank"], row["op"], row["numel"], row["dtype"], row["group_size"])] += \
            row["calls"]
    return calls, trace


def test_rccl_2277_lines_with_acc() -> None:
    # 2 processes x 3 steps x (2 all-reduces of 4096 + 1 all-gather of 32000), datatype 9
    # (bf16), nranks=2; ranks from globalrank 0 and 1. 2 x 3 x 3 = 18 calls; the 6 TUNING
    # lines (one per process and step) are not calls.
    calls, trace = counted("rccl_2277_tp2.log")
    assert calls == {(r, "allreduce", 4096, "bf16", 2): 6 for r in (0, 1)} | {
        (r, "allgather", 32000, "bf16", 2): 3 for r in (0, 1)}
    assert trace.unparsed == 6


def test_rccl_one_process_four_gpus_ranked_by_globalrank() -> None:
    # one pid, cudaDev d prints globalrank 3 - d; 2 fp32 all-reduces of 1024 per rank
    calls, trace = counted("rccl_single_process_4gpu.log")
    assert calls == {(r, "allreduce", 1024, "fp32", 4): 2 for r in range(4)}
    by_rank = {r.rank: r.name for r in trace.ranks}
    assert by_rank[0].startswith("mi250-1:9300:3")  # device 3 is globalrank 0
    assert by_rank[3].startswith("mi250-1:9300:0")


def test_interleaved_lines_recover_both_calls() -> None:
    # 4 all-reduces of 8192 bf16 per rank; rank 1's third call sits behind rank 0's
    # fragment, rank 0's third call is the fragment joined to the next line: 8 calls, none lost
    calls, trace = counted("nccl_interleaved_tp2.log")
    assert calls == {(r, "allreduce", 8192, "bf16", 2): 4 for r in (0, 1)}
    assert trace.unparsed == 0
    assert [r.name for r in trace.ranks] == ["node-a:501:0", "node-a:502:1"]


def test_nccl_232_new_ops_named() -> None:
    # per rank: 2 AllReduce of 1024 fp32 read; AllGatherV, PutSignal, WaitSignal named
    calls, trace = counted("nccl_232_new_ops.log")
    assert calls == {(r, "allreduce", 1024, "fp32", 2): 2 for r in (0, 1)}
    names = {k.split(" ")[0]: v for k, v in trace.unknown.items()}
    assert names == {"AllGatherV": 2, "PutSignal": 2, "WaitSignal": 2}


def test_torch113_kineto_sizes_from_nccl_annotations() -> None:
    # 2 steps x (all-reduces of 4432073 and 267040 fp32 + one all-to-all of 8 * 1024 *
    # 8816 = 72,220,672 fp32); rank 3 (distributedInfo); no process-group table, so the
    # group is the job: distributedInfo's world_size 8
    calls, trace = counted("kineto_torch113_nccl_rank3.json")
    assert calls == {(3, "allreduce", 4_432_073, "fp32", 8): 2,
                     (3, "allreduce", 267_040, "fp32", 8): 2,
                     (3, "alltoall", 72_220_672, "fp32", 8): 2}
    assert trace.ranks[0].step_starts == [0, 3]


def test_deepep_kernels_counted() -> None:
    # dispatch: dpsk::ep::internode, deep_ep::intranode, deep_ep::internode_ll (3);
    # combine likewise (3); notify_dispatch, get_dispatch_layout, cached_notify are not counted
    calls, trace = counted("kineto_deepep_kernels_rank0.json")
    assert calls == {}
    assert trace.ep_kernels == {"EP dispatch": 3, "EP combine": 3}


def test_launcher_prefixes_still_read(tmp_path: Path) -> None:
    # The prefixes launchers put before NCCL's own (src/debug.cc "%s:%d:%d [%d] NCCL INFO "):
    # Ray's "(RayTrainWorker pid=N, ip=A) ", `srun -l`'s "T: ", NCCL 2.30's "[%F %T] "
    # timestamp; and a TUNING line (v2.30.7-1 enqueue.cc:822), which is no call.
    call = ("gpu-{r}:{pid}:{pid}9 [0] NCCL INFO AllReduce: opCount {n} sendbuff 0x7f01 "
            "recvbuff 0x7f02 count 2048 datatype 9 op 0 root 0 comm 0x5{r} [nranks=2] "
            "stream 0x55aa\n")
    lines = []
    for n in range(3):
        lines.append(f"(RayTrainWorker pid=311, ip=10.0.0.7) [2026-11-24 08:00:0{n}] "
                     + call.format(r=0, pid=311, n=n))
        lines.append("1: " + call.format(r=1, pid=412, n=n))
    lines.append("1: gpu-1:412:4129 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL "
                 "channel{Lo..Hi}={0..1}\n")
    (tmp_path / "mixed.log").write_text("".join(lines))
    trace = read_traces([str(tmp_path / "mixed.log")])
    # 3 all-reduces of 2048 bf16 per process; hosts gpu-0 < gpu-1 give ranks 0 and 1
    assert [(r.rank, r.name, len(r.ids)) for r in trace.ranks] == [
        (0, "gpu-0:311:0", 3), (1, "gpu-1:412:0", 3)]
    assert trace.table[trace.ranks[0].ids[0]].describe() == "allreduce 2048 x bf16 (group of 2)"
    assert trace.unparsed == 1


def test_vllm_reduce_scatter_and_fused_op(tmp_path: Path) -> None:
    # vllm/distributed/parallel_state.py @ 0c175ae9: reduce_scatter(tensor, dim, world_size,
    # group_name) -> the cpu_op vllm::reduce_scatter with Concrete Inputs ["", dim,
    # world_size, ""] (as the real V1 trace writes vllm::all_gather's: ["", "-1", "8", ""]).
    # Input [16, 4096] bf16 over 4 ranks: 16 * 4096 = 65,536 elements in, group of 4. The
    # fused matmul + reduce-scatter op is named, not sized.
    import json
    events = [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 2, "args": {},
               "name": "vllm::patched_fused_scaled_matmul_reduce_scatter"},
              {"ph": "X", "cat": "cpu_op", "name": "vllm::reduce_scatter", "ts": 5, "dur": 3,
               "args": {"Input Dims": [[16, 4096], [], [], []],
                        "Input type": ["c10::BFloat16", "Scalar", "Scalar", ""],
                        "Concrete Inputs": ["", "0", "4", ""]}},
              # what the op runs inside its span: the same call, not another
              {"ph": "X", "cat": "cpu_op", "name": "c10d::_reduce_scatter_base_", "ts": 6,
               "dur": 1, "args": {"Input Dims": [[4, 4096], [16, 4096], [], [], []],
                                  "Input type": ["c10::BFloat16", "c10::BFloat16", "", "",
                                                 "Scalar"]}}]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    trace = read_traces([str(path)])
    assert [trace.table[i] for i in trace.ranks[0].ids] == [
        Call(op="reducescatter", numel=65_536, dtype="bf16", group_size=4)]
    assert list(trace.unknown) == ["vllm::patched_fused_scaled_matmul_reduce_scatter (vLLM "
                                   "matmul fused with a collective, not sized)"]
