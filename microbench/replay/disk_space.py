"""Disk that `--timing op` will write, checked before the replay rather than found full after
minutes of measurement.

Each rank streams its call times (float64) to an unlinked file in the temporary folder; rank 0
then writes ops.csv there and copies it into the run's folder under --out. Both folders must
hold their share when the replay starts.
"""

import shutil
import tempfile
from pathlib import Path

from microbench.argtypes import UsageError
from microbench.replay.op_samples import calls_of_rank
from microbench.views.textfmt import format_bytes
from patterns import Pattern

SAMPLE_BYTES = 8  # one float64 a call and timed inference


def free_bytes(folder: str | Path) -> int | None:
    """Free bytes where `folder` (or its nearest existing parent) lives; None if unknown."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def check_op_disk(pattern: Pattern, ranks: list[int], iterations: int, csv_bytes: int,
                  out: str) -> None:
    """Refuse when the temporary folder cannot take `ranks`' sample files (and ops.csv, when
    rank 0 is among them) or --out cannot take ops.csv; both on one disk add up."""
    tmp = tempfile.gettempdir()
    samples = sum(calls_of_rank(pattern, r) for r in ranks) * iterations * SAMPLE_BYTES
    writes_csv = 0 in ranks
    needs: dict[int | None, tuple[int, list[str], str]] = {}
    for folder, need, what in ((tmp, samples + (csv_bytes if writes_csv else 0),
                                f"the temporary folder {tmp} (TMPDIR)"),
                               (out, csv_bytes if writes_csv else 0, f"--out {out}")):
        if need:
            disk = _device(folder)
            had, names, _ = needs.get(disk, (0, [], folder))
            needs[disk] = (had + need, [*names, what], folder)
    for need, names, folder in needs.values():
        free = free_bytes(folder)
        if free is not None and need > free:
            raise UsageError(f"--timing op needs about {format_bytes(need)} in "
                             f"{' and '.join(names)} for the call times of {_count(ranks)}"
                             f"{' and ops.csv' if writes_csv else ''}, and "
                             f"{format_bytes(free)} are free; free some space, set TMPDIR to "
                             "a larger disk, lower -n or --decode, or use --timing step")


def _device(folder: str) -> int | None:
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return path.stat().st_dev
    except OSError:
        return None


def _count(ranks: list[int]) -> str:
    return f"{len(ranks)} ranks" if len(ranks) > 1 else f"rank {ranks[0]}"
