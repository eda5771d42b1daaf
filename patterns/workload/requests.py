"""Request workloads: arrival time, prompt tokens and output tokens of each request.

Readers of the public trace formats people replay serving engines with, and a Poisson
generator. Every reader refuses bad lines with one message naming the line and what would be
right (`ConfigError`), and absurd sizes before any scheduling work:

- Azure LLM inference traces (Azure/AzurePublicDataset, `AzureLLMInferenceTrace_*.csv`): a
  CSV with the header `TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP a date and time
  such as `2023-11-16 18:15:46.6805900` (any number of fractional digits: 100 ns ticks in
  the 2023 traces, milliseconds in some copies); arrival = seconds after the first line's
  TIMESTAMP.
- Mooncake traces (kvcache-ai/Mooncake `mooncake_trace.jsonl` @ d21da178 and its
  FAST'25 traces): one JSON object a line with `timestamp` ("the arrival time (in
  milliseconds) of the request since the first request", ai-dynamo/dynamo
  `benchmarks/data_generator/README.md`), `input_length`, `output_length` (and
  `hash_ids`, ignored: they are not read as shared prefixes).
- Plain JSONL: one `{"arrival_s": 0.0, "prompt": 100, "output": 3}` a line, optionally with
  `"prefix_id"` and `"prefix_tokens"`: a prompt prefix shared with the requests of that
  prefix_id (`patterns/workload/prefix.py`).
- `poisson:rate=R,count=N,prompt=P,output=O,seed=S`: N requests whose gaps are exponential
  with mean 1/R seconds (the first arrives at 0); P and O are a token count or `LO..HI`
  (uniform integers, both ends included); seed defaults to 0.
"""

import csv
import json
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from patterns.errors import ConfigError, number_text, shown
from patterns.workload.prefix import read_prefix

# Refused before any work: a trace of more requests than this, or a request longer than
# this many tokens (no model has 10^8 positions; the model's own limit is checked later).
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 100_000_000
MAX_ARRIVAL_S = 365 * 24 * 3600.0
# A line longer than this is no request (a Mooncake line with its hash_ids is a few KiB):
# a damaged file, or one endless line, refused after reading this much of it.
MAX_LINE = 1 << 20
MAX_DIGITS = 30  # an integer of more digits is no token count or time
WANT_JSONL = '{"arrival_s": 0.0, "prompt": 100, "output": 3}'


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt: int  # prompt tokens
    output: int  # output tokens, the one the last prefill chunk samples included
    # The first prefix_tokens prompt tokens are those of every request of this prefix_id
    # (patterns/workload/prefix.py); None: the prompt shares nothing.
    prefix_id: str | None = None
    prefix_tokens: int = 0
    # Its line in the --requests file (0: generated), which a refusal after sorting names.
    line: int = field(default=0, compare=False)


def _tokens(value: object, what: str, where: str) -> int:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)):
        raise ConfigError(f"{where}: {what} {number_text(value)} must be a whole number of "
                          "tokens")
    if not 1 <= value <= MAX_TOKENS:
        raise ConfigError(f"{where}: {what} {number_text(int(value))} must be between 1 and "
                          f"{MAX_TOKENS:,} tokens")
    return int(value)


def _arrival(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: arrival {number_text(value)} must be a finite number of "
                          "seconds")
    if not 0 <= value <= MAX_ARRIVAL_S:
        raise ConfigError(f"{where}: arrival {number_text(value)} s must be between 0 and a "
                          f"year ({MAX_ARRIVAL_S:.0f} s)")
    return float(value)


def _count_guard(n: int, source: str) -> None:
    if n > MAX_REQUESTS:
        raise ConfigError(f"{source}: more than {MAX_REQUESTS:,} requests; use a trace of at "
                          f"most {MAX_REQUESTS:,} lines")


def _lines(f: "Iterator[str]", path: Path) -> Iterator[str]:
    """The file's lines, each read at most MAX_LINE characters at a time (a 1 GB line is
    refused after 1 MiB of it, not read whole)."""
    n = 0
    while True:
        line = f.readline(MAX_LINE + 1)  # type: ignore[attr-defined]
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE:
            raise ConfigError(f"{path}:{n}: a line longer than {MAX_LINE >> 20} MiB; a "
                              "request is one short line")
        yield line


def _azure_time(text: str, where: str) -> float:
    """Seconds since the epoch of an Azure TIMESTAMP, read as UTC (the traces' clock): the
    same arrivals on every machine, whatever its time zone and summer time."""
    day, _, clock = text.strip().partition(" ")
    whole, _, frac = clock.partition(".")
    try:  # datetime takes at most 6 fractional digits; Azure writes 7
        moment = datetime.fromisoformat(f"{day} {whole}")
    except ValueError:
        raise ConfigError(f"{where}: TIMESTAMP {shown(text)!r} is not a date and time like "
                          "2023-11-16 18:15:46.6805900") from None
    if frac and not (frac.isascii() and frac.isdigit() and len(frac) <= 12):
        raise ConfigError(f"{where}: TIMESTAMP {shown(text)!r} has a bad fraction of a second")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def read_azure(path: Path) -> list[Request]:
    """Arrival = seconds after the earliest TIMESTAMP (a file not in time order is sorted by
    read_requests, as a JSONL trace is). Refusals name the line and quote no field of it
    beyond an escaped, shortened value: a file given by mistake (a key, a password) is not
    printed."""
    times: list[tuple[float, int, int, str]] = []
    with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: a BOM is no header text
        reader = csv.reader(_lines(f, path))
        try:
            header = [c.strip() for c in next(reader, [])]
            if header[:3] != AZURE_HEADER:
                raise ConfigError(f"{path}:1: not the header of an Azure trace; an Azure "
                                  f"trace starts with {','.join(AZURE_HEADER)}")
            for row in reader:
                n = reader.line_num
                _count_guard(len(times) + 1, str(path))
                where = f"{path}:{n}"
                if len(row) < 3:
                    raise ConfigError(f"{where}: {len(row)} fields; want TIMESTAMP,"
                                      "ContextTokens,GeneratedTokens")
                t = _azure_time(row[0], where)
                try:
                    prompt, output = _integer(row[1]), _integer(row[2])
                except ValueError:
                    raise ConfigError(f"{where}: ContextTokens and GeneratedTokens must be "
                                      f"integers, not {shown(row[1], 20)!r}, "
                                      f"{shown(row[2], 20)!r}") from None
                times.append((t, _tokens(prompt, "ContextTokens", where),
                              _tokens(output, "GeneratedTokens", where), where, n))
        except csv.Error as err:  # a field over csv's 128 KiB limit, a NUL byte
            raise ConfigError(f"{path}:{reader.line_num}: not a CSV line ({err}); an "
                              f"Azure trace is {','.join(AZURE_HEADER)} lines") from None
    start = min((t for t, *_ in times), default=0.0)
    return [Request(_arrival(round(t - start, 6), where), prompt, output, line=n)
            for t, prompt, output, where, n in times]


def _integer(text: str) -> int:
    text = text.strip()
    # int() also reads '１０' (full-width digits) and '1_0': a count is ASCII digits
    if len(text) > MAX_DIGITS or not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(text)
    return int(text)


# The keys of each JSONL format: (arrival key, seconds per unit, prompt key, output key).
JSONL_FORMATS = {"plain": ("arrival_s", 1.0, "prompt", "output"),
                 "mooncake": ("timestamp", 1e-3, "input_length", "output_length")}


class _NotARequest(ValueError):
    """A JSON value no request holds (NaN, Infinity, an integer of hundreds of digits)."""


def _json_constant(name: str) -> float:
    raise _NotARequest(f"{name} is not a number of tokens or seconds")


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _NotARequest(f"an integer of {len(text.lstrip('-')):,} digits")
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400
        raise _NotARequest(f"{shown(text, 20)} is beyond any float")
    return value


def _json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A key given twice in one request is refused, not read as its last value."""
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise _NotARequest(f"key {shown(key, 20)!r} is given twice")
        obj[key] = value
    return obj


def _json_line(line: str, where: str) -> object:
    try:
        return json.loads(line, parse_constant=_json_constant, parse_int=_json_int,
                          parse_float=_json_float, object_pairs_hook=_json_object)
    except _NotARequest as err:
        raise ConfigError(f"{where}: {err}; want {WANT_JSONL} a line") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg} at column {e.colno}); want "
                          f"{WANT_JSONL} a line") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deep; want {WANT_JSONL} a "
                          "line") from None


def read_jsonl(path: Path) -> list[Request]:
    out: list[Request] = []
    keys = None
    with path.open(encoding="utf-8-sig") as f:
        for n, line in enumerate(_lines(f, path), start=1):
            if not line.strip():
                continue
            _count_guard(len(out) + 1, str(path))
            where = f"{path}:{n}"
            obj = _json_line(line, where)
            if not isinstance(obj, dict):
                raise ConfigError(f"{where}: a JSON object a line, not {type(obj).__name__}")
            if keys is None:
                keys = next((k for k in JSONL_FORMATS.values() if k[0] in obj), None)
                if keys is None:
                    raise ConfigError(f"{where}: no arrival_s (plain) or timestamp (Mooncake) "
                                      "key")
            arrival_key, unit, prompt_key, output_key = keys
            missing = [k for k in (arrival_key, prompt_key, output_key) if k not in obj]
            if missing:
                raise ConfigError(f"{where}: missing {', '.join(missing)}")
            arrival = obj[arrival_key]
            if isinstance(arrival, int | float) and not isinstance(arrival, bool):
                arrival = arrival * unit
            prompt = _tokens(obj[prompt_key], prompt_key, where)
            out.append(Request(_arrival(arrival, where), prompt,
                               _tokens(obj[output_key], output_key, where),
                               *read_prefix(obj, prompt, where), line=n))
    return out


def _length(text: str, what: str, spec: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("..")
    try:
        pair = (_integer(lo), _integer(hi)) if sep else (_integer(text), _integer(text))
    except ValueError:
        raise ConfigError(f"{spec}: {what}={shown(text, 40)!r} must be a token count or "
                          "LO..HI") from None
    for v in pair:
        _tokens(v, what, spec)
    if pair[0] > pair[1]:
        raise ConfigError(f"{spec}: {what}={shown(text, 40)} has LO above HI")
    return pair


POISSON_KEYS = ("rate", "count", "prompt", "output", "seed")


def poisson(spec: str) -> list[Request]:
    """`poisson:rate=..,count=..,prompt=..,output=..[,seed=..]`."""
    fields: dict[str, str] = {}
    name = shown(spec, 80)
    for part in spec.removeprefix("poisson:").split(","):
        key, eq, value = part.partition("=")
        if not eq:
            raise ConfigError(f"{name}: {shown(part, 40)!r} is not KEY=VALUE; want "
                              "poisson:rate=10,count=100,prompt=512,output=128,seed=0")
        if key.strip() in fields:
            raise ConfigError(f"{name}: {shown(key.strip(), 20)} is given twice; give each "
                              f"of {', '.join(POISSON_KEYS)} once")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - set(POISSON_KEYS)
    missing = {"rate", "count", "prompt", "output"} - set(fields)
    if unknown or missing:
        said = (f"unknown {', '.join(shown(k, 20) for k in sorted(unknown))}" if unknown
                else f"missing {', '.join(sorted(missing))}")
        raise ConfigError(f"{name}: {said}; keys are rate, count, prompt, output, seed")
    try:
        rate = float(fields["rate"])
        count, seed = _integer(fields["count"]), _integer(fields.get("seed", "0"))
    except ValueError:
        raise ConfigError(f"{name}: rate must be a number, count and seed integers of at most "
                          f"{MAX_DIGITS} digits") from None
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"{name}: rate {number_text(rate)} must be a positive number of "
                          "requests a second")
    if count < 1:
        raise ConfigError(f"{name}: count {count} must be a positive integer")
    _count_guard(count, name)
    prompt, output = _length(fields["prompt"], "prompt", name), _length(fields["output"],
                                                                        "output", name)
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(count):
        if i:
            t += rng.expovariate(rate)
        out.append(Request(round(t, 6), rng.randint(*prompt), rng.randint(*output)))
    if t > MAX_ARRIVAL_S:
        raise ConfigError(f"{name}: the last request arrives after a year; raise the rate")
    return out


WANT = ("give a .csv (Azure), .jsonl (Mooncake or plain) file, or poisson:rate=..,count=..,"
        "prompt=..,output=..")


def _check_file(source: str) -> Path:
    """The path of a regular file; a folder, a named pipe, a device or standard input said
    for what it is (reading a pipe could wait for ever)."""
    path = Path(source)
    name = shown(source, 120)
    if not path.exists():
        raise ConfigError(f"--requests {name}: no such file; {WANT}")
    if path.is_dir():
        raise ConfigError(f"--requests {name}: a folder; {WANT}")
    if not path.is_file():
        raise ConfigError(f"--requests {name}: not a regular file (a named pipe, a device or "
                          f"standard input, which is read once and could wait for ever); "
                          f"save the workload to a file and {WANT}")
    return path


def read_workload(source: str) -> tuple[list[Request], str | None]:
    """The requests of `--requests`, sorted by arrival (stable: file order breaks ties), and
    a note when the file was not in time order (None otherwise)."""
    if source.startswith("poisson:"):
        requests = poisson(source)
    else:
        path = _check_file(source)
        try:
            requests = read_azure(path) if path.suffix.lower() == ".csv" else read_jsonl(path)
        except UnicodeDecodeError as err:
            raise ConfigError(f"--requests {shown(source, 120)}: not UTF-8 text (byte "
                              f"{err.start:,}); {WANT}") from None
        except OSError as err:
            raise ConfigError(f"--requests {shown(source, 120)}: cannot be read "
                              f"({err.strerror}); {WANT}") from None
    if not requests:
        raise ConfigError(f"--requests {shown(source, 120)}: no requests in it")
    late = next((i for i in range(1, len(requests))
                 if requests[i].arrival_s < requests[i - 1].arrival_s), None)
    note = None
    if late is not None:
        unsorted = sum(requests[i].arrival_s < requests[i - 1].arrival_s
                       for i in range(1, len(requests)))
        places = "one place" if unsorted == 1 else f"{unsorted:,} places"
        note = (f"--requests {shown(source, 120)} is not in time order (request {late + 1} "
                f"of the file arrives before request {late}; {places} in all): its requests "
                "are taken in order of arrival")
    return sorted(requests, key=lambda r: r.arrival_s), note


def read_requests(source: str) -> list[Request]:
    """The requests of `--requests`, sorted by arrival (stable: file order breaks ties)."""
    return read_workload(source)[0]
