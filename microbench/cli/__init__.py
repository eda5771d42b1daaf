"""`infercomm` / `python -m microbench`: one parser, one subcommand module per verb.

Bad input of any kind ends with one line on stderr and exit status 2, never a traceback.
"""

import argparse
import importlib
import sys
from collections.abc import Sequence

from microbench.argtypes import OneLineParser, UsageError
from patterns import ConfigError

# Each module defines `add_parser(subparsers)` and `run(args) -> int`.
COMMAND_MODULES = (
    "microbench.cli.models",
    "microbench.cli.engines",
    "microbench.cli.pattern",
    "microbench.cli.replay",
    "microbench.cli.sweep",
    "microbench.cli.compare",
    "microbench.cli.predict",
    "microbench.cli.report",
    "microbench.cli.trace",
    "microbench.cli.validate",
)

EXAMPLES = """\
examples:
  infercomm models
  infercomm engines
  infercomm pattern --model llama-3.1-8b --tp 2 --pp 2 --prompt 128 --decode 128
  infercomm pattern --engine sglang --gpu h200 --model qwen3-8b --tp 4 --prompt 512 --decode 64
  infercomm trace rank0.json rank1.json
  infercomm validate --trace nccl.log --engine vllm-v0 --eager --model llama-3.1-8b \\
      --tp 2 --prompt 128 --decode 128
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="infercomm",
        description="The communication of LLM inference: generate the exact calls an engine "
                    "issues and replay them over NCCL, gloo or MPI.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                       parser_class=OneLineParser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # recorded in results, and handed on to ranks started locally
    try:
        return int(args.run(args))
    except (ConfigError, UsageError) as err:
        sys.stderr.write(f"infercomm {args.command}: error: {err}\n")
        return 2
    except BrokenPipeError:  # `infercomm pattern ... | head` is fine
        return 0
