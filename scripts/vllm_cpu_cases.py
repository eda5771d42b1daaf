"""The cases `vllm_cpu_oracle.py` serves: tiny models' shapes, the workloads, the engine
settings of each case (CASES: the ones `make test` runs; PROBES: combinations run by hand,
listed in docs/real-engine.md) and the disaggregated pairs (NIXL_CASES)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

# The tiny models: head size 64 (a size vLLM's CPU attention kernels take), vocabulary
# 256 = 4 x 64 (vLLM pads its vocabulary to a multiple of 64: nothing is padded at tp 2, 4).
HIDDEN, HEADS, LAYERS, VOCAB = 128, 4, 2, 256
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
              num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
              head_dim=HIDDEN // HEADS, max_position_embeddings=512, tie_word_embeddings=False)


@dataclass(frozen=True)
class Workload:
    """Requests (prompt tokens, output tokens), all queued before the first step."""

    name: str
    requests: tuple[tuple[int, int], ...]
    ids: tuple[int, ...] | None = None  # the prompt's tokens, then 0s: one prefix_id (shared)
    zeros: int = 0  # the last `zeros` tokens of every prompt are 0 (ngram finds its drafts)
    as_batch: bool = False  # equal requests: validate as --batch N, not --requests


@dataclass(frozen=True)
class Case:
    model: str  # "dense", "moe", "qwen3" or "zero-head" (a dense model whose every logit is 0)
    engine: dict  # vllm.LLM keyword arguments beyond the common ones
    workloads: tuple[Workload, ...]
    bind: str = "0|1"  # VLLM_CPU_OMP_THREADS_BIND: one core list a worker
    validate: tuple[str, ...] = ()  # further `infercomm validate` options
    eagle_head: bool = False  # write an EAGLE draft head, the speculative_config's "model"
    config: dict = field(default_factory=dict)  # the model config's keys beyond COMMON


ONE = Workload("one-request", ((5, 3),))
# max_num_batched_tokens 16, max_num_seqs 2: a 40-token prompt is prefilled in chunks of 16
# beside a short request; 3 requests wait for 2 slots; a long and a short request.
SCHEDULED = dict(max_num_batched_tokens=16, max_num_seqs=2)
WORKLOADS = (
    Workload("chunked", ((40, 3), (6, 4))),
    Workload("queued", ((7, 3), (5, 2), (9, 3))),
    Workload("lengths", ((12, 2), (3, 5))),
)
# two equal requests whose prompts are chunked, validated as --batch 2
BATCH_CHUNKED = Workload("batch-chunked", ((12, 3),) * 2, as_batch=True)
# one 200-token prompt twice, chunked by 16: the second, admitted beside the first's last
# chunk, finds its first block of 128 (the CPU build's) cached. Its ids start no other prompt
# (the engine keeps its cache across workloads; the others' request 0 is 1, 2, 3...)
SHARED_PREFIX = Workload("shared-prefix", ((200, 2),) * 2, ids=tuple(range(200, 0, -1)))

# 3 layers by hybrid_override_pattern: 8 Mamba heads of 16 (intermediate 128), one group
NEMOTRON_H = dict(hybrid_override_pattern="M*-", mamba_num_heads=8, mamba_head_dim=16,
                  n_groups=1, ssm_state_size=16)

CASES: dict[str, Case] = {
    "dense-tp2": Case("dense", dict(tensor_parallel_size=2, **SCHEDULED),
                      (ONE, *WORKLOADS, BATCH_CHUNKED, SHARED_PREFIX)),
    "moe-tp2": Case("moe", dict(tensor_parallel_size=2, **SCHEDULED), (ONE, WORKLOADS[0])),
    # the CPU worker skips its warm-up forward pass without compilation (cpu_worker.py
    # _should_warm_up_model; enforce_eager means no compilation), and only that pass
    # allocates the last stage's buffers for the tensors it receives (gpu_model_runner.py
    # _dummy_run): a dynamo trace run eagerly, no enforce_eager (the CPU build captures no
    # CUDA graph either way: platforms/cpu.py empties cudagraph_capture_sizes)
    # `overlap`: a decode beside a chunked prompt, with 2 batches in flight (the batch queue)
    "dense-pp2": Case("dense", dict(pipeline_parallel_size=2, **SCHEDULED, enforce_eager=False,
                                    compilation_config={"mode": 2, "backend": "eager"}),
                      (ONE, Workload("overlap", ((3, 5), (40, 2))))),
    # ngram speculation, k = 2, made exact: every logit of the model is 0, so greedy
    # sampling always picks token 0; the prompt ends in zeros, so the proposer always finds
    # the newest token earlier and drafts 0, 0, and every draft is accepted: each verify
    # step checks 1 + 2 tokens and yields 3 (acceptance length 3); output 7 = 1 + 2 x 3
    "ngram-tp2": Case("zero-head", dict(tensor_parallel_size=2, speculative_config={
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
        "prompt_lookup_max": 2}), (Workload("one-request", ((8, 7),), (5, 6, 7, 0, 0, 0, 0, 0)),),
        validate=("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
                  "--acceptance-length", "3")),
    # EAGLE, k = 2, made exact the same way: the draft head (write_eagle_head: one random
    # Llama layer) has no lm_head of its own, so vLLM gives it the target's, whose every
    # logit is 0: the drafter proposes 0, 0, the target samples 0 and accepts both; prompt
    # 8, output 7 = 1 + 2 x 3 (acceptance length 3), whatever the prompt
    "eagle-tp2": Case("zero-head", dict(tensor_parallel_size=2, speculative_config={
        "method": "eagle", "num_speculative_tokens": 2}), (Workload("one-request", ((8, 7),)),),
        eagle_head=True, validate=("--speculative-config", '{"method": "eagle", '
                                   '"num_speculative_tokens": 2}', "--acceptance-length", "3")),
    # 4 workers on 2 cores: two a core
    "dense-tp4": Case("dense", dict(tensor_parallel_size=4, **SCHEDULED), (ONE,),
                      bind="0|0|1|1"),
    # Nemotron-H, a Mamba-2 hybrid: Mamba-2, attention and MLP layers (the CPU build has no
    # kernel for its non-gated relu2 experts, so no E layer); n_groups 1, so each Mamba layer
    # also all-reduces its gated norm's [T, 1] fp32 sums (tests/test_real_engine_hybrid.py)
    "nemotron-h-tp2": Case("nemotron_h", dict(tensor_parallel_size=2, **SCHEDULED),
                           (ONE, WORKLOADS[0]), config=NEMOTRON_H),
    # PP2 x TP2, 4 workers on 2 cores: with shared memory (AVX-512) the CPU build sends a
    # stage's tensors whole; without (AVX2) the metadata and TP slices, as on GPUs.
    # `long-prompt`: a prefill of 300 tokens in one step (the CPU build's budget, 4096), whose
    # pickled metadata holds a dim of 256 or more (2 bytes longer than [T < 256, 128]'s)
    "dense-pp2-tp2": Case("dense", dict(pipeline_parallel_size=2, tensor_parallel_size=2,
                                        max_num_seqs=2, max_model_len=512, enforce_eager=False,
                                        compilation_config={"mode": 2, "backend": "eager"}),
                          (ONE, Workload("long-prompt", ((300, 2),))), bind="0|0|1|1"),
}


def _speculative(method: str, k: int) -> tuple[dict, tuple[str, ...]]:
    """The engine's speculative_config and validate's options for a zero-head model, whose
    every draft is accepted: each verify step yields 1 + k tokens."""
    config = {"method": method, "num_speculative_tokens": k}
    engine = {**config, **({"prompt_lookup_min": 1, "prompt_lookup_max": 2}
                           if method == "ngram" else {})}
    return engine, ("--speculative-config", json.dumps(config), "--acceptance-length",
                    str(k + 1))


PP = dict(pipeline_parallel_size=2, enforce_eager=False,  # dense-pp2's settings
          compilation_config={"mode": 2, "backend": "eager"})
EAGLE1, EAGLE3, NGRAM2 = (_speculative(m, k) for m, k in (("eagle", 1), ("eagle", 3), ("ngram", 2)))
# Combinations the cases above leave out, run by hand (docs/real-engine.md lists them).
# Outputs are 1 + n (1 + k): every verify step yields 1 + k tokens.
PROBES: dict[str, Case] = {
    "eagle-k1-tp2": Case("zero-head", dict(
        tensor_parallel_size=2, **SCHEDULED, speculative_config=EAGLE1[0]), (
        Workload("one-request", ((8, 5),)), Workload("lengths", ((12, 3), (3, 5))),
        Workload("pad-spec", ((8, 5), (5, 3), (1, 3)))),
        eagle_head=True, validate=EAGLE1[1]),
    "eagle-k3-tp2": Case("zero-head", dict(
        tensor_parallel_size=2, **SCHEDULED, speculative_config=EAGLE3[0]), (
        Workload("one-request", ((8, 9),)), Workload("chunked", ((40, 5), (6, 9))),
        Workload("queued", ((7, 5), (5, 9), (9, 5))),
        # a 1-token prompt admitted beside a decode: vLLM pads it to 1 + k tokens
        Workload("pad-spec", ((8, 9), (5, 5), (1, 5)))), eagle_head=True, validate=EAGLE3[1]),
    "ngram-requests-tp2": Case("zero-head", dict(
        tensor_parallel_size=2, **SCHEDULED, speculative_config=NGRAM2[0]), (
        Workload("lengths", ((12, 4), (8, 7)), zeros=5),
        Workload("chunked", ((40, 4), (6, 7)), zeros=5)), validate=NGRAM2[1]),
    "moe-tp4": Case("moe", dict(tensor_parallel_size=4, **SCHEDULED), (ONE, WORKLOADS[0]),
                    bind="0|0|1|1"),
    "dense-pp2-requests": Case("dense", dict(**PP, **SCHEDULED), WORKLOADS),
    "dense-pp2-tp2-requests": Case("dense", dict(**PP, tensor_parallel_size=2, **SCHEDULED),
                                   (WORKLOADS[0],), bind="0|0|1|1"),
    # 2 KV heads: split over TP2, each held by 2 ranks at TP4; the lm_head is embed_tokens
    "gqa-tied-tp4": Case("dense", dict(tensor_parallel_size=4, **SCHEDULED), (
        ONE, WORKLOADS[0]), bind="0|0|1|1",
        config={"num_key_value_heads": 2, "tie_word_embeddings": True}),
    # Qwen3 (q and k norms), GQA; batches of equal requests, validated as --batch
    "qwen3-tp2": Case("qwen3", dict(tensor_parallel_size=2, **SCHEDULED), (
        ONE, Workload("batch", ((6, 3),) * 2, as_batch=True), BATCH_CHUNKED, WORKLOADS[1]),
        config={"num_key_value_heads": 2}),
    # DeepSeek-V2 MLA: the CPU build's MLA kernel (amx_mla) takes heads of 576 (a latent
    # of 512 + a rotary part of 64) and bf16 weights alone
    "mla-tp2": Case("mla", dict(tensor_parallel_size=2, **SCHEDULED, dtype="bfloat16"),
                    (ONE, WORKLOADS[0])),
    # experts whole on each rank (expert parallelism over the TP group, no DP)
    "moe-ep-tp2": Case("moe", dict(tensor_parallel_size=2, enable_expert_parallel=True,
                                   **SCHEDULED), (ONE, WORKLOADS[0]), validate=("--ep",)),
    # a vocabulary of 300, padded to 320 (a multiple of 64), tied to the embedding
    "odd-vocab-tp2": Case("dense", dict(tensor_parallel_size=2, **SCHEDULED), (
        ONE, WORKLOADS[2]), config={"vocab_size": 300, "tie_word_embeddings": True}),
    "qwen2moe-tp2": Case("qwen2moe", dict(tensor_parallel_size=2, **SCHEDULED),
                         (ONE, WORKLOADS[0])),
    "mixtral-tp2": Case("mixtral", dict(tensor_parallel_size=2, **SCHEDULED), (ONE,)),
    "gemma3-tp2": Case("gemma3", dict(tensor_parallel_size=2, **SCHEDULED), (ONE,)),
    # 3 layers over 2 stages: which stage takes the odd one (distributed/utils.py)
    "pp2-tp2-3layers": Case("dense", dict(**PP, tensor_parallel_size=2, **SCHEDULED), (ONE,),
                            bind="0|0|1|1", config={"num_hidden_layers": 3}),
    # one 200-token prompt twice in one step (budget 4096): the first caches its first block
    # of 128 (the CPU build's) as it is scheduled; the second, admitted after it, computes 72
    "same-prompt-tp2": Case("dense", dict(tensor_parallel_size=2), (Workload(
        "same-prompt", ((200, 2),) * 2, ids=tuple(range(1, 201))),)),
}


# Disaggregated prefill and decode through vLLM's NixlConnector on host memory
# (scripts/vllm_cpu_nixl.py): prefill TP, decode TP, prompt and output tokens. 200 tokens are
# 2 blocks of 128; decode TP2 reads half the KV heads from the one prefill rank.
NIXL_CASES: dict[str, tuple[int, int, int, int]] = {"nixl-tp1-tp2": (1, 2, 200, 3),
                                                    "nixl-tp2-tp1": (2, 1, 200, 3)}


# Data-parallel serving (scripts/vllm_cpu_dp.py, `vllm serve --data-parallel-size`): what the
# CPU build runs is a dense model's DP ranks, independent engines. Two prompts in one
# request, one to each engine (least-loaded); max_num_batched_tokens 16 chunks the first.
DP_CASES: dict[str, dict] = {
    "dense-dp2-tp2": {"dp": 2, "tp": 2, "workload": "one-each",
                      "requests": ((40, 3), (6, 3)),
                      "limits": {"max_num_batched_tokens": 16, "max_num_seqs": 2}},
}
