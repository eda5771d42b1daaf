"""Standard streams that are closed, full or gone, for every command.

- Closed at start (`>&-`, `2>&-`): Python leaves sys.stdout or sys.stderr None, and the first
  write of anything (the MPI launcher forwarding rank 0's table, a rank's progress line) was
  an AttributeError; a run under MPI with stderr closed exited 1 having measured nothing. The
  descriptor is opened on /dev/null instead, as a daemon does, so the run goes on and its
  output goes nowhere, as the user asked (the run folder is written as ever); its children
  inherit /dev/null, not whatever file would next take the descriptor's number.
- Full or failing (`> /dev/full`, a full disk): the write's OSError was a traceback. It is
  one line on stderr naming the reason, exit status 2, and stdout is silenced so that the
  interpreter's last flush of what is left does not print a second error.
"""

import contextlib
import errno
import os
import sys

# What a write to a file without room or a failing device raises; a write that names no file
# is a stream's (every file written by path is named in its error, or handled where written).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


def open_closed_ones() -> None:
    """Open /dev/null on a standard descriptor that is closed; give Python a stream on it."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # children's too (mpiexec exits 255 without one)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False,  # noqa: SIM115
                                    encoding="utf-8", errors="replace"))


def stdout_failed(err: OSError) -> bool:
    """Whether `err` came from writing the output: stdout's pending output does not flush, or
    a write without room named no file. If so, stdout is silenced for the rest of the run."""
    try:
        sys.stdout.flush()
        failed = err.filename is None and err.errno in _NO_ROOM
    except OSError:
        failed = True
    if failed:
        silence_stdout()
    return failed


def silence_stdout() -> None:
    """Point stdout at /dev/null, dropping what is pending (the reader went away, or there is
    no room): the interpreter's last flush then succeeds quietly."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
