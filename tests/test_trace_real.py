"""Real Kineto traces of other projects (../shared/real_traces, see its README; never copied
into the repository): every call, rank and size `infercomm trace` reads is compared with what
was counted by hand from the file (jq / a few lines of Python outside the project, over the
events named in each test). The tests skip where ../shared/real_traces is absent."""

import json
from collections import Counter
from pathlib import Path

import pytest

from patterns.traces import read_traces
from patterns.traces.kineto import NO_SHAPES
from patterns.traces.summary import trace_rows
from tests.replay_helpers import infercomm

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "real_traces"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/real_traces is absent")


def counted(name: str) -> tuple[Counter, set[int], object]:
    """(op, numel, dtype) -> calls, the ranks, and the Trace."""
    trace = read_traces([str(REAL / name)])
    calls: Counter = Counter()
    for row in trace_rows(trace):
        calls[(row["op"], row["numel"], row["dtype"])] += row["calls"]
    return calls, {r.rank for r in trace.ranks}, trace


def test_vllm_v1_gptoss120b_tp8_prefill() -> None:
    # Counted from the file: cpu_op events named vllm::all_reduce, by Input Dims: 37 of
    # [888, 2880] (the attention's o_proj output) and 36 of [888, 3072] (the MoE output,
    # padded); one vllm::all_gather of [1, 25136] with Concrete Inputs world_size "8".
    # 888 * 2880 = 2,557,440; 888 * 3072 = 2,727,936. The c10d::_allgather_base_,
    # record_param_comms and nccl:_all_gather_base nested in the all-gather are the same call.
    calls, ranks, trace = counted("vllm_gptoss120b_tp8_b200_prefill888_rank0.json.gz")
    assert calls == {("allreduce", 2_557_440, "bf16"): 37, ("allreduce", 2_727_936, "bf16"): 36,
                     ("allgather", 25_136, "bf16"): 1}
    assert ranks == {0}  # distributedInfo.rank
    # every call in the group of 8 (distributedInfo.pg_config: the groups of more than one
    # rank are all [0..7])
    assert {c.group_size for c in trace.table} == {8}


def test_resnet_ddp2_record_param_comms() -> None:
    # record_param_comms with Collective name: allreduce Float of 2049000, 7875584, 6563840,
    # 6637568 and 2431040 elements, 3 each (3 profiler steps); broadcast Float 53120 and Long
    # 53, 3 each; Group size 2. 5 * 3 + 2 * 3 = 21 = the 15 nccl:all_reduce + 6
    # nccl:broadcast user annotations. The 6 "wait" records are not calls.
    calls, ranks, trace = counted("hta_resnet_ddp2_nccl2171_rank0.json.gz")
    expected = {("allreduce", n, "fp32"): 3 for n in (2_049_000, 7_875_584, 6_563_840,
                                                      6_637_568, 2_431_040)}
    expected |= {("broadcast", 53_120, "fp32"): 3, ("broadcast", 53, "int64"): 3}
    assert calls == expected and ranks == {0}
    # ... and are not "not understood" either
    assert "record_param_comms wait" not in trace.unknown and trace.unparsed == 0


@pytest.mark.parametrize("rank", [0, 1])
def test_job128_sampled_old_kineto(rank: int) -> None:
    # torch ~2.0: record_param_comms carry no Collective name and c10d::allreduce_ a
    # TensorList without dims; the sizes are in the user_annotation nccl:* events (10 each):
    # rank 0: nccl:all_reduce [[19618307]] [[26258430]] [[26955536]] [[5716654]] float, once
    # each; nccl:all_to_all [[2846720]] int, [[384]] long, [[419430400]] unsigned char x2;
    # nccl:_all_gather_base [[16777216]] signed char x2. 4 + 4 + 2 = 10.
    # rank 1: all_reduce 19618307 x2, 26258430, 5716654; all_to_all 2846720 int, 384 long,
    # 339738624 and 394073856 unsigned char; _all_gather_base 16777216 x2. 4 + 4 + 2 = 10.
    calls, ranks, _ = counted(f"hta_job128_sampled_rank{rank}.json.gz")
    if rank == 0:
        expected = {("allreduce", n, "fp32"): 1 for n in (19_618_307, 26_258_430, 26_955_536,
                                                          5_716_654)}
        expected |= {("alltoall", 419_430_400, "uint8"): 2}
    else:
        expected = {("allreduce", 19_618_307, "fp32"): 2, ("allreduce", 26_258_430, "fp32"): 1,
                    ("allreduce", 5_716_654, "fp32"): 1, ("alltoall", 339_738_624, "uint8"): 1,
                    ("alltoall", 394_073_856, "uint8"): 1}
    expected |= {("alltoall", 2_846_720, "int32"): 1, ("alltoall", 384, "int64"): 1,
                 ("allgather", 16_777_216, "int8"): 2}
    assert calls == expected and ranks == {rank}
    assert sum(calls.values()) == 10


def test_job16_fsdp_reduce_scatter_all_gather_all_to_all() -> None:
    # 85 user_annotation nccl:* events: _all_gather_base [[8192, 384]] and [[8192, 64]] float,
    # 5 each (8192 * 384 = 3,145,728; 8192 * 64 = 524,288); _reduce_scatter_base [[65536,
    # 384]] and [[65536, 64]], 5 each (the input: 25,165,824 and 4,194,304); all_reduce
    # 366336 and 447923396, 5 each; all_to_all: ten sizes 5 times each (float 0, 262144,
    # 2883584, 3145728, 524288; int 0, 32768, 360448; long 48, 64) and five int ones once
    # (655421, 685701, 689144, 689849, 702356). 20 + 10 + 50 + 5 = 85.
    calls, ranks, _ = counted("hta_job16_fsdp_a2a_rank0.json.gz")
    five = {("allgather", 3_145_728, "fp32"), ("allgather", 524_288, "fp32"),
            ("reducescatter", 25_165_824, "fp32"), ("reducescatter", 4_194_304, "fp32"),
            ("allreduce", 366_336, "fp32"), ("allreduce", 447_923_396, "fp32")}
    five |= {("alltoall", n, "fp32") for n in (0, 262_144, 2_883_584, 3_145_728, 524_288)}
    five |= {("alltoall", n, "int32") for n in (0, 32_768, 360_448)}
    five |= {("alltoall", n, "int64") for n in (48, 64)}
    expected = {key: 5 for key in five}
    expected |= {("alltoall", n, "int32"): 1 for n in (655_421, 685_701, 689_144, 689_849,
                                                       702_356)}
    assert calls == expected and ranks == {0}
    assert sum(calls.values()) == 85


def test_job8_all_to_all_only_as_nccl_annotations() -> None:
    # torch 1.12/1.13: nccl:all_reduce [[45310188]], [[4432073]], [[267040]] float, 6 each
    # (18, as many as the c10d::allreduce_ whose TensorList has no dims); nccl:all_to_all
    # float [[72605696]] and [[8, 1024, 8816]] (8 * 1024 * 8816 = 72,220,672), int
    # [[1002496]] and [[1024]], 6 each, and 18 of one call each. 18 + 24 + 18 = 60.
    calls, ranks, _ = counted("hta_job8_a2a_allreduce_rank3_2022.json.gz")
    assert ranks == {3}
    assert sum(calls.values()) == 60
    for n in (45_310_188, 4_432_073, 267_040):
        assert calls[("allreduce", n, "fp32")] == 6
    assert calls[("alltoall", 72_605_696, "fp32")] == 6
    assert calls[("alltoall", 72_220_672, "fp32")] == 6
    assert calls[("alltoall", 1_002_496, "int32")] == 6
    assert calls[("alltoall", 1_024, "int32")] == 6
    assert sum(v for (op, _, _), v in calls.items() if op == "alltoall") == 42


def test_ddp2_without_shapes_counts_calls_and_says_record_shapes() -> None:
    # 2020 nccl:all_reduce user annotations (and 2020 c10d::allreduce_), none with args:
    # recorded without shapes. Rank 1 (distributedInfo).
    calls, ranks, trace = counted("hta_ddp2_noshapes_rank1_2022.json.gz")
    assert calls == {("allreduce", 0, "unknown"): 2020} and ranks == {1}
    assert NO_SHAPES in trace.notes
    out, _ = infercomm("trace", str(REAL / "hta_ddp2_noshapes_rank1_2022.json.gz"))
    assert out.returncode == 0 and "record_shapes=True" in out.stdout


def test_deepseek_v3_deepep_kernels_named() -> None:
    # kernel events: dpsk::ep::internode::dispatch<false, 8, true, 8> x4 and <false, 8,
    # false, 8> x4; dpsk::ep::internode::combine<...> x8. notify_dispatch (4),
    # get_dispatch_layout (4) and cached_notify (12) are bookkeeping, not the all-to-all.
    out, _ = infercomm("trace", "--format", "json",
                    str(REAL / "deepseek_v3_train_ep64_deepep_rank0.json"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["ep_kernels"] == {"EP dispatch": 8, "EP combine": 8}
    assert doc["calls"] == 0


def test_validate_matches_the_vllm_v1_trace() -> None:
    # the 74 calls above against vLLM's profile of gpt-oss-120b at TP8 on B200 with the
    # padded MoE output (3072 = 2880 rounded up to a multiple of 256): exit 0, 74 calls read
    out, _ = infercomm("validate", "--trace",
                       str(REAL / "vllm_gptoss120b_tp8_b200_prefill888_rank0.json.gz"),
                       "--model", "gpt-oss-120b", "--tp", "8", "--prompt", "888", "--decode",
                       "1", "--gpu", "b200", "--eager", "--moe-backend",
                       "flashinfer-trtllm-padded", "--ranks", "0")  # rank 0 of eight
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["match"] is True and doc["calls"] == 74
