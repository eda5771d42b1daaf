"""DeepSeek-V2/V3 under TP > 1 and DP > 1 with expert parallelism in vLLM: the model's own
sequence-parallel path (modal-projects/vllm @ c8109375, `model_executor/models/
deepseek_v2.py:1244-1266` no attention all-reduce, `1298-1360` the input all-gather and the
attention reduce-scatter, `408-426` no all-gather after the experts, `1474-1508` the final
all-gather of [hidden, residual]), by hand. Qwen3-MoE keeps the generic path."""

from patterns.engines import generate
from patterns.layout import Layout, Workload
from patterns.models import resolve_model
from patterns.ops import Phase
from patterns.pattern import EngineOptions


def _decode(model: str, layout: Layout, batch: int, **options):
    pattern = generate("vllm", resolve_model(model), layout, Workload(16, 2, batch=batch),
                       EngineOptions(**options))
    return [run for run in pattern.stages[0]
            if run.phase != Phase.WAVE_TAIL][-1].step  # the wave's tail: test_dp_wave.py


def _rows(ops, prefix):
    return [(op.kind.value, op.group, op.shape, op.out_shape) for op in ops
            if op.tag.startswith(prefix)]


def test_deepseek_v3_sequence_parallel_layers_tp2_dp2():
    # --moe-backend deep-gemm: fp8 dispatch with scales (FlashInfer CUTLASS, vLLM's default
    # on an H100 with --ep, dispatches bf16 without them: fp8_moe.py).
    step = _decode("deepseek-v3", Layout(tp=2, dp=2, ep=True), batch=6, moe_backend="deep-gemm")
    # Decode of 6 requests: capture size 8 on both DP ranks (T = 8); chunk 8 / 2 = 4 rows;
    # EP group dp x tp = 4 ranks gathers 4 x 4 = 16 rows. h = 7168, top-k 8.
    assert step.tokens == 8
    layer4 = _rows(step.ops, "layers.4.")
    assert layer4 == [
        # the previous MoE layer left [4, h]: all-gathered after input_layernorm
        ("allgather", "tp", (4, 7168), (8, 7168)),
        # the attention output reduce-scattered, in place of the o_proj all-reduce
        ("reducescatter", "tp", (8, 7168), (4, 7168)),
        ("allgather", "ep", (4, 7168), (16, 7168)),
        ("allgather", "ep", (4, 8), (16, 8)),
        ("allgather", "ep", (4, 8), (16, 8)),
        # block-fp8 checkpoint: 7168 / 128 = 56 fp32 scales a token gathered too
        ("allgather", "ep", (4, 56), (16, 56)),
        # the combine; no TP all-gather after it: the layer ends with [4, h]
        ("reducescatter", "ep", (16, 7168), (4, 7168)),
    ]
    # Layer 3 (first MoE) gets a full-length input from dense layer 2: no input all-gather.
    assert _rows(step.ops, "layers.3.")[0] == ("reducescatter", "tp", (8, 7168), (4, 7168))
    # Dense layers keep their two all-reduces of [8, h].
    assert _rows(step.ops, "layers.2.") == [("allreduce", "tp", (8, 7168), (8, 7168))] * 2
    # After layer 60: [hidden, residual] concatenated, [4, 2h] -> [8, 2h], then the logits.
    assert _rows(step.ops, "norm.") == [("allgather", "tp", (4, 14336), (8, 14336))]
    assert step.ops[-1].tag == "logits"


def test_odd_token_count_pads_to_a_multiple_of_tp():
    # Eager: T stays 3 (a batch of 3 decodes); 3 padded to 4 over tp 2 -> chunks of 2.
    pattern = generate("vllm", resolve_model("deepseek-v3"), Layout(tp=2, dp=2, ep=True),
                       Workload(16, 2, batch=3), EngineOptions(eager=True))
    step = [run for run in pattern.stages[0]
            if run.phase != Phase.WAVE_TAIL][-1].step  # the wave's tail: test_dp_wave.py
    assert step.tokens == 3
    assert _rows(step.ops, "layers.5.")[:2] == [("allgather", "tp", (2, 7168), (4, 7168)),
                                               ("reducescatter", "tp", (4, 7168), (2, 7168))]


def test_qwen3_moe_keeps_attention_allreduce_and_moe_allgather():
    step = _decode("qwen3-30b-a3b", Layout(tp=2, dp=2, ep=True), batch=6)
    rows = _rows(step.ops, "layers.1.")
    assert rows[0] == ("allreduce", "tp", (8, 2048), (8, 2048))
    assert rows[-1] == ("allgather", "tp", (4, 2048), (8, 2048))
    assert not _rows(step.ops, "norm.")
