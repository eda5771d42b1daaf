"""`replay --trace` and `pattern`'s header say what a trace holds, not a model it lacks."""
from pathlib import Path

from microbench.views.pattern import title
from patterns.traces import read_traces
from patterns.traces.to_pattern import trace_pattern
from tests.test_traces_nccl_log import _tp2_log


def test_the_header_of_a_trace_comes_from_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "tp2.log"
    path.write_text("\n".join(_tp2_log()) + "\n")
    head = title(trace_pattern(read_traces([str(path)])))
    # _tp2_log: 2 ranks of one TP group, steps of 4, 1 and 1 tokens (1 prefill + 2 decode), bf16
    # the ranks are named host:pid:rank from the log's init lines
    assert head.startswith("trace gpu-node:300:0, gpu-node:301:1 |"), head
    assert "tp=2 pp=1 (2 ranks)" in head and "1 prefill + 2 decode step(s)" in head, head
    assert head.endswith("bf16") and "h=0" not in head and "prompt=1" not in head, head
