"""The options that describe a pattern, shared by `pattern`, `replay` and `sweep --from-pattern`."""

import argparse
import dataclasses

from microbench.argtypes import UsageError, model_arg, model_name, positive_int, positive_int_list
from patterns import ENGINES, EngineOptions, Layout, Pattern, Workload, generate, resolve_model
from patterns.engines import DEFAULT_ENGINE
from patterns.moe import A2A_MODES, check_a2a
from patterns.pattern import GPUS, MODEL_RUNNERS, MOE_BACKENDS, TENSOR_DEVICES


def add_pattern_arguments(parser: argparse.ArgumentParser, required: bool = True,
                          layout: bool = True) -> None:
    """layout=False: no --tp/--pp (`plan` tries every layout itself)."""
    group = parser.add_argument_group("pattern")
    group.add_argument("--model", required=required, type=model_arg,
                       help="preset name (see `infercomm models`) or path of a config.json")
    group.add_argument("--name", default=None, type=model_name,
                       help="the model's name in output and run folders (default: from the "
                            "config: _name_or_path, else model_type and size, else file stem)")
    if layout:
        group.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
        group.add_argument("--pp", type=positive_int, default=1,
                           help="pipeline-parallel size")
        group.add_argument("--dp", type=positive_int, default=1,
                           help="data-parallel attention replicas (world size dp x tp x pp)")
        group.add_argument("--ep", action="store_true",
                           help="expert parallelism (vLLM's --enable-expert-parallel): the "
                                "experts of a MoE layer split over the EP group of dp x tp ranks")
        group.add_argument("--dp-batches", type=positive_int_list, default=None,
                           help="each DP rank's own batch, e.g. 3,5,2,8 (default: --batch on "
                                "every DP rank)")
    group.add_argument("--a2a", choices=A2A_MODES, default=A2A_MODES[0],
                       help="MoE token exchange under --dp --ep: vLLM's default "
                            "allgather_reducescatter, alltoall (DeepEP-style kernels), or "
                            "vllm's DeepEP deepep_ll / deepep_ht (low-latency / "
                            "high-throughput messages, fp8 for block-fp8 checkpoints)")
    # Without --requests, pattern_from_args asks for --prompt and --decode itself.
    group.add_argument("--prompt", type=positive_int, required=False,
                       help="prompt length Sp, tokens per request")
    group.add_argument("--decode", type=positive_int, required=False,
                       help="output length Sd, tokens per request including the one the "
                            "prefill samples (Sd-1 decode steps)")
    group.add_argument("--batch", type=positive_int, default=1,
                       help="requests in the batch B, per DP rank (default 1)")
    group.add_argument("--engine", default=DEFAULT_ENGINE,
                       help=f"engine profile: {', '.join(sorted(ENGINES))} (default "
                            f"{DEFAULT_ENGINE}; see `infercomm engines`)")
    group.add_argument("--dtype", default=None,
                       help="bf16, fp16 or fp32 (default: the model's torch_dtype)")
    group.add_argument("--eager", action="store_true",
                       help="no CUDA graphs: batches are not padded to capture sizes")
    group.add_argument("--max-batched-tokens", type=positive_int, default=None,
                       help="chunked prefill: at most N tokens per prefill step (default: "
                            "vllm 8192, 2048 on a100; sglang 8192, 16384 on b200; vllm-v0 and "
                            "trtllm: no chunking)")
    group.add_argument("--control-plane", action="store_true",
                       help="add the per-step control broadcasts: V0's model inputs, "
                            "SGLang's gloo broadcast_pyobj (off by default)")
    group.add_argument("--gpu", choices=GPUS, default="h100",
                       help="GPU the engine runs on; sets which transport carries each call "
                            "(default h100)")
    group.add_argument("--nccl-only", action="store_true",
                       help="custom all-reduce, symmetric memory and all-reduce fusions off: "
                            "every device call on NCCL (the seeds' setting; for vLLM "
                            "--disable-custom-all-reduce -O0 and VLLM_ALLREDUCE_USE_SYMM_MEM=0)")
    group.add_argument("--pp-whole-tensors", action="store_true",
                       help="vllm at pp > 1: each stage sends its hidden states and residual "
                            "whole, [T, h], with no TP all-gather after the receive, as vLLM's "
                            "CPU build does with its shared-memory communicator (AVX-512 "
                            "CPUs); on GPUs (and the CPU build on AVX2-only CPUs) the metadata "
                            "goes first and each TP rank sends a 1/tp slice")
    group.add_argument("--tensor-device", choices=TENSOR_DEVICES, default="cuda",
                       help="vllm: the device type of the engine's tensors, which the "
                            "pipeline's pickled metadata names (default cuda; cpu: vLLM's CPU "
                            "build, 2 bytes fewer a send)")
    group.add_argument("--moe-backend", choices=MOE_BACKENDS, default=None,
                       help="vllm: the MoE experts' kernel, vLLM's --moe-backend. mxfp4 "
                            "(gpt-oss): sets whether the MoE all-reduce carries the padded "
                            "hidden size (default: flashinfer-trtllm on b200, triton on "
                            "h100/h200, marlin on a100; flashinfer-trtllm-padded: vLLM before "
                            "May 2026 on b200). block-fp8 (DeepSeek-V3): flashinfer-cutlass "
                            "(default on h100/h200 with --ep) dispatches bf16 hidden states, "
                            "deep-gemm or triton fp8 ones with their scales")
    group.add_argument("--model-runner", choices=MODEL_RUNNERS, default=None,
                       help="vllm: Model Runner v1 or v2 (default: vLLM's for the model, v2 "
                            "for dense models)")
    group.add_argument("--max-num-seqs", type=positive_int, default=None,
                       help="vllm: max_num_seqs (default 1024, 256 on a100); sets the "
                            "CUDA-graph sizes")
    group.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="vllm: async scheduling, vLLM's flag (default: on; off with ngram "
                            "speculation): a finished request holds its running slot one more "
                            "step; --no-async-scheduling: the synchronous scheduler (what "
                            "vLLM's CPU build runs)")
    group.add_argument("--no-wave-tail", dest="wave_tail", action="store_false",
                       help="vllm, a MoE model at --dp > 1: leave out the DP wave's tail (the "
                            "dummy forwards every DP rank runs after the last real step until "
                            "the wave's sync every 32 steps): the inference alone, as under "
                            "traffic that keeps the wave running")
    group.add_argument("--disable-overlap-schedule", action="store_true",
                       help="sglang: the overlap scheduler off, SGLang's flag (on by default: "
                            "a finished request rides one more decode batch)")
    group.add_argument("--sp", action="store_true",
                       help="megatron: sequence parallelism; its static engine refuses it for "
                            "dense models and runs it for MoE only switched off outside the "
                            "MoE layers: refused here (not modelled)")
    group.add_argument("--return-log-probs", action="store_true",
                       help="megatron: the requests ask for log-probs (return_log_probs): the "
                            "prefill gathers and broadcasts the logits of every prompt "
                            "position, not only the last")
    from microbench.options.disagg_args import add_disagg_arguments
    add_disagg_arguments(group)
    from microbench.options.workload_args import add_workload_arguments
    add_workload_arguments(group)


def given_pattern_options(args: argparse.Namespace, unused: tuple[str, ...] = ()) -> list[str]:
    """The pattern options given (not at their defaults), by flag: a command that makes no
    pattern (a plain sweep) refuses them rather than ignore them. `unused`: dests the
    command reads itself (a plain sweep's --dtype)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_pattern_arguments(parser, required=False)
    return [action.option_strings[0] for action in parser._actions
            if action.dest not in unused and hasattr(args, action.dest)
            and getattr(args, action.dest) != action.default]


def refuse_pattern_options(args: argparse.Namespace,
                           advice: str = "add --from-pattern --model M --prompt P --decode D, "
                                         "or drop them") -> None:
    """A sweep of sizes (`--op kvtransfer` too) makes no pattern: the pattern options given
    to it (--connector, --moe-backend, --requests...) are refused, never ignored."""
    from microbench.argtypes import UsageError
    given = given_pattern_options(args, unused=("dtype",))
    if given:
        raise UsageError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} a "
                         f"pattern, which a sweep of sizes does not make; {advice}")


def pattern_from_args(args: argparse.Namespace) -> Pattern:
    """Build the pattern; raises ConfigError with a one-line message on bad input."""
    from microbench.options.disagg_args import refuse_disagg_options
    refuse_disagg_options(args)  # --disagg is its own deployment (disagg_args.py)
    from microbench.options import workload_args as wl  # --requests, --speculative-config
    wl.refuse_workload_options(args)
    if not wl.wants_workload(args):
        wl.require_prompt_decode(args)
    model = resolve_model(args.model)
    if getattr(args, "name", None):
        model = dataclasses.replace(model, name=args.name)
    layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep)
    if layout.ep and layout.tp * layout.dp == 1:
        # one rank holds every expert: no all-to-all, no call to replay (a replay of 0 calls
        # exited 0 with an end to end of 7.7 us)
        raise UsageError("--ep spreads the experts over the dp x tp ranks of a stage, and "
                         "dp 1 x tp 1 is one rank; add --dp N (expert parallelism over "
                         "data-parallel ranks, as the engines run it) or --tp N")
    check_a2a(args.a2a)
    options = options_from_args(args)
    if wl.wants_workload(args):
        return wl.workload_from_args(args, options)
    workload = Workload(prompt=args.prompt, decode=args.decode, batch=args.batch,
                        dtype=args.dtype, dp_batches=args.dp_batches)
    return generate(args.engine, model, layout, workload, options)


def options_from_args(args: argparse.Namespace) -> EngineOptions:
    """The engine options of the pattern options (their engine checks them)."""
    return EngineOptions(eager=args.eager, max_batched_tokens=args.max_batched_tokens,
                         control_plane=args.control_plane, gpu=args.gpu,
                         nccl_only=args.nccl_only, model_runner=args.model_runner,
                         max_num_seqs=args.max_num_seqs, sp=args.sp,
                         return_log_probs=getattr(args, "return_log_probs", False),
                         a2a=args.a2a,
                         moe_backend=args.moe_backend,
                         async_scheduling=getattr(args, "async_scheduling", None),
                         disable_overlap_schedule=getattr(args, "disable_overlap_schedule",
                                                          False),
                         pp_whole_tensors=getattr(args, "pp_whole_tensors", False),
                         tensor_device=getattr(args, "tensor_device", "cuda"),
                         prefix_caching=getattr(args, "prefix_caching", None),
                         wave_tail=getattr(args, "wave_tail", True),
                         kv_block_size=(getattr(args, "kv_block_size", None)
                                        if getattr(args, "requests", None) else None))
