"""Traces an engine really issued: NCCL/RCCL COLL logs and PyTorch profiler (Kineto) JSON,
read into one call record, split into steps, compared with a pattern, folded into one.

    from patterns.traces import read_traces
    trace = read_traces(["rank0.json", "rank1.json"])
"""

import gzip
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from patterns.errors import ConfigError
from patterns.traces.calls import Call, RankCalls, Trace
from patterns.traces.kineto import read_kineto
from patterns.traces.kineto_shm import pair_receives
from patterns.traces.nccl_log import LogReader

EXPECTED = ("NCCL/RCCL COLL lines (run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL) or a "
            "Kineto JSON (.json/.json.gz from torch.profiler) with c10d, record_param_comms "
            "or gloo:/nccl: events")


def is_kineto(path: Path) -> bool:
    return path.name.endswith((".json", ".json.gz"))


def read_traces(paths: Sequence[str], rank_offsets: Sequence[int] | None = None) -> Trace:
    """Read every file; refuse (ConfigError) a missing file or one that holds no call.
    `rank_offsets`: added to each Kineto file's rank (independent DP engines each number
    their ranks from 0: validate places them by their DP rank)."""
    trace = Trace()
    logs = LogReader(trace)
    seen_files: dict[tuple[int, int], str] = {}
    owner: dict[str, str] = {}  # a log's process -> the file its calls came from
    for index, name in enumerate(paths):
        unknown_before = trace.unknown.copy()
        path = Path(name)
        _check_file(path, name)
        ident = (path.stat().st_dev, path.stat().st_ino)
        if ident in seen_files:
            raise ConfigError(f"{name}: the same file is given twice (as {seen_files[ident]!r} "
                              "too); pass each trace file once")
        seen_files[ident] = name
        if is_kineto(path):
            ep_before = sum(trace.ep_kernels.values())
            rank = _named(name, read_kineto, path, trace, index)
            rank.rank += rank_offsets[index] if rank_offsets else 0
            found = len(rank.ids) + sum(trace.ep_kernels.values()) - ep_before
            if found:
                trace.formats.add("kineto")
                if any(r.rank == rank.rank for r in trace.ranks):
                    raise ConfigError(f"{name}: rank {rank.rank} is given twice; pass one "
                                      "Kineto file per rank (independent DP engines each "
                                      "number their ranks from 0: trace --dp N, validate "
                                      "--trace once a DP rank)")
                trace.ranks.append(rank)
        else:
            before = {key: len(p.calls.ids) for key, p in logs.procs.items()}
            try:
                gz = _is_gzip(path)
                _check_text(path, name, gz)
                with _open_log(path, gz) as f:
                    found = _named(name, logs.feed, f)
                if found:
                    trace.formats.add("nccl")
            except (EOFError, zlib.error, gzip.BadGzipFile) as err:  # a damaged .gz log
                raise ConfigError(f"{name}: a damaged gzip file ({err}); pass the log whole, "
                                  "or unpacked") from None
            except OSError as err:
                raise ConfigError(f"trace file {name!r} cannot be read ({err.strerror}); pass "
                                  + EXPECTED) from None
            for key, proc in logs.procs.items():
                if len(proc.calls.ids) > before.get(key, 0):
                    if before.get(key, 0):
                        raise ConfigError(
                            f"{name}: process {key} already issued calls in {owner[key]!r}: "
                            "the same log given twice? pass each process's log once")
                    owner[key] = name
        if not found:
            seen = trace.unknown - unknown_before
            held = ("; it holds " + ", ".join(f"{kind} x{n}" for kind, n in seen.most_common(3))
                    if seen else "")
            raise ConfigError(f"{name}: no communication call found{held}; expected "
                              + EXPECTED)
    logs.finish()
    trace.ranks.sort(key=lambda r: r.rank)
    pair_receives(trace)  # vLLM CPU's shm receives take their senders' sizes
    return trace


T = TypeVar("T")

# a log line longer than this is no COLL line: a binary, sparse or damaged file
MAX_LINE = 1 << 20


def _named(name: str, read: Callable[..., T], *args: Any) -> T:
    """Run a reader; its refusals name the file."""
    try:
        return read(*args)
    except ConfigError as err:
        text = str(err)
        if text.startswith((name, str(Path(name)))):
            raise
        raise ConfigError(f"{name}: {text}") from None


def _check_file(path: Path, name: str) -> None:
    """Refuse, in one line, what is no regular file: missing, a directory, a FIFO, a device."""
    if not path.exists():
        raise ConfigError(f"trace file {name!r} does not exist; pass " + EXPECTED)
    if path.is_dir():
        raise ConfigError(f"trace file {name!r} is a directory; pass the files in it, "
                          + EXPECTED)
    if not path.is_file():
        raise ConfigError(f"trace file {name!r} is not a regular file (a FIFO or a device); "
                          "pass a file on disk: " + EXPECTED)


def _is_gzip(path: Path) -> bool:
    """A gzip file by its magic bytes (RFC 1952): an NCCL log is often kept compressed
    (`gzip nccl.log`), and its bytes were refused as "NUL bytes" while its text read."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open_log(path: Path, gz: bool) -> IO[str]:
    if gz:
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def _check_text(path: Path, name: str, gz: bool = False) -> None:
    """A log is text in lines: refuse, reading at most MAX_LINE bytes (of the text, for a
    gzip file), a file whose start holds NUL bytes (a sparse or binary file) or no line
    break (one endless line)."""
    with gzip.open(path, "rb") if gz else open(path, "rb") as f:
        head = f.read(MAX_LINE)
    if b"\0" in head:
        raise ConfigError(f"{name}: NUL bytes in the first MiB: a binary or sparse file, not "
                          "a log; pass " + EXPECTED)
    if len(head) == MAX_LINE and b"\n" not in head:
        raise ConfigError(f"{name}: no line break in the first MiB: not a log of lines; "
                          "pass " + EXPECTED)


__all__ = ["Call", "RankCalls", "Trace", "read_traces"]
