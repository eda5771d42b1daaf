"""The pieces of patterns.traces on small inputs whose answers are worked out by hand."""

import gzip
import json
from pathlib import Path

import pytest

from patterns import ConfigError
from patterns.traces import kineto
from patterns.traces.steps import find_period, fold, split_steps


def test_period_of_a_prefill_then_repeated_decode_steps() -> None:
    # prefill: 3 calls of kind 1 then a 2; decode: 3 calls of kind 3 then a 4, five times
    ids = [1, 1, 1, 2] + [3, 3, 3, 4] * 5
    assert find_period(ids) == 4  # the last call (4) recurs every 4 calls
    steps = split_steps(ids, None)
    assert steps == [(0, 4)] + [(b, b + 4) for b in range(4, 24, 4)]
    assert fold(ids, steps) == [((1, 1, 1, 2), 1), ((3, 3, 3, 4), 5)]


def test_a_head_that_is_not_whole_periods_is_one_step() -> None:
    ids = [5, 7] + [3, 3, 4] * 3  # 2 calls, then 3 periods of 3
    assert split_steps(ids, None) == [(0, 2), (2, 5), (5, 8), (8, 11)]


def test_no_period_without_two_repeats() -> None:
    assert find_period([1, 2, 3]) is None
    assert split_steps([1, 2, 3], None) == [(0, 3)]


def test_annotated_steps_win_over_the_period() -> None:
    ids = [1, 1, 1, 1]
    assert split_steps(ids, [0, 3]) == [(0, 3), (3, 4)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_incremental_reader_across_chunk_boundaries(tmp_path: Path, chunk: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event and the header come out as json.load reads them, whatever the chunk."""
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4},
           "traceEvents": [{"ph": "X", "name": f"e{i}", "ts": 1234.5 + i, "dur": 10 ** i,
                            "args": {"Input Dims": [[i, 64]], "s": "a, ]}\" b"}}
                           for i in range(12)],
           "after": [1, 2, {"x": "y"}]}
    text = json.dumps(doc, indent=1)
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(text)
    monkeypatch.setattr(kineto, "CHUNK", chunk)
    header = {"distributedInfo": None, "after": None}
    events = list(kineto.iter_events(path, header))
    assert events == doc["traceEvents"]
    assert header == {"distributedInfo": doc["distributedInfo"], "after": doc["after"]}


def test_a_cut_off_trace_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "c10d::allreduce_", "ts": 1')
    from patterns.traces import read_traces
    with pytest.raises(ConfigError, match="not a readable Kineto JSON trace"):
        read_traces([str(path)])
