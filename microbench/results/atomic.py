"""Files a command is asked to write (`report -o`, `plot -o`, `compare -o`): the whole file
or nothing, written beside its place and renamed over it, so that a full or read-only disk
leaves no partial file and the error names the file."""

import contextlib
import os
from pathlib import Path

from microbench.argtypes import UsageError


def write_atomic(path: Path, data: str | bytes, given: str, flag: str = "-o") -> None:
    """Write `data` to `path` in one step; UsageError (one line, exit 2) when it cannot be."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:  # close() is where a full disk may show
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as err:
        # A read-only file system refuses even the unlink of a file that is not there.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UsageError(f"{flag} {given}: cannot write {path} ({err.strerror or err}); pass "
                         "a writable place") from None
