"""A Kineto JSON trace read incrementally: the top-level `traceEvents` array is decoded one
event at a time from chunks of text (json's raw_decode), so a file is never held whole in
memory; `.json.gz` is decompressed as it is read."""

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from patterns.errors import ConfigError

CHUNK = 1 << 20


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class _Stream:
    """Text read in chunks; values decoded one at a time with json's raw_decode."""

    def __init__(self, f) -> None:
        self.f, self.buf, self.pos = f, "", 0
        self.decoder = json.JSONDecoder()

    def peek(self) -> str:
        """The next character that is not white space ('' at the end)."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            more = self.f.read(CHUNK)
            if not more:
                return ""
            self.buf, self.pos = more, 0

    def take(self) -> str:
        char = self.peek()
        self.pos += 1
        return char

    def value(self) -> Any:
        """Decode one JSON value; read more text while it is cut off."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                more = self.f.read(CHUNK)
                if not more:
                    raise
                self.buf, self.pos = self.buf[self.pos:] + more, 0
                continue
            if end == len(self.buf) and isinstance(value, (int, float)):
                more = self.f.read(CHUNK)  # a number may go on in the next chunk
                if more:
                    self.buf, self.pos = self.buf[self.pos:] + more, 0
                    continue
            self.pos = end
            if end > CHUNK:  # drop what was read, keep the buffer near one chunk
                self.buf, self.pos = self.buf[end:], 0
            return value


def iter_events(path: Path, header: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield the objects of the top-level `traceEvents` array one by one; the top-level
    values of the other keys named in `header` (e.g. distributedInfo) are filled in."""
    with _open_text(path) as f:
        s = _Stream(f)
        if s.take() != "{":
            raise ConfigError(f"{path}: not a Kineto JSON trace (no top-level object); pass "
                              "the .json or .json.gz that torch.profiler exported")
        while True:
            char = s.peek()
            if char == ",":
                s.take()
                continue
            if char in ("}", ""):
                return
            key = s.value()
            if s.take() != ":":
                raise ValueError("expected ':'")
            if key != "traceEvents":
                value = s.value()
                if key in header:
                    header[key] = value
                continue
            if s.take() != "[":
                raise ConfigError(f"{path}: traceEvents is not an array; pass the .json "
                                  "that torch.profiler exported")
            while True:
                char = s.peek()
                if char == ",":
                    s.take()
                    continue
                if char == "]":
                    s.take()
                    break
                if char == "":
                    raise ValueError("the traceEvents array is cut off")
                yield s.value()
