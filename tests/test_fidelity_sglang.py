"""SGLang's all-reduce + RMSNorm fusion: which all-reduces it leaves unfused (modal-projects/
sglang @ 8905cbd4): the embedding's (VocabParallelEmbedding's own all-reduce) and the last
layer's MLP/MoE all-reduce (`layers/communicator.py:773-818`
`should_fuse_mlp_allreduce_with_next_layer`: `not self.is_last_layer`; `models/qwen3_moe.py:
792` sets is_last_layer for layer num_hidden_layers - 1, whose experts' output is then
all-reduced plainly, `qwen3_moe.py:330-337`)."""

from collections import Counter

from patterns.engines import generate
from patterns.layout import Layout, Workload
from patterns.models import resolve_model
from patterns.ops import OpKind, Transport
from patterns.pattern import EngineOptions


def _prefill(model_name: str, gpu: str = "h100"):
    model = resolve_model(model_name)
    pattern = generate("sglang", model, Layout(tp=4), Workload(prompt=16, decode=1),
                       EngineOptions(eager=True, gpu=gpu))
    return [op for op in pattern.stages[0][0].step.ops if op.kind == OpKind.ALLREDUCE]


def test_qwen3_moe_leaves_embedding_and_last_moe_allreduce_unfused():
    ops = _prefill("qwen3-30b-a3b")
    # 1 embedding + 48 layers x (o_proj + experts) = 97 all-reduces of [16, 2048].
    assert len(ops) == 97
    by_transport = Counter(op.transport for op in ops)
    # Fused: 48 attention outputs + 47 MoE outputs (layers 0..46) = 95. Unfused: the
    # embedding and layer 47's experts; 16 x 2048 x 2 B = 64 KiB <= 16 MiB: custom AR V2.
    assert by_transport == {Transport.FUSED_ALLREDUCE_RMSNORM: 95,
                            Transport.CUSTOM_ALLREDUCE: 2}
    unfused = [op.tag for op in ops if op.transport == Transport.CUSTOM_ALLREDUCE]
    assert unfused == ["embed_tokens", "layers.47.mlp.experts"]


def test_no_fusion_on_a100_or_for_dense_llama():
    # sm80 has no FlashInfer fusion; Llama is not in the fusion architectures.
    assert {op.transport for op in _prefill("qwen3-30b-a3b", "a100")} == {
        Transport.CUSTOM_ALLREDUCE}
    assert {op.transport for op in _prefill("llama-3.1-8b")} == {Transport.CUSTOM_ALLREDUCE}


def _dp_logits(batch: int, gpu: str):
    model = resolve_model("qwen3-30b-a3b")
    pattern = generate("sglang", model, Layout(tp=2, dp=2, ep=True),
                       Workload(prompt=16, decode=3, batch=batch), EngineOptions(gpu=gpu))
    return [(run.phase.value, op.shape, op.transport) for run in pattern.stages[0]
            for op in run.step.ops if op.tag == "logits"]


def test_dp_attention_logits_allgather_goes_through_multimem():
    # logits_processor.py:357-361, 376-381, 706-710 @ 8905cbd4: with enable_dp_lm_head off the
    # DP-attention logits all-gather is the MultimemAllGatherer's, bf16 and <= 128 rows on
    # sm90+. Vocabulary 151936 over the 4 ranks: 37984 columns each. Prefill: the 2 ranks'
    # 4 last tokens summed, 8 rows; decode (MAX_LEN): ceil(4 / 2) = 2 rows a rank x 4 = 8.
    assert _dp_logits(4, "h100") == [("prefill", (8, 37984), Transport.MULTIMEM),
                                     ("decode", (8, 37984), Transport.MULTIMEM)]
    # No multicast on A100: NCCL.
    assert {t for _, _, t in _dp_logits(4, "a100")} == {Transport.NCCL}
    # 80 requests a rank: prefill 160 rows > 128 -> NCCL; decode 40 x 4 = 160 rows -> NCCL.
    assert _dp_logits(80, "h100") == [("prefill", (160, 37984), Transport.NCCL),
                                      ("decode", (160, 37984), Transport.NCCL)]
