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
  `hash_ids`, ignored: prefix caching is not modelled).
- Plain JSONL: one `{"arrival_s": 0.0, "prompt": 100, "output": 3}` a line.
- `poisson:rate=R,count=N,prompt=P,output=O,seed=S`: N requests whose gaps are exponential
  with mean 1/R seconds (the first arrives at 0); P and O are a token count or `LO..HI`
  (uniform integers, both ends included); seed defaults to 0.
"""

import csv
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from patterns.errors import ConfigError

# Refused before any work: a trace of more requests than this, or a request longer than
# this many tokens (no model has 10^8 positions; the model's own limit is checked later).
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 100_000_000
MAX_ARRIVAL_S = 365 * 24 * 3600.0


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt: int  # prompt tokens
    output: int  # output tokens, the one the last prefill chunk samples included


def _tokens(value: object, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ConfigError(f"{where}: {what} {value!r} must be a whole number of tokens")
    if not 1 <= value <= MAX_TOKENS:
        raise ConfigError(f"{where}: {what} {int(value)} must be between 1 and {MAX_TOKENS:,} "
                          "tokens")
    return int(value)


def _arrival(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: arrival {value!r} must be a finite number of seconds")
    if not 0 <= value <= MAX_ARRIVAL_S:
        raise ConfigError(f"{where}: arrival {value} s must be between 0 and a year "
                          f"({MAX_ARRIVAL_S:.0f} s)")
    return float(value)


def _count_guard(n: int, source: str) -> None:
    if n > MAX_REQUESTS:
        raise ConfigError(f"{source}: more than {MAX_REQUESTS:,} requests; use a trace of at "
                          f"most {MAX_REQUESTS:,} lines")


def _azure_time(text: str, where: str) -> float:
    day, _, clock = text.strip().partition(" ")
    whole, _, frac = clock.partition(".")
    try:  # datetime takes at most 6 fractional digits; Azure writes 7
        moment = datetime.fromisoformat(f"{day} {whole}")
    except ValueError:
        raise ConfigError(f"{where}: TIMESTAMP {text!r} is not a date and time like "
                          "2023-11-16 18:15:46.6805900") from None
    if frac and not frac.isdigit():
        raise ConfigError(f"{where}: TIMESTAMP {text!r} has a bad fraction of a second")
    return moment.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def read_azure(path: Path) -> list[Request]:
    out: list[Request] = []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = [c.strip() for c in next(reader, [])]
        want = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        if header[:3] != want:
            raise ConfigError(f"{path}: line 1 is {','.join(header)!r}; an Azure trace starts "
                              f"with {','.join(want)}")
        start = None
        for n, row in enumerate(reader, start=2):
            _count_guard(len(out) + 1, str(path))
            where = f"{path}:{n}"
            if len(row) < 3:
                raise ConfigError(f"{where}: {len(row)} fields; want TIMESTAMP,ContextTokens,"
                                  "GeneratedTokens")
            t = _azure_time(row[0], where)
            start = t if start is None else start
            try:
                prompt, output = int(row[1]), int(row[2])
            except ValueError:
                raise ConfigError(f"{where}: ContextTokens and GeneratedTokens must be "
                                  f"integers, not {row[1]!r}, {row[2]!r}") from None
            out.append(Request(_arrival(round(t - start, 6), where),
                               _tokens(prompt, "ContextTokens", where),
                               _tokens(output, "GeneratedTokens", where)))
    return out


# The keys of each JSONL format: (arrival key, seconds per unit, prompt key, output key).
JSONL_FORMATS = {"plain": ("arrival_s", 1.0, "prompt", "output"),
                 "mooncake": ("timestamp", 1e-3, "input_length", "output_length")}


def read_jsonl(path: Path) -> list[Request]:
    out: list[Request] = []
    keys = None
    with path.open() as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            _count_guard(len(out) + 1, str(path))
            where = f"{path}:{n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: not JSON ({e.msg}); want one "
                                  '{"arrival_s": 0.0, "prompt": 100, "output": 3} a line') from None
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
            out.append(Request(_arrival(arrival, where), _tokens(obj[prompt_key], prompt_key,
                                                                 where),
                               _tokens(obj[output_key], output_key, where)))
    return out


def _length(text: str, what: str, spec: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("..")
    try:
        pair = (int(lo), int(hi)) if sep else (int(text), int(text))
    except ValueError:
        raise ConfigError(f"{spec}: {what}={text!r} must be a token count or LO..HI") from None
    for v in pair:
        _tokens(v, what, spec)
    if pair[0] > pair[1]:
        raise ConfigError(f"{spec}: {what}={text} has LO above HI")
    return pair


def poisson(spec: str) -> list[Request]:
    """`poisson:rate=..,count=..,prompt=..,output=..[,seed=..]`."""
    fields: dict[str, str] = {}
    for part in spec.removeprefix("poisson:").split(","):
        key, eq, value = part.partition("=")
        if not eq:
            raise ConfigError(f"{spec}: {part!r} is not KEY=VALUE; want poisson:rate=10,"
                              "count=100,prompt=512,output=128,seed=0")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"rate", "count", "prompt", "output", "seed"}
    missing = {"rate", "count", "prompt", "output"} - set(fields)
    if unknown or missing:
        raise ConfigError(f"{spec}: " + (f"unknown {', '.join(sorted(unknown))}" if unknown
                                          else f"missing {', '.join(sorted(missing))}")
                          + "; keys are rate, count, prompt, output, seed")
    try:
        rate, count, seed = float(fields["rate"]), int(fields["count"]), int(fields.get("seed",
                                                                                        "0"))
    except ValueError:
        raise ConfigError(f"{spec}: rate must be a number, count and seed integers") from None
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"{spec}: rate {rate} must be a positive number of requests a second")
    if count < 1:
        raise ConfigError(f"{spec}: count {count} must be a positive integer")
    _count_guard(count, spec)
    prompt, output = _length(fields["prompt"], "prompt", spec), _length(fields["output"],
                                                                        "output", spec)
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(count):
        if i:
            t += rng.expovariate(rate)
        out.append(Request(round(t, 6), rng.randint(*prompt), rng.randint(*output)))
    if t > MAX_ARRIVAL_S:
        raise ConfigError(f"{spec}: the last request arrives after a year; raise the rate")
    return out


def read_requests(source: str) -> list[Request]:
    """The requests of `--requests`, sorted by arrival (stable: file order breaks ties)."""
    if source.startswith("poisson:"):
        requests = poisson(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"--requests {source}: no such file; give a .csv (Azure), "
                              ".jsonl (Mooncake or plain) file, or poisson:rate=..,count=..,"
                              "prompt=..,output=..")
        try:
            requests = read_azure(path) if path.suffix.lower() == ".csv" else read_jsonl(path)
        except UnicodeDecodeError:
            raise ConfigError(f"--requests {source}: not a text file") from None
    if not requests:
        raise ConfigError(f"--requests {source}: no requests in it")
    return sorted(requests, key=lambda r: r.arrival_s)
