"""Pipeline stages: every tensor that crosses each step, in the engine's order, by hand.

vLLM @ c8109375: `v1/worker/gpu_worker.py:1064-1105` (irecv_tensor_dict before the model,
isend_tensor_dict after it), `distributed/parallel_state.py:1019-1198` (the metadata first,
`send_object` on gloo, 822-847: its pickled size as 1 int64, then the bytes; then each
tensor's TP slice
sent/received when tp divides it; every irecv posted first, the all-gathers in
`comm_postprocess`, run by `AsyncIntermediateTensors.wait_for_comm`, gpu_worker.py:96-125),
`v1/worker/gpu/pp_utils.py:35-50, 126-197` (Model Runner V2's sampled-token broadcasts on
the `pp_broadcast` group). SGLang @ 8905cbd4: `distributed/parallel_state.py:1530-1585`
(`recv_tensor_dict`: each recv waited on and all-gathered before the next key).
"""

from patterns.engines import generate
from patterns.layout import Layout, Workload
from patterns.models import resolve_model
from patterns.ops import OpKind
from patterns.pattern import EngineOptions

H = 2048  # llama-3.2-1b


def _step_ops(engine: str, stage: int, phase_index: int):
    model = resolve_model("llama-3.2-1b")
    pattern = generate(engine, model, Layout(tp=2, pp=2), Workload(prompt=8, decode=3),
                       EngineOptions(eager=True))
    return pattern.stages[stage][phase_index].step.ops


def test_vllm_stage1_receives_both_slices_then_gathers():
    ops = _step_ops("vllm", 1, 0)  # prefill of 8 tokens on the last stage
    # The metadata list pickled: 188 bytes for [8, 2048] bf16 on cuda (8 < 256 and 2048 <
    # 65,536: the dims of Llama-3.1-8B's [104, 4096], tests/test_engines.py pp_metadata).
    # Slice of [8, 2048] over tp 2: 8 * 2048 / 2 = 8192 elements per rank.
    head = [(op.kind, op.group, op.shape, op.tag) for op in ops[:6]]
    assert head == [
        (OpKind.RECV, "pp", (1,), "pp.metadata.size"),
        (OpKind.RECV, "pp", (188,), "pp.metadata"),
        (OpKind.RECV, "pp", (8192,), "pp.hidden_states"),
        (OpKind.RECV, "pp", (8192,), "pp.residual"),
        (OpKind.ALLGATHER, "tp", (8192,), "pp.hidden_states.allgather"),
        (OpKind.ALLGATHER, "tp", (8192,), "pp.residual.allgather"),
    ]
    assert all(op.out_shape == (8, H) for op in ops[4:6])
    # 16 layers split 8 + 8: 2 all-reduces a layer on stage 1, no embedding; then the
    # logits all-gather [1, 128256 / 2] and V2's two broadcasts from the last stage:
    # sampled tokens [1, 1] int64 and (num_sampled, num_rejected) [2, 1] int32.
    assert sum(op.kind == OpKind.ALLREDUCE for op in ops) == 2 * 8
    tail = [(op.kind, op.group, op.shape, op.dtype, op.tag) for op in ops[-3:]]
    assert tail == [
        (OpKind.ALLGATHER, "tp", (1, 64128), "bf16", "logits"),
        (OpKind.BROADCAST, "pp_broadcast", (1, 1), "int64", "pp_broadcast.sampled_tokens"),
        (OpKind.BROADCAST, "pp_broadcast", (2, 1), "int32",
         "pp_broadcast.num_sampled_rejected"),
    ]


def test_vllm_stage0_sends_slices_and_takes_the_broadcasts():
    ops = _step_ops("vllm", 0, 0)
    # embedding + 2 x 8 layers all-reduces, 2 sends of the 8192-element slices, then the
    # same 2 broadcasts as the last stage (every stage joins them).
    assert sum(op.kind == OpKind.ALLREDUCE for op in ops) == 1 + 2 * 8
    sends = [(op.shape, op.tag, op.peer) for op in ops if op.kind == OpKind.SEND]
    assert sends == [((1,), "pp.metadata.size", 1), ((188,), "pp.metadata", 1),
                     ((8192,), "pp.hidden_states", 1), ((8192,), "pp.residual", 1)]
    assert [op.tag for op in ops[-2:]] == ["pp_broadcast.sampled_tokens",
                                          "pp_broadcast.num_sampled_rejected"]


def test_sglang_stage1_gathers_each_slice_after_its_recv():
    ops = _step_ops("sglang", 1, 0)
    assert [op.tag for op in ops[:4]] == ["pp.hidden_states", "pp.hidden_states.allgather",
                                         "pp.residual", "pp.residual.allgather"]


def test_vllm_v2_broadcasts_in_every_decode_step_the_last_included():
    # Llama-3.1-8B TP2 x PP2, Model Runner V2 (its default for a dense model), prompt 8,
    # Sd 4: 1 prefill + 3 decode steps. `compute_need_sampled_mask` (v1/worker/gpu/
    # pp_utils.py:35-49 @ c8109375) keeps a request while max(old_computed, prefill_len)
    # + 1 < prompt + max_tokens = 12 (states.py:104), old_computed the tokens before the
    # step: prefill max(0, 8) + 1 = 9, decodes 8 + 1, 9 + 1, 10 + 1 = 11 < 12, the last
    # one too. So 4 pairs of broadcasts an inference on every stage, one a step.
    pattern = generate("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2, pp=2),
                       Workload(prompt=8, decode=4), EngineOptions())
    assert pattern.options.model_runner == "v2"
    for stage in (0, 1):
        per_step = [sum(op.kind == OpKind.BROADCAST for op in step.ops)
                    for _, step in pattern.steps(stage)]
        assert per_step == [2, 2, 2, 2]
