"""The options that describe a pattern, shared by `pattern`, `replay` and `sweep --from-pattern`."""

import argparse

from microbench.argtypes import positive_int, positive_int_list
from patterns import ENGINES, EngineOptions, Layout, Pattern, Workload, generate, resolve_model
from patterns.moe import A2A_MODES, check_a2a


def add_pattern_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    group = parser.add_argument_group("pattern")
    group.add_argument("--model", required=required,
                       help="preset name (see `infercomm models`) or path of a config.json")
    group.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
    group.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel size")
    group.add_argument("--dp", type=positive_int, default=1,
                       help="data-parallel attention replicas (world size dp x tp x pp)")
    group.add_argument("--ep", action="store_true",
                       help="expert parallelism (vLLM's --enable-expert-parallel): the experts "
                            "of a MoE layer split over the EP group of dp x tp ranks")
    group.add_argument("--dp-batches", type=positive_int_list, default=None,
                       help="each DP rank's own batch, e.g. 3,5,2,8 (default: --batch on "
                            "every DP rank)")
    group.add_argument("--a2a", choices=A2A_MODES, default=A2A_MODES[0],
                       help="MoE token exchange under --dp --ep: vLLM's default "
                            "allgather_reducescatter, or alltoall (DeepEP-style kernels)")
    group.add_argument("--prompt", type=positive_int, required=required,
                       help="prompt length Sp, tokens per request")
    group.add_argument("--decode", type=positive_int, required=required,
                       help="output length Sd, tokens per request including the one the "
                            "prefill samples (Sd-1 decode steps)")
    group.add_argument("--batch", type=positive_int, default=1,
                       help="requests in the batch B, per DP rank (default 1)")
    group.add_argument("--engine", default="vllm-v0",
                       help=f"engine profile: {', '.join(sorted(ENGINES))} (default vllm-v0)")
    group.add_argument("--dtype", default=None,
                       help="bf16, fp16 or fp32 (default: the model's torch_dtype)")
    group.add_argument("--eager", action="store_true",
                       help="no CUDA graphs: decode batches are not padded to capture sizes")
    group.add_argument("--max-batched-tokens", type=positive_int, default=None,
                       help="chunked prefill: at most N tokens per prefill step")
    group.add_argument("--control-plane", action="store_true",
                       help="add V0's per-step broadcasts of the model inputs (off by default)")


def pattern_from_args(args: argparse.Namespace) -> Pattern:
    """Build the pattern; raises ConfigError with a one-line message on bad input."""
    model = resolve_model(args.model)
    layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep)
    workload = Workload(prompt=args.prompt, decode=args.decode, batch=args.batch,
                        dtype=args.dtype, dp_batches=args.dp_batches)
    check_a2a(args.a2a)
    options = EngineOptions(eager=args.eager, max_batched_tokens=args.max_batched_tokens,
                            control_plane=args.control_plane, a2a=args.a2a)
    return generate(args.engine, model, layout, workload, options)

