"""Which transport carries each all-reduce: engine spec 10.2's worked example and its edges.

Llama-3.1-8B in bf16 moves h * 2 = 4096 * 2 = 8 KiB per token, so T tokens are T * 8 KiB.
vLLM's limits (`patterns/transports.py`, read from vllm-project/vllm `all_reduce_utils.py`
@ 00d618aa and `allreduce_rms_fusion.py` @ 0052812d), on sm90 (H100):
  fused all-reduce + RMSNorm: T*8 KiB <= 64 MiB / 2 MiB / 0.5 MiB at TP 2 / 4 / 8
      -> T <= 8192 / 256 / 64
  custom all-reduce: T*8 KiB < min(64 MiB / 32 MiB / 256 KiB, 8 MiB) -> T < 1024 / 1024 / 32
  torch symm-mem: T*8 KiB <= 64 MiB / 32 MiB / 64 MiB -> T <= 8192 / 4096 / 8192
so spec 10.2's table: TP2: fused T <= 8192, NCCL above; TP4: fused <= 256, custom < 1024,
symm-mem up to 4096, NCCL above; TP8: fused <= 64, symm-mem up to 8192, NCCL above.
One edge differs from the spec's table ("T < 4096", "T < 8192"): `should_use_symm_mem`
takes sizes up to and including max_size (vllm symm_mem.py:117-125 @ c8109375), and the code
wins, so T = 4096 at TP4 and T = 8192 at TP8 still go through symm-mem.
"""

from collections import Counter

import pytest

from patterns import EngineOptions, Layout, Transport, Workload, generate, resolve_model
from patterns.engines.sglang.transports import sglang_allreduce, sglang_logits_allgather
from patterns.engines.vllm.transports import vllm_allreduce

TOKEN_BYTES = 4096 * 2
FUSED, CUSTOM, SYMM, NCCL = (Transport.FUSED_ALLREDUCE_RMSNORM, Transport.CUSTOM_ALLREDUCE,
                             Transport.SYMM_MEM, Transport.NCCL)

WORKED_EXAMPLE = [
    (2, 1, FUSED), (2, 8192, FUSED), (2, 8193, NCCL),
    (4, 256, FUSED), (4, 257, CUSTOM), (4, 1023, CUSTOM), (4, 1024, SYMM), (4, 4096, SYMM),
    (4, 4097, NCCL),
    (8, 64, FUSED), (8, 65, SYMM), (8, 8192, SYMM), (8, 8193, NCCL),
]


@pytest.mark.parametrize("tp, tokens, transport", WORKED_EXAMPLE)
def test_llama_8b_worked_example_on_h100(tp, tokens, transport):
    assert vllm_allreduce(tokens * TOKEN_BYTES, tp, "h100", "bf16", True, False) == transport


def test_without_a_following_rmsnorm_the_chain_decides():
    # Not fused: TP2 custom AR below min(64 MiB, 8 MiB) = 8 MiB -> T < 1024, then symm-mem
    # up to 64 MiB -> T <= 8192, then NCCL.
    assert vllm_allreduce(1023 * TOKEN_BYTES, 2, "h100", "bf16", False, False) == CUSTOM
    assert vllm_allreduce(1024 * TOKEN_BYTES, 2, "h100", "bf16", False, False) == SYMM
    assert vllm_allreduce(8192 * TOKEN_BYTES, 2, "h100", "bf16", False, False) == SYMM
    assert vllm_allreduce(8193 * TOKEN_BYTES, 2, "h100", "bf16", False, False) == NCCL


def test_other_gpus_and_dtypes():
    # B200 (sm100): fused up to 32 MiB at TP4 -> T <= 4096 (all_reduce_rms_fusion.py [100]).
    assert vllm_allreduce(4096 * TOKEN_BYTES, 4, "b200", "bf16", True, False) == FUSED
    # A100 (sm80): no fusion, no symm-mem table; custom AR's own 8 MiB -> T < 1024.
    assert vllm_allreduce(1 * TOKEN_BYTES, 2, "a100", "bf16", True, False) == CUSTOM
    assert vllm_allreduce(1024 * TOKEN_BYTES, 2, "a100", "bf16", True, False) == NCCL
    # fp16 (Llama-2): symm-mem takes bf16 only, so an unfused TP4 all-reduce of 2000 tokens
    # (2000 * 8 KiB = 15.6 MiB, over custom AR's 8 MiB) goes to NCCL, where bf16 would
    # use symm-mem.
    assert vllm_allreduce(2000 * TOKEN_BYTES, 4, "h100", "fp16", False, False) == NCCL
    assert vllm_allreduce(2000 * TOKEN_BYTES, 4, "h100", "bf16", False, False) == SYMM
    # TP3 is no custom-AR world size and has no symm-mem entry: NCCL.
    assert vllm_allreduce(1 * TOKEN_BYTES, 3, "h100", "bf16", False, False) == NCCL
    # --nccl-only (custom AR disabled, -O0) and TP1 are NCCL whatever the size.
    assert vllm_allreduce(1 * TOKEN_BYTES, 2, "h100", "bf16", True, True) == NCCL


def test_llama_8b_decode_never_reaches_nccl_under_vllm_defaults():
    # Spec 10.2: "decode steps never reach NCCL under vLLM's defaults"; batch 1 decodes are
    # T = 1: fused at TP 2, 4 and 8. 127 decode steps x 65 all-reduces = 8,255.
    model = resolve_model("llama-3.1-8b")
    for tp in (2, 4, 8):
        pattern = generate("vllm", model, Layout(tp=tp), Workload(128, 128))
        decode = next(r for r in pattern.stages[0] if r.phase == "decode")
        split = Counter(op.transport for op in decode.step.ops if op.kind == "allreduce")
        assert split == {FUSED: 65}, tp
        assert decode.repeat * 65 == 8255
    # The 128-token prefill: TP8 fuses only T <= 64, so its 65 all-reduces go to symm-mem.
    prefill = generate("vllm", model, Layout(tp=8), Workload(128, 128)).stages[0][0].step
    assert {op.transport for op in prefill.ops if op.kind == "allreduce"} == {SYMM}


def test_nccl_only_and_eager():
    model = resolve_model("llama-3.1-8b")
    seeds = generate("vllm", model, Layout(tp=2), Workload(128, 4), EngineOptions(nccl_only=True))
    assert {op.transport for r in seeds.stages[0] for op in r.step.ops} == {NCCL}
    # enforce_eager turns torch.compile off (vLLM config/vllm.py:1193-1199): nothing fused,
    # a T=1 decode all-reduce (8 KiB) goes to custom AR.
    eager = generate("vllm", model, Layout(tp=2), Workload(128, 4), EngineOptions(eager=True))
    assert {op.transport for op in eager.stages[0][1].step.ops if op.kind == "allreduce"} == {
        CUSTOM}


def test_sglang_rules():
    # CustomAllReduceV2 up to its 16 MiB workspace (sglang environ.py:750): 2048 tokens of
    # 8 KiB = 16 MiB is in, 2049 out.
    assert sglang_allreduce(2048 * TOKEN_BYTES, 2048, 2, "h100", "llama", False) == CUSTOM
    assert sglang_allreduce(2049 * TOKEN_BYTES, 2049, 2, "h100", "llama", False) == NCCL
    # Fusion only for the listed architectures (arg_groups/overrides.py:1514-1533), up to
    # FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048 tokens (layers/communicator.py:161).
    assert sglang_allreduce(TOKEN_BYTES, 1, 2, "h100", "qwen3_moe", False) == FUSED
    assert sglang_allreduce(2049 * 4096, 2049, 2, "h100", "qwen3_moe", False) == CUSTOM
    # Logits: multimem for bf16 up to 128 rows (triton_symm_mem_ag.py floor=128), not on A100.
    assert sglang_logits_allgather(128, "bf16", "h100", False) == Transport.MULTIMEM
    assert sglang_logits_allgather(129, "bf16", "h100", False) == NCCL
    assert sglang_logits_allgather(1, "fp16", "h100", False) == NCCL
    assert sglang_logits_allgather(1, "bf16", "a100", False) == NCCL
