"""How a rank says that a communication call failed: one line, then a non-zero exit."""

import sys


def report_rank_failure(command: str, rank: int, err: BaseException) -> int:
    """Write `infercomm COMMAND: error: rank R: Type: first line` and return exit status 1.

    A peer that died or hung surfaces as the library's own error on the others (gloo's
    connection reset, a timeout); its first line says which, the rest is the library's trace.
    """
    text = str(err).strip()
    first_line = text.splitlines()[0][:300] if text else ""
    sys.stderr.write(f"infercomm {command}: error: rank {rank}: {type(err).__name__}: "
                     f"{first_line}\n")
    return 1
