"""Kineto traces of gloo made by real PyTorch (tests/gloo_moe_calls.py: 2 ranks issue a
Megatron-Core MoE layer's calls at TP2 between all-reduces): every call read with its dtype.

gloo's `c10d::allreduce_` takes a TensorList, whose type the trace writes as "TensorList";
its dtype comes from the k-th `gloo:all_reduce` event. gloo records a `_reduce_scatter_base_`
as a `gloo:all_reduce` of its input too, so the all-reduces after a reduce-scatter were paired
with the event before theirs and read as dtype "unknown" (a MoE trace of Megatron at TP2 then
failed validate from its second MoE layer on).
"""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from microbench.ranks.launch import free_port
from patterns.traces import read_traces

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("gloo-moe")
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "gloo_moe_calls.py"), str(out),
                           "--port", str(free_port())], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sorted(str(p) for p in out.glob("rank*.json"))


def test_every_call_keeps_its_dtype_after_a_reduce_scatter(traces: list[str]) -> None:
    trace = read_traces(traces)
    assert [r.rank for r in trace.ranks] == [0, 1]
    for rank in trace.ranks:
        calls = [(c.op, c.numel, c.dtype) for c in trace.rank_calls(rank)]
        # tests/gloo_moe_calls.py's order: 8 * 2 * 128 = 2048, 16 * 4 = 64, 16 * 128 = 2048,
        # the reduce-scatter's input 32 * 128 = 4096, 1 * 2 * 128 = 256
        assert calls == [("allreduce", 2048, "fp32"), ("allgather", 64, "bool"),
                         ("allgather", 64, "fp32"), ("allgather", 2048, "fp32"),
                         ("reducescatter", 4096, "fp32"), ("allreduce", 2048, "bf16"),
                         ("allreduce", 256, "fp32")], rank.name
    assert trace.unparsed == 0


def test_trace_shows_no_unknown_dtype(traces: list[str], cli) -> None:
    status, out, err = cli("trace", *traces)
    assert status == 0, err
    assert "unknown" not in out
    # rows: rank, group, op, ...; per rank 3 all-reduces, 3 all-gathers, 1 reduce-scatter
    rows = Counter(line.split()[2] for line in out.splitlines()
                   if line.split()[:1] in (["0"], ["1"]))
    assert rows == {"allreduce": 6, "allgather": 6, "reducescatter": 2}, out
