"""A run folder as pandas DataFrames, every file validated as it is read.

`microbench.results.load(path)` is the public entry (pandas is imported only then); compare,
report, predict and plot read through it (via runs.py), so a notebook sees exactly the
numbers the commands use. A file that is cut short, has a row without a value, a
non-number where a number belongs, or a meta.json that is not a UTF-8 JSON object with the
keys readers need is refused with UsageError: one line naming the file and what is wrong
(exit status 2), never a traceback and never a figure computed from no data.
"""

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from microbench.argtypes import UsageError
from microbench.results.grids import grid_message
from patterns.errors import number_text

KINDS = ("replay", "sweep", "kvtransfer")


@dataclass(frozen=True)
class Schema:
    """Columns of one csv file: kind ("int", "float", "str") and whether a value is needed."""
    required: dict[str, str]
    optional: dict[str, str]


# What replay/output.py and cli/sweep.py write; optional columns may be absent or empty.
SCHEMAS = {
    "iterations.csv": Schema(
        {"iteration": "int", "prefill_us": "float", "decode_us": "float", "e2e_us": "float"},
        {"decode_step_mean_us": "float", "decode_step_median_us": "float",
         "decode_step_p99_us": "float", "decode_step_max_us": "float"}),
    "ops.csv": Schema(
        {"iteration": "int", "rank": "int", "op": "str", "time_us": "float"},
        {"stage": "int", "phase": "str", "step": "int", "call": "int", "tag": "str",
         "group": "str", "bytes": "int"}),
    "samples.csv": Schema(
        {"op": "str", "size_bytes": "int", "iteration": "int", "time_us": "float"},
        {"dtype": "str", "group_size": "int"}),
    "sweep.csv": Schema(
        {"op": "str", "size_bytes": "int", "group_size": "int", "time_us": "float",
         "time_p5_us": "float", "time_p95_us": "float", "algbw_gbps": "float",
         "busbw_gbps": "float"},
        {"count": "int", "dtype": "str", "wrong": "int", "calls_per_inference": "int",
         "time_run_us": "float"}),
}

# A disaggregated replay's iterations.csv (replay/kv_transfer.py): one request's KV transfer,
# the slowest rank's time, per timed iteration.
KV_ITERATIONS = Schema({"iteration": "int", "kv_transfer_us": "float"},
                       {"prefill_comm_us": "float", "ttft_comm_us": "float",
                        "decode_step_us": "float"})  # --with-collectives

# The file each kind cannot do without (its per-iteration samples).
NEEDED = {"replay": "iterations.csv", "sweep": "samples.csv", "kvtransfer": "iterations.csv"}


def read_meta(folder: Path) -> dict[str, Any]:
    """meta.json as a dict, with the keys readers rely on checked."""
    path = folder / "meta.json"
    if not path.is_file():
        if (grid := grid_message(folder)) is not None:
            raise UsageError(grid)
        raise UsageError(f"{str(folder)!r} is not a run folder (no meta.json); pass a folder "
                         "that replay or sweep wrote")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not UTF-8 text (byte {err.start}); a run's meta.json is "
                         "UTF-8 JSON") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot read ({err.strerror})") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: a JSON {type(meta).__name__}, not an object of run "
                         "metadata")
    kind = meta.get("kind")
    if kind not in KINDS:
        raise UsageError(f"{path}: kind {kind!r} is not a run infercomm reads (replay, sweep "
                         "or kvtransfer)")
    _need(path, meta, "argv", list, "the command line, a list")
    _need(path, meta, "backend", str, "a name")
    for key, json_type, what in OPTIONAL_META:  # read by compare, report, plot if present
        value = meta.get(key)
        if value is not None and not isinstance(value, json_type):
            raise UsageError(f"{path}: {key} is a JSON {_json_type(value)}, not {what}; not "
                             "a meta.json infercomm wrote")
    hosts = meta.get("hosts")
    if isinstance(hosts, list) and not all(isinstance(h, str) for h in hosts):
        raise UsageError(f"{path}: hosts holds a value that is not a host name; not a "
                         "meta.json infercomm wrote")
    world = _need(path, meta, "world_size", int, "a positive integer")
    if world < 1:
        raise UsageError(f"{path}: world_size {world} must be a positive integer")
    if kind == "kvtransfer":  # the counts report's table prints (a string was a traceback)
        for key in ("kv_transfer_bytes", "pairs", "descriptors"):
            value = meta.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 <= value < 1 << 63):
                raise UsageError(f"{path}: {key} is {number_text(value)}, not a count of at "
                                 "most 2^63; not a meta.json infercomm wrote")
    if kind == "replay":
        pattern = _need(path, meta, "pattern", dict, "the replayed pattern, an object")
        for key in ("model", "layout", "workload", "engine"):
            _need(path, pattern, key, dict, "an object", f"pattern.{key}")
        steps = _need(path, pattern["workload"], "decode_steps", int,
                      "an integer", "pattern.workload.decode_steps")
        if steps < 0:
            raise UsageError(f"{path}: pattern.workload.decode_steps {steps} is negative")
    return meta


# Keys a run may lack but, when present, must have the type readers take them as.
OPTIONAL_META = (("environment", dict, "an object of variables"),
                 ("versions", dict, "an object of library versions"),
                 ("hosts", list, "a list of host names"),
                 ("pattern", dict, "the replayed pattern, an object"))


def _json_type(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def _need(path: Path, where: dict[str, Any], key: str, kind: type, what: str,
          name: str | None = None) -> Any:
    name = name or key
    if key not in where:
        raise UsageError(f"{path}: no {name!r} ({what}); not a complete run's meta.json")
    value = where[key]
    # bool is an int to Python, never a count to us.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UsageError(f"{path}: {name} is {value!r}, not {what}")
    return value


def read_table(path: Path, schema: Schema) -> pd.DataFrame:
    """One csv file with every column of the schema converted and checked."""
    fast = _read_typed(path, schema)
    if fast is not None:
        return fast
    return _read_checked(path, schema)


_DTYPES = {"int": "int64", "float": "float64", "str": "str"}


def _read_typed(path: Path, schema: Schema) -> pd.DataFrame | None:
    """A sound file read straight into its types (ops.csv can have millions of rows); None
    when anything is off, for _read_checked to find and name it."""
    columns = {**schema.required, **schema.optional}
    try:
        frame = pd.read_csv(path, dtype={c: _DTYPES[k] for c, k in columns.items()},
                            keep_default_na=False, encoding="utf-8")
    except (ValueError, TypeError, OSError, pd.errors.ParserError):
        return None
    if frame.empty or any(c not in frame.columns for c in schema.required):
        return None
    for column, kind in columns.items():
        if column not in frame.columns or kind == "str":
            continue
        values = frame[column]
        if kind == "float" and not values.abs().lt(float("inf")).all():  # nan, inf
            return None
        if (values < 0).any():
            return None
    for column, kind in columns.items():
        if kind == "str" and column in schema.required and (
                frame[column].isna().any() or (frame[column].str.strip() == "").any()):
            return None  # a row cut short leaves NaN, a blank field ""
    return frame


def _read_checked(path: Path, schema: Schema) -> pd.DataFrame:
    """Every value as text first, so that the first wrong one is named with its line."""
    try:
        # All as text first: the checks below name the line and the value that is wrong.
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except pd.errors.EmptyDataError:
        raise UsageError(f"{path}: empty (not even a header)") from None
    except pd.errors.ParserError as err:
        raise UsageError(f"{path}: not a well-formed csv ({str(err).strip()})") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot read ({err.strerror})") from None
    missing = [c for c in schema.required if c not in frame.columns]
    if missing:
        raise UsageError(f"{path}: no column {', '.join(missing)} (header: "
                         f"{','.join(map(str, frame.columns))}); a file cut short or not "
                         "written by infercomm")
    if frame.empty:
        raise UsageError(f"{path}: a header and no rows; no samples to read")
    # A row with fewer fields than the header reads as missing values (NaN) here.
    frame = frame.fillna("")
    columns = {**{c: (k, True) for c, k in schema.required.items()},
               **{c: (k, False) for c, k in schema.optional.items() if c in frame.columns}}
    for column, (kind, required) in columns.items():
        frame[column] = _convert(path, frame[column], column, kind, required)
    return frame


def _convert(path: Path, text: pd.Series, column: str, kind: str, required: bool) -> pd.Series:
    blank = text.str.strip() == ""
    if required and blank.any():
        line = int(blank.idxmax()) + 2  # line 1 is the header
        raise UsageError(f"{path}: line {line} has no {column} value")
    if kind == "str":
        return text
    numbers = pd.to_numeric(text.where(~blank), errors="coerce")
    # "nan", "inf" and words are not measurements.
    bad = ~blank & (numbers.isna() | ~numbers.abs().lt(float("inf")))
    if kind == "int":
        bad |= ~blank & numbers.notna() & (numbers != numbers.round())
    if bad.any():
        line = int(bad.idxmax()) + 2
        want = "an integer" if kind == "int" else "a number"
        raise UsageError(f"{path}: line {line}: {column} is {text[bad.idxmax()]!r}, not {want}")
    negative = ~blank & (numbers < 0)
    if negative.any():  # times, sizes, counts and indices are never below zero
        line = int(negative.idxmax()) + 2
        raise UsageError(f"{path}: line {line}: {column} is {text[negative.idxmax()]}; it "
                         "cannot be negative")
    if kind == "int":
        return numbers.astype("Int64") if blank.any() else numbers.astype("int64")
    return numbers.astype("float64")


def check_rows(path: Path, frame: pd.DataFrame, iterations: object) -> None:
    """The rows a file must have for the run meta.json describes: every timed iteration once
    (iterations.csv; each case of samples.csv), none beyond (ops.csv), no row twice. A file
    cut short or pasted into fails here rather than giving figures from the wrong rows."""
    if path.name not in ("iterations.csv", "samples.csv", "ops.csv"):
        return
    expected = iterations if isinstance(iterations, int) and not isinstance(
        iterations, bool) and iterations > 0 else None
    if expected is not None:
        beyond = frame["iteration"] >= expected
        if beyond.any():
            line = int(beyond.idxmax()) + 2
            raise UsageError(f"{path}: line {line}: iteration {frame['iteration'][line - 2]}, "
                             f"but meta.json says {expected} timed iterations")
    if path.name == "ops.csv":
        return
    keys = ["iteration"] if path.name == "iterations.csv" else [
        c for c in ("op", "size_bytes", "dtype", "group_size", "iteration") if c in frame]
    twice = frame.duplicated(subset=keys)
    if twice.any():
        line = int(twice.idxmax()) + 2
        raise UsageError(f"{path}: line {line} repeats an earlier row's "
                         f"{', '.join(keys)}; each timed iteration is one row")
    if expected is None:
        return
    cases = frame.groupby(keys[:-1], sort=False).size() if keys[:-1] else pd.Series(
        [len(frame)])
    short = cases[cases != expected]
    if len(short):
        which = "" if not keys[:-1] else f" for {short.index[0]}"
        raise UsageError(f"{path}: {int(short.iloc[0])} rows{which}, but meta.json says "
                         f"{expected} timed iterations; the file is cut short or not this "
                         "run's")
    partial = [c for c in frame.columns if frame[c].isna().any() and frame[c].notna().any()]
    if partial:
        line = int(frame[partial[0]].isna().idxmax()) + 2
        raise UsageError(f"{path}: line {line} has no {partial[0]} value where other rows "
                         "have one; the row was cut short")


def flatten(meta: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested keys joined with dots: pattern.workload.decode_steps; lists kept as values."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


class Results:
    """One run folder: `.meta` (flattened dict), `.raw_meta` (as written), and DataFrames
    `.iterations`, `.ops` (replay), `.samples`, `.sweep` (sweep), None where the run has no
    such file. Tables are read and validated on first use (ops.csv can be large)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.raw_meta = read_meta(self.path)
        self.meta = flatten(self.raw_meta)
        self.kind: str = self.raw_meta["kind"]
        needed = NEEDED[self.kind]
        if not (self.path / needed).is_file():
            raise UsageError(f"{self.path}: a {self.kind} run folder without {needed}")

    def __repr__(self) -> str:
        return f"Results({str(self.path)!r}, kind={self.kind!r})"

    def has(self, filename: str) -> bool:
        return (self.path / filename).is_file()

    def table(self, filename: str) -> pd.DataFrame | None:
        if not self.has(filename):
            return None
        schema = KV_ITERATIONS if (self.kind, filename) == ("kvtransfer",
                                                            "iterations.csv") else SCHEMAS[filename]
        frame = read_table(self.path / filename, schema)
        check_rows(self.path / filename, frame, self.raw_meta.get("iterations"))
        return frame

    @cached_property
    def iterations(self) -> pd.DataFrame | None:
        return self.table("iterations.csv")

    @cached_property
    def ops(self) -> pd.DataFrame | None:
        return self.table("ops.csv")

    @cached_property
    def samples(self) -> pd.DataFrame | None:
        return self.table("samples.csv")

    @cached_property
    def sweep(self) -> pd.DataFrame | None:
        return self.table("sweep.csv")

    @cached_property
    def meta_frame(self) -> pd.DataFrame:
        """The flattened metadata as a one-row DataFrame (to concat runs side by side)."""
        return pd.DataFrame([{k: (json.dumps(v) if isinstance(v, list | dict) else v)
                              for k, v in self.meta.items()}])
