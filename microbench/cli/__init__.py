"""`infercomm` / `python -m microbench`: one parser, one subcommand module per verb.

Bad input of any kind ends with one line on stderr and exit status 2, never a traceback.
"""

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from microbench.argtypes import OneLineParser, UsageError
from patterns import ConfigError
from patterns.errors import shown

# Each module defines `add_parser(subparsers)` and `run(args) -> int`. Only the module of the
# command being run is imported: the others would pull in numpy and every backend, and
# `infercomm sweep --help` would pay for all of them (issue 9, item 12). The one-line help
# of the others is here so that `infercomm --help` lists them without importing them.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("microbench.cli.models", "list the model presets and their sources"),
    "engines": ("microbench.cli.engines", "list the engine profiles, their sources and options"),
    "pattern": ("microbench.cli.pattern", "print the calls an engine issues (no devices needed)"),
    "replay": ("microbench.cli.replay", "replay a pattern's calls on real ranks and time them"),
    "sweep": ("microbench.cli.sweep",
              "time collectives over a range of message sizes (like nccl-tests)"),
    "compare": ("microbench.cli.compare",
                "compare runs: ratios with confidence intervals and verdicts"),
    "predict": ("microbench.cli.predict", "predict a pattern's communication time from a sweep"),
    "plan": ("microbench.cli.plan",
             "price every layout of N GPUs by its predicted communication"),
    "report": ("microbench.cli.report",
               "one self-contained HTML page of figures and tables from runs"),
    "plot": ("microbench.cli.report", "the report's figures as PNG files"),
    "trace": ("microbench.cli.trace",
              "summarise the calls of an NCCL/RCCL log or a PyTorch profiler trace"),
    "validate": ("microbench.cli.validate",
                 "compare a pattern with a trace the engine really issued"),
}
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))

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


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The command word of `argv` (the top-level parser has no option taking a value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _version() -> str:
    """The installed distribution's version (what `--version` prints)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("infercomm")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The full parser of the command `argv` names; a name and help line for the others."""
    parser = OneLineParser(
        prog="infercomm",
        description="The communication of LLM inference: generate the exact calls an engine "
                    "issues and replay them over NCCL, gloo or MPI.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"infercomm {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                       parser_class=OneLineParser)
    chosen = _chosen_command(argv)
    if chosen in COMMANDS:
        importlib.import_module(COMMANDS[chosen][0]).add_parser(subparsers)
    for name, (_, help_line) in COMMANDS.items():
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=help_line)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from microbench.cli import streams
    streams.open_closed_ones()  # `>&-` or `2>&-`: the output goes nowhere, the run goes on
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # recorded in results, and handed on to ranks started locally
    try:
        return int(args.run(args))
    except (ConfigError, UsageError) as err:
        # one line, whatever text of a file or an argument the message quotes
        sys.stderr.write(f"infercomm {args.command}: error: {shown(str(err), 4000)}\n")
        return 2
    except BrokenPipeError:  # `infercomm pattern ... | head` is fine
        streams.silence_stdout()
        # a rank of a --nproc launcher says so by its status, and the launcher ends the run
        return 128 + 13 if "INFERCOMM_LAUNCH_DIR" in os.environ else 0  # 13: SIGPIPE
    except OSError as err:
        if not streams.stdout_failed(err):
            raise
        sys.stderr.write(f"infercomm {args.command}: error: the output cannot be written "
                         f"({err.strerror or err}); send stdout to a file with room, or a "
                         "pipe\n")
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        sys.stderr.write(f"infercomm {args.command}: interrupted\n")
        return 130
