"""vLLM itself as the oracle: serve a tiny random-weight model with vLLM's CPU build under
its own torch profiler, and validate every rank's trace with `infercomm validate`.

    .venv-vllm/bin/python scripts/vllm_cpu_oracle.py dense-tp2 --out vllm-oracle

Run it with the Python of a venv that holds `vllm-cpu` (`make test` makes `.venv-vllm`).
A case writes a tiny checkpoint from a config (random weights, no download, no tokenizer),
starts one `vllm.LLM` engine, and profiles each of its workloads separately
(`start_profile` / `stop_profile` around one `generate`): OUT/WORKLOAD/ holds one
`*.pt.trace.json.gz` a rank (and OUT/WORKLOAD.jsonl the requests of a workload of several).
Then, unless --no-validate, it runs `infercomm validate` on each folder with the options
that say how the engine ran, and exits 1 when one differs. OUT/oracle.json holds, per
workload, validate's arguments and exit status; the last line is a short JSON object.

What makes vLLM's CPU build serve here (2 cores, one NUMA node):
- VLLM_CPU_OMP_THREADS_BIND: one core list per worker ("0|1"; more workers than cores share
  them), or vLLM refuses to bind two workers on one NUMA node;
- VLLM_CPU_KVCACHE_SPACE=1 (GiB of KV cache a worker), enforce_eager=True;
- VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core runs in this process, so every request
  of a workload is queued before its first step (from another process requests arrive while
  the engine already steps, and the step sequence would depend on timing);
- distributed_executor_backend="mp": one worker process a rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

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
    # PP2 x TP2, 4 workers on 2 cores: the CPU build sends a stage's tensors whole
    "dense-pp2-tp2": Case("dense", dict(pipeline_parallel_size=2, tensor_parallel_size=2,
                                        **SCHEDULED, enforce_eager=False,
                                        compilation_config={"mode": 2, "backend": "eager"}),
                          (ONE,), bind="0|0|1|1"),
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


def serve_nixl(name: str, out: Path, check: bool) -> int:
    """One request served disaggregated; NIXL's READs held against `infercomm pattern`."""
    import vllm_cpu_nixl as nixl
    prefill_tp, decode_tp, prompt, decode = NIXL_CASES[name]
    start = time.monotonic()
    write_model("dense", out / "model")
    records = nixl.run_pair(out / "model", out, prefill_tp, decode_tp, prompt, decode)
    argv = nixl.pattern_args(out / "model" / "config.json", prefill_tp, decode_tp, prompt, decode)
    doc: dict = {"case": name, "serve_s": round(time.monotonic() - start, 1),
                 "nixl_reads": nixl.reads(records), "pattern": argv}
    status = 0
    if check:
        proc = subprocess.run([sys.executable, "-m", "microbench", *argv], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, check=False)
        expected = nixl.pattern_reads(json.loads(proc.stdout)) if proc.returncode == 0 else None
        status = 0 if expected == doc["nixl_reads"] else 1
        print(f"NIXL READs (a decode rank each): {doc['nixl_reads']}")
        print(f"infercomm {' '.join(argv[:1] + argv[3:])}: {expected or proc.stderr.strip()}")
        doc["exit"] = status
    (out / "oracle.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"case": name, "out": str(out), "serve_s": doc["serve_s"],
                      **({"match": status == 0} if check else {})}, separators=(",", ":")))
    return status


# Each kind's transformers config and its keys beyond COMMON ("dense", "zero-head": Llama).
MOE = dict(moe_intermediate_size=64, num_experts_per_tok=2)
KINDS: dict[str, tuple[str, dict]] = {
    "moe": ("Qwen3MoeConfig", dict(**MOE, num_experts=8, norm_topk_prob=True)),
    "qwen3": ("Qwen3Config", {}),
    # DeepSeek-V2: MLA attention, a dense first layer, then MoE layers with a shared expert
    "mla": ("DeepseekV2Config", dict(**MOE, n_routed_experts=8, n_shared_experts=1,
                                     first_k_dense_replace=1, kv_lora_rank=512,
                                     q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
                                     v_head_dim=32, topk_method="greedy", n_group=1,
                                     topk_group=1)),
    # a shared expert beside the routed ones, gated (reduce_results=False in vLLM)
    "qwen2moe": ("Qwen2MoeConfig", dict(**MOE, num_experts=8,
                                        shared_expert_intermediate_size=128)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=8, num_experts_per_tok=2)),
    "gemma3": ("Gemma3TextConfig", {}),
}


def write_model(kind: str, path: Path, extra: dict | None = None) -> None:
    """A random-weight checkpoint of the kind, from its config (transformers in this venv);
    `extra`: config keys beyond COMMON (fewer KV heads, tied embeddings)."""
    import torch
    import transformers
    torch.manual_seed(0)
    name, more = KINDS.get(kind, ("LlamaConfig", {}))
    config = getattr(transformers, name)(**{**COMMON, **(extra or {}), **more})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if kind == "zero-head":
        with torch.no_grad():
            model.lm_head.weight.zero_()  # every logit 0: greedy sampling picks token 0
    model.save_pretrained(path)


def write_eagle_head(path: Path) -> None:
    """A random EAGLE-1 draft head for the tiny Llama, as vLLM's `EagleLlamaForCausalLM`
    loads one (vllm/model_executor/models/llama_eagle.py): a Llama config (vLLM wraps it
    in its EAGLEConfig and prefixes "Eagle" to the architecture), `fc` of [hidden, 2 x
    hidden] and one decoder layer without its input norm; no embed_tokens and no lm_head,
    so the proposer shares the target's."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    config = LlamaConfig(**{**COMMON, "num_hidden_layers": 1})
    config.architectures = ["LlamaForCausalLM"]
    layer = LlamaForCausalLM(config).model.layers[0]
    weights = {f"layers.0.{name}": tensor.contiguous() for name, tensor in
               layer.state_dict().items() if not name.startswith("input_layernorm")}
    weights["fc.weight"] = torch.randn(HIDDEN, 2 * HIDDEN) / (2 * HIDDEN) ** 0.5
    path.mkdir(parents=True)
    config.save_pretrained(path)
    save_file(weights, str(path / "model.safetensors"))


def serve(case: Case, model: Path, out: Path) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Profile each workload of the case on one engine; {workload: its trace files}, and
    the scheduler's limits as the engine set them (the CPU build's defaults, 4096 tokens
    and 256 sequences a worker, and for MLA models a budget of at least the model length:
    vllm/engine/arg_utils.py, vllm/platforms/cpu.py)."""
    from vllm import LLM, SamplingParams
    raw = out / "profiler"
    engine = dict(model=str(model), dtype="float32", skip_tokenizer_init=True,
                  enforce_eager=True, distributed_executor_backend="mp", max_model_len=256,
                  # no torch.compile (vllm/platforms/cpu.py would trace with dynamo and
                  # compile with inductor: a minute of start-up; no pass changes a call)
                  compilation_config={"mode": 0},
                  seed=0, profiler_config={"profiler": "torch", "torch_profiler_dir": str(raw),
                                           "torch_profiler_record_shapes": True,
                                           "torch_profiler_with_stack": False,
                                           "torch_profiler_dump_cuda_time_total": False})
    settings = {**engine, **case.engine}
    if case.eagle_head:
        write_eagle_head(out / "eagle-head")
        settings["speculative_config"] = {**settings["speculative_config"],
                                          "model": str(out / "eagle-head")}
    llm = LLM(**settings)
    config = llm.llm_engine.vllm_config.scheduler_config
    limits = {"max_num_batched_tokens": config.max_num_batched_tokens,
              "max_num_seqs": config.max_num_seqs,
              "block_size": llm.llm_engine.vllm_config.cache_config.block_size}
    traces = {}
    for workload in case.workloads:
        prompts, params = [], []
        for i, (prompt, output) in enumerate(workload.requests):
            ids = list(workload.ids) if workload.ids else [
                (7 * i + j) % (VOCAB - 1) + 1 for j in range(prompt - workload.zeros)]
            prompts.append({"prompt_token_ids": ids + [0] * (prompt - len(ids))})
            # exactly `output` tokens: random weights may sample an end token early
            params.append(SamplingParams(max_tokens=output, min_tokens=output,
                                         ignore_eos=True, temperature=0.0, detokenize=False))
        llm.start_profile(profile_prefix=workload.name)
        llm.generate(prompts, params, use_tqdm=False)
        llm.stop_profile()
        folder = out / workload.name
        folder.mkdir()
        for trace in sorted(raw.glob(f"{workload.name}_*.pt.trace.json*")):
            trace.rename(folder / trace.name)
        traces[workload.name] = sorted(str(p) for p in folder.iterdir())
    llm.llm_engine.engine_core.shutdown()  # the workers end now, not at interpreter exit
    return traces, limits


def validate_args(case: Case, workload: Workload, out: Path, traces: list[str],
                  limits: dict[str, int]) -> list[str]:
    """`infercomm validate` of one workload's traces: the engine's settings as pattern
    options. vLLM's CPU build schedules synchronously (vllm/platforms/cpu.py turns async
    scheduling off), captures no CUDA graph, runs Model Runner V1 (vllm/config/vllm.py:
    "Model Runner V2 requires Triton; using the V1 model runner instead") and chunks
    prefills by max_num_batched_tokens, and sends a pipeline stage's tensors whole
    (vllm/distributed/parallel_state.py: use_cpu_custom_send_recv); the model ran in fp32."""
    args = ["validate", "--trace", *traces, "--model", str(out / "model" / "config.json"),
            "--tp", str(case.engine.get("tensor_parallel_size", 1)),
            "--pp", str(case.engine.get("pipeline_parallel_size", 1)), "--dtype",
            {"float32": "fp32", "bfloat16": "bf16"}[case.engine.get("dtype", "float32")],
            "--eager", "--no-async-scheduling", "--model-runner", "v1", *case.validate]
    if case.engine.get("pipeline_parallel_size", 1) > 1:
        args.append("--pp-whole-tensors")
    for key, flag in (("max_num_batched_tokens", "--max-batched-tokens"),
                      ("max_num_seqs", "--max-num-seqs")):
        args += [flag, str(limits[key])]
    if len(workload.requests) == 1 or workload.as_batch:
        prompt, output = workload.requests[0]
        batch = ["--batch", str(len(workload.requests))] if workload.as_batch else []
        return [*args, "--prompt", str(prompt), "--decode", str(output), *batch]
    requests = out / f"{workload.name}.jsonl"
    shared = workload.ids is not None  # prompts of `ids`, then 0s: all of one sequence
    requests.write_text("".join(json.dumps({"arrival_s": 0.0, "prompt": p, "output": o, **(
        {"prefix_id": workload.name, "prefix_tokens": p} if shared else {})}) + "\n"
                                for p, o in workload.requests))
    block = ["--kv-block-size", str(limits["block_size"])] if shared else []
    return [*args, "--requests", str(requests), *block]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted([*CASES, *PROBES, *NIXL_CASES]))
    parser.add_argument("--out", type=Path, required=True,
                        help="a folder that does not exist yet")
    parser.add_argument("--no-validate", action="store_true",
                        help="only serve and profile; print validate's arguments")
    args = parser.parse_args()
    if args.out.exists():
        print(f"--out {args.out} exists; name a new folder", file=sys.stderr)
        return 2
    if args.case in NIXL_CASES:
        return serve_nixl(args.case, args.out, not args.no_validate)
    case = {**CASES, **PROBES}[args.case]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", case.bind)
    start = time.monotonic()
    write_model(case.model, args.out / "model", case.config)
    traces, limits = serve(case, args.out / "model", args.out)
    served = time.monotonic() - start
    doc: dict = {"case": args.case, "serve_s": round(served, 1), "workloads": {}}
    status = 0
    for workload in case.workloads:
        argv = validate_args(case, workload, args.out, traces[workload.name], limits)
        entry = doc["workloads"][workload.name] = {"validate": argv}
        if not args.no_validate:
            # infercomm from this checkout: its patterns and readers import no third party
            proc = subprocess.run([sys.executable, "-m", "microbench", *argv], cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO)},
                                  capture_output=True, text=True, check=False)
            shown = [argv[0], *argv[argv.index("--model"):]]  # the trace files are long
            print(f"== {workload.name}: infercomm {' '.join(shown)}")
            print(proc.stdout + proc.stderr, end="")
            entry["exit"] = proc.returncode
            status = max(status, proc.returncode)
    doc["seconds"] = round(time.monotonic() - start, 1)
    (args.out / "oracle.json").write_text(json.dumps(doc, indent=1) + "\n")
    short = {"case": args.case, "out": str(args.out), "serve_s": doc["serve_s"],
             "seconds": doc["seconds"]}
    if not args.no_validate:
        short["validate_exit"] = {k: v["exit"] for k, v in doc["workloads"].items()}
    print(json.dumps(short, separators=(",", ":")))
    return status


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())
