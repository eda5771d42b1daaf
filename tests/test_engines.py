"""The vllm, sglang, trtllm and megatron profiles, call by call, against numbers worked out
by hand from the engines' code (each block names the file and commit it reads).

Models: Llama-3.1-8B (h 4096, L 32, V 128256 = 64 * 2004) and Qwen3-8B (h 4096, L 36,
V 151936 = 64 * 2374), bf16. Workload unless said: prompt 100, decode 3 (1 prefill step and
2 decode steps), batch 1. vLLM pads the 100-token prefill to the capture size 104
(range(8, 256, 8), vllm config/vllm.py:1782-1860 @ c8109375); a decode step has T = 1.
"""

from collections import Counter
from math import prod

import pytest

from patterns import (
    ConfigError,
    EngineOptions,
    Layout,
    Transport,
    Workload,
    from_hf_config,
    generate,
    resolve_model,
)
from patterns.engines.sglang import profile as sglang

FUSED, CUSTOM, NCCL, GLOO = (Transport.FUSED_ALLREDUCE_RMSNORM, Transport.CUSTOM_ALLREDUCE,
                             Transport.NCCL, Transport.GLOO)
MODELS = {"llama-3.1-8b": (32, 128256), "qwen3-8b": (36, 151936)}  # L, V (no 64-padding)


def pp_metadata(op: str) -> Counter:
    """vLLM's PP metadata a step, before the tensors (parallel_state.py:1051, 822-847 @
    c8109375): send_object on the gloo CPU group, the pickled list's size as 1 int64, then its
    188 bytes. [(hidden_states, TensorMetadata("cuda", torch.bfloat16, Size([T, 4096]))),
    (residual, ...)], T = 104 or 1 (< 256: 2 bytes a dim; 4096: 3): PROTO 2 + FRAME 9 +
    EMPTY_LIST 2 + MARK 1 + APPENDS 1 + STOP 1 = 16; the first entry: its key 2 + 13 + 1,
    the class 53 (3 + 31, 3 + 14, 2), "cuda" 7, torch.bfloat16 21 (8 + 11 + 2), torch.Size
    17 (8 + 7 + 2), the dims 2 + 3 + 2, then TUPLE1, REDUCE, TUPLE3, NEWOBJ, TUPLE2 with a
    MEMOIZE each, 10: 131; the second: key 2 + 8 + 1, 3 BINGETs of 2, "cuda" 7, dims 7, 10:
    41. 16 + 131 + 41 = 188."""
    return Counter({(op, "pp", (1,), (1,), "int64", GLOO): 1,
                    (op, "pp", (188,), (188,), "uint8", GLOO): 1})


def steps(engine, model, tp=1, pp=1, prompt=100, decode=3, batch=1, **options):
    pattern = generate(engine, resolve_model(model), Layout(tp=tp, pp=pp),
                       Workload(prompt, decode, batch), EngineOptions(**options))
    return pattern


def calls(step):
    """What a step issues, as a multiset of (op, group, shape, out_shape, dtype, transport)."""
    return Counter((op.kind.value, op.group, op.shape, op.out_shape, op.dtype, op.transport)
                   for op in step.ops)


def run_steps(pattern, stage):
    return [(run.phase.value, run.repeat, run.step) for run in pattern.stages[stage]]


# --- vLLM V1 (patterns/engines/vllm.py) --------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tp", [2, 4])
def test_vllm_tp(model, tp):
    layers, vocab = MODELS[model]
    p = steps("vllm", model, tp=tp)
    (pre_phase, pre_rep, pre), (dec_phase, dec_rep, dec) = run_steps(p, 0)
    assert (pre_phase, pre_rep, pre.tokens, pre.rows) == ("prefill", 1, 104, 1)
    assert (dec_phase, dec_rep, dec.tokens, dec.rows) == ("decode", 2, 1, 1)
    ar = 1 + 2 * layers  # embedding + o_proj and down_proj per layer
    # Every all-reduce feeds an RMSNorm and is at most 104 * 8 KiB = 832 KiB <= 2 MiB (TP4's
    # fusion limit): FlashInfer's fused kernel. Logits: all-gather [R, V/tp] -> [R, V], R = 1.
    for step, tokens in ((pre, 104), (dec, 1)):
        assert calls(step) == {
            ("allreduce", "tp", (tokens, 4096), (tokens, 4096), "bf16", FUSED): ar,
            ("allgather", "tp", (1, vocab // tp), (1, vocab), "bf16", NCCL): 1}


@pytest.mark.parametrize("model", MODELS)
def test_vllm_pp2_model_runner_v2(model):
    layers, _ = MODELS[model]
    p = steps("vllm", model, pp=2)
    assert p.options.model_runner == "v2"  # dense model: V2 by default (config/vllm.py:69-79)
    flat = (104 * 4096,)  # tp = 1: the "slice" is the whole flattened tensor
    # Model Runner V2 (v1/worker/gpu/pp_utils.py:126-197 @ c8109375): 2 broadcasts from the
    # last stage on `pp_broadcast`, sampled tokens [R, 1] int64 and [2, R] int32, skipped
    # when no request needs its sample later (compute_need_sampled_mask, pp_utils.py:35-49:
    # max(old_computed, prefill_len) + 1 < prompt + max_tokens, old_computed the tokens
    # before the step). Prompt 100, Sd 3: prefill 100 + 1 < 103; decode step 1: 100 + 1 <
    # 103; decode step 2, the last: old_computed 101, 102 < 103: all three broadcast.
    bcast = Counter({("broadcast", "pp_broadcast", (1, 1), (1, 1), "int64", NCCL): 1,
                     ("broadcast", "pp_broadcast", (2, 1), (2, 1), "int32", NCCL): 1})
    stage0, stage1 = run_steps(p, 0), run_steps(p, 1)
    assert [(ph, rep) for ph, rep, _ in stage0] == [("prefill", 1), ("decode", 2)]
    send, recv = pp_metadata("send") + bcast, pp_metadata("recv") + bcast
    assert calls(stage0[0][2]) == Counter({("send", "pp", flat, flat, "bf16", NCCL): 2}) + send
    assert calls(stage1[0][2]) == Counter({("recv", "pp", flat, flat, "bf16", NCCL): 2}) + recv
    one = (4096,)
    assert calls(stage0[1][2]) == Counter({("send", "pp", one, one, "bf16", NCCL): 2}) + send
    assert calls(stage1[1][2]) == Counter({("recv", "pp", one, one, "bf16", NCCL): 2}) + recv
    assert {op.root for op in stage0[0][2].ops if op.kind == "broadcast"} == {1}
    assert layers % 2 == 0  # 16/16 or 18/18 layers: nothing on the TP group at tp = 1


@pytest.mark.parametrize("async_on, broadcasts", [
    # Model Runner V1 + async scheduling, vLLM's default (v1/worker/gpu_model_runner.py:
    # 4582-4590, 4822-4837 @ c8109375): one broadcast of [R, 1] int32 on the PP group every
    # step that samples, the last one too.
    (None, [("pp", (1, 1), "int32")]), (True, [("pp", (1, 1), "int32")]),
    # --no-async-scheduling: the call sits under `if self.use_async_scheduling`: none.
    (False, []),
])
def test_vllm_model_runner_v1_broadcast(async_on, broadcasts):
    p = steps("vllm", "llama-3.1-8b", pp=2, model_runner="v1", async_scheduling=async_on)
    for stage in (0, 1):
        (_, _, pre), (_, rep, dec) = run_steps(p, stage)
        assert rep == 2
        for step in (pre, dec):
            assert [(op.group, op.shape, op.dtype) for op in step.ops
                    if op.kind == "broadcast"] == broadcasts


def test_vllm_chunked_prefill_broadcasts_and_rows():
    # Batch 2 x 100 tokens, budget 64: chunks [0,64) [64,128) [128,192) [192,200) hold
    # 1, 2, 1, 1 requests, of which 0, 1, 0, 1 finish their prompt. The capture cap is
    # min(2*1024, 512, 64) = 64, so 64 stays 64 and 8 stays 8. Logits rows R are the
    # scheduled requests, partial prefills included; broadcasts only where one finishes.
    p = steps("vllm", "llama-3.1-8b", tp=2, pp=2, batch=2, max_batched_tokens=64)
    last = [step for phase, _, step in run_steps(p, 1) if phase == "prefill"]
    assert [(s.tokens, s.rows) for s in last] == [(64, 1), (64, 2), (64, 1), (8, 1)]
    assert [sum(op.kind == "broadcast" for op in s.ops) for s in last] == [0, 2, 0, 2]
    assert [next(op.shape for op in s.ops if op.tag == "logits") for s in last] == [
        (1, 64128), (2, 64128), (1, 64128), (1, 64128)]


@pytest.mark.parametrize("model", MODELS)
def test_vllm_tp2_pp2(model):
    layers, vocab = MODELS[model]
    p = steps("vllm", model, tp=2, pp=2)
    half = layers // 2
    sliced = (104 * 4096 // 2,)  # tensor.reshape(tp, -1)[tp_rank]: [T*h/tp]
    (_, _, pre0), = [r for r in run_steps(p, 0) if r[0] == "prefill"]
    (_, _, pre1), = [r for r in run_steps(p, 1) if r[0] == "prefill"]
    c0, c1 = calls(pre0), calls(pre1)
    # Stage 0: embedding + 2 per layer; the last layer's down_proj feeds the PP send, not an
    # RMSNorm, so the fusion pass leaves it to the chain: 832 KiB < 8 MiB -> custom AR.
    assert c0[("allreduce", "tp", (104, 4096), (104, 4096), "bf16", FUSED)] == 1 + 2 * half - 1
    assert c0[("allreduce", "tp", (104, 4096), (104, 4096), "bf16", CUSTOM)] == 1
    assert c0[("send", "pp", sliced, sliced, "bf16", NCCL)] == 2
    assert c0 & pp_metadata("send") == pp_metadata("send")
    assert [op.tag for op in pre0.ops if op.kind == "send"] == [
        "pp.metadata.size", "pp.metadata", "pp.hidden_states", "pp.residual"]
    unfused = [op.tag for op in pre0.ops if op.transport == CUSTOM]
    assert unfused == [f"layers.{half - 1}.mlp.down_proj"]
    # Stage 1: the metadata (recv_object, parallel_state.py:1148 @ c8109375), 2 recvs, then a
    # TP all-gather of each back to [T, h] (irecv_tensor_dict posts both irecvs first:
    # 1114-1198), 2 per layer (no embedding), the logits all-gather.
    assert c1 & pp_metadata("recv") == pp_metadata("recv")
    assert c1[("recv", "pp", sliced, sliced, "bf16", NCCL)] == 2
    assert c1[("allgather", "tp", sliced, (104, 4096), "bf16", NCCL)] == 2
    assert c1[("allreduce", "tp", (104, 4096), (104, 4096), "bf16", FUSED)] == 2 * half
    assert c1[("allgather", "tp", (1, vocab // 2), (1, vocab), "bf16", NCCL)] == 1
    assert [op.tag for op in pre1.ops[:6]] == ["pp.metadata.size", "pp.metadata",
                                               "pp.hidden_states", "pp.residual",
                                               "pp.hidden_states.allgather",
                                               "pp.residual.allgather"]


# --- CUDA-graph padding at batch 10 and 260 ---------------------------------------------

def decode_tokens(engine, batch, tp=2, **options):
    p = steps(engine, "llama-3.1-8b", tp=tp, prompt=16, decode=2, batch=batch, **options)
    step = next(run.step for run in p.stages[0] if run.phase == "decode")
    return step.tokens, next(op.shape for op in step.ops if op.kind == "allreduce")


def test_graph_padding_at_batch_10_and_260():
    # vllm: [1,2,4] + range(8,256,8) + range(256,513,16) (config/vllm.py:1782-1860): 10 -> 16,
    # 260 -> 272. vllm-v0: [1,2,4] + multiples of 8: 260 -> 264 (patterns/vllm_rules.py).
    assert decode_tokens("vllm", 10) == (16, (16, 4096))
    assert decode_tokens("vllm", 260) == (272, (272, 4096))
    assert decode_tokens("vllm-v0", 260) == (264, (264, 4096))
    # sglang (server_args.py:4179-4206, max_bs 256 at TP < 4, 512 at TP >= 4 on H100,
    # :3922-3931): 10 -> 12; 260 runs unpadded at TP2 and as 272 at TP4.
    assert decode_tokens("sglang", 10) == (12, (12, 4096))
    # SGLang's decode graph also computes the logits of the padded rows, sliced afterwards
    # (model_executor/runner/decode_cuda_graph_runner.py:1265-1283): all-gather [12, V/2].
    p = steps("sglang", "llama-3.1-8b", tp=2, prompt=16, decode=2, batch=10)
    decode = next(r.step for r in p.stages[0] if r.phase == "decode")
    assert (decode.ops[-1].shape, decode.rows) == ((12, 64128), 10)
    # ... but samples the 10 real rows: with PP the last stage sends back [10] ids.
    p = steps("sglang", "llama-3.1-8b", tp=2, pp=2, prompt=16, decode=2, batch=10)
    decode = next(r.step for r in p.stages[1] if r.phase == "decode")
    assert [(op.tag, op.shape) for op in decode.ops[-2:]] == [("logits", (12, 64128)),
                                                               ("pp.next_token_ids", (10,))]
    assert decode_tokens("sglang", 260) == (260, (260, 4096))
    assert decode_tokens("sglang", 260, tp=4) == (272, (272, 4096))
    # trtllm (llm_args.py BaseCudaGraphConfig @ fcd3f316: enable_padding False; graphs of
    # 1..31, 32, 64, 128): 10 replays the graph of 10, 260 runs eagerly.
    assert decode_tokens("trtllm", 10) == (10, (10, 4096))
    assert decode_tokens("trtllm", 260) == (260, (260, 4096))
    # megatron static batching: no graphs, [s=1, b, h].
    assert decode_tokens("megatron", 10) == (10, (1, 10, 4096))
    assert decode_tokens("megatron", 260) == (260, (1, 260, 4096))
    # --eager: nobody pads.
    assert decode_tokens("vllm", 10, eager=True) == (10, (10, 4096))
    assert decode_tokens("sglang", 10, eager=True) == (10, (10, 4096))


def test_sglang_graph_sizes_and_b200():
    # server_args.py:3946-3948: B200 takes max_bs 512 at any TP, and chunks of 16384.
    assert sglang.decode_graph_sizes(2, "b200")[-1] == 512
    assert decode_tokens("sglang", 260, gpu="b200") == (272, (272, 4096))
    assert sglang.chunked_prefill_size("b200") == 16384
    # Prefill ladder (server_args.py:4232-4249): 100 tokens -> 112 (48..256 step 16).
    p = steps("sglang", "llama-3.1-8b", tp=2)
    assert p.stages[0][0].step.tokens == 112


# --- SGLang (patterns/engines/sglang.py) ------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
def test_sglang_tp2_and_pp(model):
    layers, vocab = MODELS[model]
    p = steps("sglang", model, tp=2)
    (_, _, pre), (_, rep, dec) = run_steps(p, 0)
    # Llama/Qwen3 are not in the fusion list: custom AR V2 (<= 16 MiB); the 1-row logits
    # all-gather through the multimem kernel (<= 128 rows, bf16).
    assert calls(pre) == {("allreduce", "tp", (112, 4096), (112, 4096), "bf16", CUSTOM):
                          1 + 2 * layers,
                          ("allgather", "tp", (1, vocab // 2), (1, vocab), "bf16",
                           Transport.MULTIMEM): 1}
    assert (rep, dec.tokens) == (2, 1)
    # PP: vLLM's slice + all-gather, and the sampled ids [S] int64 back from the last stage.
    p = steps("sglang", model, tp=2, pp=2)
    pre1 = p.stages[1][0].step
    sliced = (112 * 4096 // 2,)
    assert calls(pre1)[("allgather", "tp", sliced, (112, 4096), "bf16", NCCL)] == 2
    assert [(op.kind.value, op.shape, op.dtype, op.peer) for op in pre1.ops[-1:]] == [
        ("send", (1,), "int64", 0)]
    assert [(op.kind.value, op.peer) for op in p.stages[0][0].step.ops[-1:]] == [("recv", 1)]


def test_sglang_control_plane_is_gloo():
    p = steps("sglang", "llama-3.1-8b", tp=2, control_plane=True)
    first = p.stages[0][0].step.ops[0]
    assert (first.kind.value, first.shape, first.dtype, first.transport, first.root) == (
        "broadcast", (1,), "int64", Transport.GLOO, 0)


# --- TensorRT-LLM (patterns/engines/trtllm.py) ------------------------------------------

@pytest.mark.parametrize("model", MODELS)
def test_trtllm_tp_and_unsliced_pp(model):
    layers, vocab = MODELS[model]
    p = steps("trtllm", model, tp=4)
    (_, _, pre), (_, _, dec) = run_steps(p, 0)
    # No padding: T = 100. LM head COLUMN + gather_output: [S, ceil(V/4)] -> [S, 4*ceil(V/4)].
    assert calls(pre) == {("allreduce", "tp", (100, 4096), (100, 4096), "bf16", NCCL):
                          1 + 2 * layers,
                          ("allgather", "tp", (1, vocab // 4), (1, vocab), "bf16", NCCL): 1}
    assert dec.tokens == 1
    # TP2 x PP2: 2 whole [T, h] tensors per boundary, no slice, no all-gather after the recv
    # (modeling_utils.py pp_recv_tensors([hidden_states, residual])).
    p = steps("trtllm", model, tp=2, pp=2)
    c0, c1 = calls(p.stages[0][0].step), calls(p.stages[1][0].step)
    assert c0[("send", "pp", (100, 4096), (100, 4096), "bf16", NCCL)] == 2
    assert c1[("recv", "pp", (100, 4096), (100, 4096), "bf16", NCCL)] == 2
    assert [k for k in c1 if k[0] == "allgather"] == [
        ("allgather", "tp", (1, vocab // 2), (1, vocab), "bf16", NCCL)]
    assert c0[("allreduce", "tp", (100, 4096), (100, 4096), "bf16", NCCL)] == 1 + layers
    assert c1[("allreduce", "tp", (100, 4096), (100, 4096), "bf16", NCCL)] == layers


# --- Megatron (patterns/engines/megatron/profile.py) --------------------------------------
# megatron-core 0.19.2, core/inference/text_generation_controllers/text_generation_controller.py
# (generate_all_output_tokens_static_batch) and core/models/gpt/gpt_model.py 739-745.

@pytest.mark.parametrize("model", MODELS)
def test_megatron_tp_pp(model):
    layers, vocab = MODELS[model]
    # Vocabulary padded to a multiple of 128 * tp (_vocab_size_with_padding): Llama 128256 at
    # TP2 -> multiple of 256: 128256 = 256 * 501, no padding; Qwen3 151936 = 256 * 593.5 ->
    # 152064 (256 * 594).
    padded = {"llama-3.1-8b": 128256, "qwen3-8b": 152064}[model]
    p = steps("megatron", model, tp=2)
    (_, _, pre), (_, _, dec) = run_steps(p, 0)
    assert calls(pre) == {
        ("allreduce", "tp", (100, 1, 4096), (100, 1, 4096), "bf16", NCCL): 1 + 2 * layers,
        # the static prefill cuts the hidden states to the last position (gpt_model.py
        # 744-745): the logits all-gather carries [1, b, V/tp], not all s = 100 positions
        ("allgather", "tp", (1, 1, padded // 2), (1, 1, padded), "bf16", NCCL): 1}
    assert calls(dec)[("allgather", "tp", (1, 1, padded // 2), (1, 1, padded), "bf16",
                       NCCL)] == 1
    # PP2: one [s, b, h] tensor per boundary, then the logits [b, 1, V] broadcast from the
    # last stage over the PP group (controller lines 3569-3582), every stage, every step. At
    # TP1 V pads to a multiple of 128: 128256 = 128 * 1002 and 151936 = 128 * 1187, unpadded.
    p = steps("megatron", model, pp=2)
    bcast = ("broadcast", "pp", (1, 1, vocab), (1, 1, vocab), "bf16", NCCL)
    for stage, p2p in ((0, "send"), (1, "recv")):
        for _, _, step in run_steps(p, stage):
            shape = (step.tokens, 1, 4096)
            assert calls(step) == {(p2p, "pp", shape, shape, "bf16", NCCL): 1, bcast: 1}
            assert step.ops[-1].root == 1  # the last stage's rank in the PP group


def test_megatron_return_log_probs_gathers_every_prompt_position():
    # return_log_probs: materialize_only_last_token_logits is False in the prefill
    # (controller lines 3546-3553): the prefill gathers [s, b, V/tp] and, at PP2, broadcasts
    # [b, s, V]; decode steps still carry one position. Llama-3.1-8B TP2 x PP2, prompt 128,
    # batch 2: gather [128, 2, 64128] -> [128, 2, 128256]; broadcast [2, 128, 128256].
    p = steps("megatron", "llama-3.1-8b", tp=2, pp=2, prompt=128, decode=4, batch=2,
              return_log_probs=True)
    (_, _, pre), (_, repeat, dec) = run_steps(p, 1)
    assert calls(pre)[("allgather", "tp", (128, 2, 64128), (128, 2, 128256), "bf16",
                       NCCL)] == 1
    assert calls(pre)[("broadcast", "pp", (2, 128, 128256), (2, 128, 128256), "bf16",
                       NCCL)] == 1
    assert repeat == 3 and calls(dec)[("allgather", "tp", (1, 2, 64128), (1, 2, 128256),
                                       "bf16", NCCL)] == 1
    (_, _, pre0), _ = run_steps(p, 0)
    assert calls(pre0)[("broadcast", "pp", (2, 128, 128256), (2, 128, 128256), "bf16",
                        NCCL)] == 1


@pytest.mark.parametrize("tp, prompt, decode", [(2, 128, 1), (2, 128, 4), (1, 16, 2)])
def test_megatron_refuses_sequence_parallel_for_dense_models(tp, prompt, decode):
    # controller lines 3483-3486: sequence_parallel with ep 1 raises NotImplementedError
    # ("Sequence parallellism is only supported for static batching with MoE models").
    with pytest.raises(ConfigError, match=r"--sp: Megatron's static engine refuses sequence "
                                          r"parallelism for the dense model llama-3.1-8b"):
        steps("megatron", "llama-3.1-8b", tp=tp, prompt=prompt, decode=decode, sp=True)


def test_options_a_profile_does_not_read_are_refused():
    with pytest.raises(ConfigError, match="--sp does not apply to engine vllm; it applies to "
                                          "megatron"):
        steps("vllm", "llama-3.1-8b", tp=2, sp=True)
    with pytest.raises(ConfigError, match="--model-runner does not apply to engine sglang"):
        steps("sglang", "llama-3.1-8b", tp=2, model_runner="v1")
    with pytest.raises(ConfigError, match="gpu 'v100' is not modelled"):
        EngineOptions(gpu="v100")


# --- Vocabulary padding of each engine ---------------------------------------------------

def test_vocabulary_padding(tmp_path):
    # A vocabulary of 50257 (GPT-2's), h 512, 4 layers, TP2:
    #   vllm / sglang / vllm-v0: pad_vocab_size(50257, 64) = 64 * 786 = 50304 -> 25152 a rank
    #   trtllm: ceil(50257 / 2) = 25129 a rank -> 50258 gathered
    #   megatron: multiple of 128 * 2 = 256: 256 * 197 = 50432 -> 25216 a rank
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 512, "num_hidden_layers": 4, "vocab_size": 50257, '
                      '"num_attention_heads": 8, "num_key_value_heads": 8, '
                      '"torch_dtype": "bfloat16"}')
    model = from_hf_config(config)
    expected = {"vllm": (25152, 50304), "sglang": (25152, 50304), "vllm-v0": (25152, 50304),
                "trtllm": (25129, 50258), "megatron": (25216, 50432)}
    for engine, (shard, full) in expected.items():
        p = generate(engine, model, Layout(tp=2), Workload(8, 2))
        logits = p.stages[0][0].step.ops[-1]
        assert (logits.shape[-1], logits.out_shape[-1]) == (shard, full), engine
    # Megatron at TP4 rounds 128256 to a multiple of 512: 128512, 32128 a rank (spec 1); the
    # prefill gathers the last position only.
    p = steps("megatron", "llama-3.1-8b", tp=4, prompt=8, decode=2)
    assert p.stages[0][0].step.ops[-1].shape == (1, 1, 32128)


# --- Whole-inference numbers --------------------------------------------------------------

def test_deepseek_v3_all_reduces_per_step():
    # Spec section 6: DeepSeek-V3 at TP8 without EP, 1 + 2 * 61 = 123 all-reduces a step
    # (3 dense layers reduce down_proj, 58 MoE layers the experts' sum); the MTP layer does not
    # run without speculative decoding.
    p = steps("vllm", "deepseek-v3", tp=8, prompt=16, decode=2)
    step = p.stages[0][0].step
    tags = [op.tag for op in step.ops if op.kind == "allreduce"]
    assert len(tags) == 123
    assert tags[1:7] == ["layers.0.self_attn.o_proj", "layers.0.mlp.down_proj",
                         "layers.1.self_attn.o_proj", "layers.1.mlp.down_proj",
                         "layers.2.self_attn.o_proj", "layers.2.mlp.down_proj"]
    assert tags[8] == "layers.3.mlp.experts"
    assert sum(t.endswith("mlp.experts") for t in tags) == 58
    # DeepseekV3ForCausalLM is not in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
    # (config/vllm.py:69-79): Model Runner V1.
    assert p.options.model_runner == "v1"
    assert prod(step.ops[-1].out_shape) == 129280


# --- Every profile at TP2, TP4, PP2, TP2xPP2 on both models: calls per stage and step ------
# Counts by op kind for one rank of each stage, prefill step then decode step (prompt 100,
# decode 3, batch 1; L = 32 or 36; at PP2 each stage holds L/2 layers of 2 all-reduces, so
# stage 0 issues 1 + 2*(L/2) = 1 + L and stage 1 issues L):
#   sglang  TPn: allreduce 1 + 2L, allgather 1 (logits)
#           PP2: stage 0 send 2 + recv 1 (sampled ids back from the last stage),
#                stage 1 recv 2 + send 1
#           TP2xPP2: stage 0 allreduce 1 + L, send 2, recv 1;
#                    stage 1 recv 2, allgather 2 (PP) + 1 (logits), allreduce L, send 1
#   trtllm  TPn: allreduce 1 + 2L, allgather 1; PP2: send 2 / recv 2 (whole [T, h]);
#           TP2xPP2: stage 0 allreduce 1 + L, send 2; stage 1 recv 2, allreduce L,
#                    allgather 1
#   megatron TPn: allreduce 1 + 2L, allgather 1; PP2: send 1 / recv 1, and on every stage
#           the logits broadcast 1 from the last stage;
#           TP2xPP2: stage 0 allreduce 1 + L, send 1, broadcast 1; stage 1 recv 1,
#                    allreduce L, allgather 1, broadcast 1
def expected_counts(engine, layers, tp, pp):
    if pp == 1:
        return [{"allreduce": 1 + 2 * layers, "allgather": 1}]
    if engine == "sglang":
        if tp == 1:
            return [{"send": 2, "recv": 1}, {"recv": 2, "send": 1}]
        return [{"allreduce": 1 + layers, "send": 2, "recv": 1},
                {"recv": 2, "allgather": 3, "allreduce": layers, "send": 1}]
    sends = 2 if engine == "trtllm" else 1
    logits = {"broadcast": 1} if engine == "megatron" else {}
    if tp == 1:
        return [{"send": sends, **logits}, {"recv": sends, **logits}]
    return [{"allreduce": 1 + layers, "send": sends, **logits},
            {"recv": sends, "allreduce": layers, "allgather": 1, **logits}]


@pytest.mark.parametrize("engine", ["sglang", "trtllm", "megatron"])
@pytest.mark.parametrize("tp, pp", [(2, 1), (4, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("model", MODELS)
def test_profile_matrix(engine, tp, pp, model):
    layers, _ = MODELS[model]
    p = steps(engine, model, tp=tp, pp=pp)
    for stage, expected in enumerate(expected_counts(engine, layers, tp, pp)):
        for phase in ("prefill", "decode"):
            step = next(r.step for r in p.stages[stage] if r.phase == phase)
            got = Counter(op.kind.value for op in step.ops)
            assert got == expected, (stage, phase)
            # T: sglang pads 100 -> 112 and decodes at 1; the others run 100 and 1.
            tokens = {("sglang", "prefill"): 112}.get((engine, phase),
                                                      100 if phase == "prefill" else 1)
            assert step.tokens == tokens


def test_vllm_a100_defaults():
    # vllm engine/arg_utils.py:2529-2551 @ c8109375: A100s take max_num_batched_tokens 2048
    # and max_num_seqs 256. A 3000-token prompt runs as chunks of 2048 and 952; the capture
    # cap is min(2*256, 512, 2048) = 512, so 952 runs unpadded.
    p = steps("vllm", "llama-3.1-8b", tp=2, prompt=3000, gpu="a100")
    assert [r.step.tokens for r in p.stages[0] if r.phase == "prefill"] == [2048, 952]
    with pytest.raises(ConfigError, match=r"batch\(260\) exceeds max-num-seqs\(256\)"):
        steps("vllm", "llama-3.1-8b", tp=2, batch=260, gpu="a100")
    # H100: one 3000-token step (under 8192), above the cap of 512: unpadded.
    p = steps("vllm", "llama-3.1-8b", tp=2, prompt=3000)
    assert [r.step.tokens for r in p.stages[0] if r.phase == "prefill"] == [3000]
