"""`--timing op`: every call's time, streamed to disk as taken, never all held in memory.

Each rank appends the call durations of each timed inference to its own file (float64, in
the system's temporary folder) between inferences, outside the timed region, and keeps only
per-step marks and per-kind sums in memory. After the replay the ranks send their files to
rank 0 in chunks of CHUNK samples, one rank after the other, and rank 0 writes ops.csv row by
row. Memory per rank is then one inference's marks plus one chunk, whatever -n and --decode.
"""

import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from patterns import Pattern

CHUNK = 1 << 18  # samples per transfer: 2 MiB of float64
OP_COLUMNS = ["iteration", "rank", "stage", "phase", "step", "call", "op", "tag", "group",
              "bytes", "time_us"]


class OpSampleFile:
    """One rank's call durations, appended per inference to an unlinked temporary file."""

    def __init__(self) -> None:
        # closed by close(); unlinked at once, so nothing is left whatever ends the rank
        self._file: IO[bytes] = tempfile.TemporaryFile(prefix="infercomm-ops-")  # noqa: SIM115
        self.count = 0

    def append(self, durations_us: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(durations_us, dtype=np.float64).tobytes())
        self.count += len(durations_us)

    def chunks(self, size: int = CHUNK) -> Iterator[np.ndarray]:
        self._file.flush()
        self._file.seek(0)
        while block := self._file.read(size * 8):
            yield np.frombuffer(block, dtype=np.float64)

    def close(self) -> None:
        self._file.close()


def _field(text: str) -> str:
    """A CSV field as the csv module writes it: quoted only when it must be."""
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _calls(pattern: Pattern, rank: int, iterations: int) -> Iterator[tuple[int, str]]:
    """(iteration, the row's text between rank and time) of each call, in issue order."""
    for i in range(iterations):
        step = 0
        for run in pattern.runs_of_rank(rank):
            texts = [f"{run.phase.value},{{}},{index},{op.kind.value},{_field(op.tag)},"
                     f"{_field(op.group)},{op.bytes}" for index, op in enumerate(run.step.ops)]
            for _ in range(run.repeat):
                for text in texts:
                    yield i, text.format(step)
                step += 1


def calls_of_rank(pattern: Pattern, rank: int) -> int:
    return sum(len(run.step.ops) * run.repeat for run in pattern.runs_of_rank(rank))


def estimate(pattern: Pattern, iterations: int) -> tuple[int, int]:
    """(rows, bytes) of ops.csv: every rank's calls of every timed inference, each row sized
    with the largest step and iteration numbers and a time of 7 digits and 3 decimals."""
    layout = pattern.layout
    rows = size = 0
    for rank in range(layout.world_size):
        stage = layout.stage_of(rank)
        runs = pattern.runs_of_rank(rank)
        steps = sum(run.repeat for run in runs)
        fixed = len(f"{iterations - 1},{rank},{stage},{steps - 1},,1234567.123\n")
        for run in runs:
            for index, op in enumerate(run.step.ops):
                text = (f"{run.phase.value},{index},{op.kind.value},{_field(op.tag)},"
                        f"{_field(op.group)},{op.bytes}")
                size += (fixed + len(text)) * run.repeat * iterations
            rows += len(run.step.ops) * run.repeat * iterations
    return rows, size + len(",".join(OP_COLUMNS)) + 1


def gather_to_csv(pattern: Pattern, mine: OpSampleFile, rank: int, iterations: int,
                  allgather: Callable[[Any], list[Any]], path: Path | None) -> OSError | None:
    """Every rank calls this; rank 0 (`path` set) writes ops.csv from all ranks' files.

    A write error on rank 0 stops the writing, not the transfer (the other ranks are in the
    same collectives); it is returned, for rank 0 to report.
    """
    layout = pattern.layout
    error: OSError | None = None
    out = None
    try:
        if path is not None:
            out = open(path, "w")  # noqa: SIM115 (closed in finally, also on error)
            out.write(",".join(OP_COLUMNS) + "\n")
    except OSError as err:
        error, out = err, None
    try:
        for sender in range(layout.world_size):
            stage = layout.stage_of(sender)
            total = calls_of_rank(pattern, sender) * iterations
            rows = _calls(pattern, sender, iterations)
            own = mine.chunks() if sender == rank else None
            for _ in range(math.ceil(total / CHUNK)):
                chunk = next(own) if own is not None else None
                received = allgather(chunk)[sender]
                if out is None:
                    continue
                try:
                    # received first: zip stops on it without taking a row it has no time for
                    out.writelines(f"{i},{sender},{stage},{text},{round(t, 3)}\n"
                                   for t, (i, text) in zip(received.tolist(), rows,
                                                           strict=False))
                except OSError as err:
                    error = err
                    out.close()
                    out = None
    finally:
        if out is not None:
            try:
                out.close()
            except OSError as err:
                error = err
    return error
