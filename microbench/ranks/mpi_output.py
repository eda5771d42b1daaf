"""mpiexec's output under `--nproc`: rank 0's table and JSON line forwarded to our stdout, with
MPICH's banner about a failed rank read for the rank and signal it names, and kept off stdout
(its last line stays the JSON object); and the one line that says how the MPI job failed."""

import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import IO

from microbench.ranks import notes
from microbench.results.store import WRITE_ERROR_EXIT_STATUS


class MpiBanner:
    """Forwards mpiexec's stdout (rank 0's table and JSON line) and keeps MPICH's banner
    about a failed rank out of it, so stdout's last line stays the JSON object."""

    _BANNER = ("=====", "=   ", "YOUR APPLICATION TERMINATED WITH THE EXIT STRING",
               "This typically refers to a problem with your application",
               "Please see the FAQ page for debugging suggestions")

    # UCX prints its errors on stdout ("[time] [host:pid:thread] file.c:N UCX  ERROR ..."),
    # e.g. when a peer dies during MPI start-up.
    _DIAGNOSTIC = re.compile(r"\bUCX\s+(ERROR|WARN|FATAL)\b")

    def __init__(self) -> None:
        self.closed = False  # our stdout was closed (`| head`): the rest is read and dropped
        self.pid: int | None = None
        self.host = ""
        self.exit_code: int | None = None
        self.signal: int | None = None

    def forward(self, stream: IO[bytes]) -> None:
        blank = False  # MPICH prints a blank line before its banner: hold one back
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            if line.startswith(self._BANNER):
                self._parse(line)
                blank = False
                continue
            if self._DIAGNOSTIC.search(line):  # a library's complaint belongs on stderr
                with contextlib.suppress(OSError):
                    sys.stderr.write(line)
                    sys.stderr.flush()
                continue
            self._write((b"\n" if blank else b"") + (raw if line.strip() else b""))
            blank = line.strip() == ""
        if blank:
            self._write(b"\n")

    def _write(self, data: bytes) -> None:
        """Onto our stdout; once it is closed, nothing (mpiexec's output is still read, so
        mpiexec never blocks on a full pipe), and the launcher ends the run (_MpiWatch)."""
        if self.closed or not data:
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except OSError:  # BrokenPipeError: the reader went away
            self.closed = True
            with contextlib.suppress(OSError):  # so the interpreter's last flush is quiet
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def _parse(self, line: str) -> None:
        if found := re.search(r"PID (\d+) RUNNING AT (\S+)", line):
            self.pid, self.host = int(found.group(1)), found.group(2)
        elif found := re.search(r"EXIT CODE: (\d+)", line):
            self.exit_code = int(found.group(1))
        elif found := re.search(r"\(signal (\d+)\)", line):
            self.signal = int(found.group(1))


def mpi_status(status: int, banner: MpiBanner, folder: Path, raw: int | None = None) -> int:
    """Name the rank and the signal MPICH reported (by pid), or say how mpiexec ended."""
    if status in (0, WRITE_ERROR_EXIT_STATUS) or (status == 1 and notes.wrong_by_rank(folder)):
        return status
    if banner.pid is not None:
        rank = notes.rank_of_pid(folder, banner.pid)
        who = f"rank {rank}" if rank is not None else "a rank"
        where = f"pid {banner.pid} on {banner.host}"
        if banner.signal is not None:
            sys.stderr.write(f"infercomm: error: {who} ({where}) was killed by signal "
                             f"{signal_name(banner.signal)}; mpiexec ended the other ranks\n")
            return 128 + banner.signal
        sys.stderr.write(f"infercomm: error: {who} ({where}) ended with exit status "
                         f"{banner.exit_code}; mpiexec ended the other ranks\n")
        return status
    # A signal is a negative return code; 255 is mpiexec's own status (Hydra: a proxy or a
    # rank was lost), not signal 127.
    killed = raw is not None and raw < 0
    how = f"signal {signal_name(-raw)}" if killed and raw is not None else \
        f"exit status {status}"
    lost = ("; its process manager lost a rank or a proxy, and every rank was ended"
            if status == 255 and not killed else "")
    sys.stderr.write(f"infercomm: error: mpiexec ended with {how}{lost}\n")
    return status


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
