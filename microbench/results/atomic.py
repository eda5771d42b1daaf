"""Files a command is asked to write (`report -o`, `plot -o`, `compare -o`): the whole file
or nothing, written beside its place and renamed over it, so that a full or read-only disk
leaves no partial file and the error names the file."""

import contextlib
import os
import tempfile
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


# A probe this size finds a full disk (an empty file may still take an inode there).
_PROBE_BYTES = 4096


def check_writable(folder: Path, given: str, flag: str = "-o") -> None:
    """Refuse at once (UsageError) a place nothing can be written to, before the work whose
    output goes there."""
    reason = unwritable(folder)
    if reason is not None:
        raise UsageError(f"{flag} {given}: {reason}; pass a writable place")


def unwritable(folder: Path) -> str | None:
    """Why nothing can be written in `folder` (None when something can): the folder, or its
    nearest ancestor that exists, takes a small file, removed again."""
    here = folder
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{here} is not a folder"
    try:
        fd, name = tempfile.mkstemp(dir=here, prefix=".infercomm-probe-")
        try:
            os.write(fd, bytes(_PROBE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)
    except OSError as err:
        return f"cannot write in {here} ({err.strerror or err})"
    return None


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its ancestors that do not exist yet, deepest first: what a
    command that creates `folder` removes again when its output cannot be written."""
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_made(files: list[Path], folders: list[Path]) -> None:
    """Remove what a command wrote before its output failed: its files, then the folders it
    made, deepest first (each only if empty)."""
    for path in files:
        with contextlib.suppress(OSError):
            path.unlink()
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
