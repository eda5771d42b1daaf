"""The options that describe a pattern, shared by `pattern`, `replay` and `sweep --from-pattern`."""

import argparse

from microbench.argtypes import positive_int
from patterns import ENGINES, EngineOptions, Layout, Pattern, Workload, generate, resolve_model


def add_pattern_arguments(parser: argparse.ArgumentParser, required: bool = True,
                          layout: bool = True) -> None:
    """layout=False: no --tp/--pp (`plan` tries every layout itself)."""
    group = parser.add_argument_group("pattern")
    group.add_argument("--model", required=required,
                       help="preset name (see `infercomm models`) or path of a config.json")
    if layout:
        group.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
        group.add_argument("--pp", type=positive_int, default=1,
                           help="pipeline-parallel size")
    group.add_argument("--prompt", type=positive_int, required=required,
                       help="prompt length Sp, tokens per request")
    group.add_argument("--decode", type=positive_int, required=required,
                       help="output length Sd, tokens per request including the one the "
                            "prefill samples (Sd-1 decode steps)")
    group.add_argument("--batch", type=positive_int, default=1,
                       help="requests in the batch B (default 1)")
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
    layout = Layout(tp=args.tp, pp=args.pp)
    workload = Workload(prompt=args.prompt, decode=args.decode, batch=args.batch,
                        dtype=args.dtype)
    options = EngineOptions(eager=args.eager, max_batched_tokens=args.max_batched_tokens,
                            control_plane=args.control_plane)
    return generate(args.engine, model, layout, workload, options)

