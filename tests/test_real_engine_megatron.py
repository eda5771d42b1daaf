"""Megatron-Core itself as the judge of `--engine megatron`: its static inference engine
(megatron-core 0.19.2 in .venv-megatron, which `make test` makes) serves tiny random-weight GPTs
on 4 gloo ranks, TP2, PP2 and TP2 x PP2, and a tiny MoE GPT at TP2, TP2 x EP2, TP2 x PP2 and
PP2 x EP2, in turn on one launch (scripts/megatron_cpu_oracle.py), and every rank's Kineto
trace must validate exactly against the pattern of its settings.

The tiny GPT (scripts/megatron_cpu_oracle.py): h 128, 4 layers, vocabulary 256 (a multiple of
128 * tp: Megatron pads nothing), fp32. Each layout serves a static batch of b = 2 prompts of
s = 8 tokens twice: generating 4 tokens ("last": 1 prefill + 3 decode steps) and 3 tokens with
return_log_probs ("log-probs": 1 + 2). TP2 and PP2 run two data-parallel replicas (--dp 2).

Per step and rank, by hand (megatron-core 0.19.2, core/inference/text_generation_controllers/
text_generation_controller.py and core/models/gpt/gpt_model.py, as the profile's docstring
cites them):
- TP2: the embedding all-reduce and 2 a layer, 1 + 2 * 4 = 9 of [s, 2, 128], then the logits
  all-gather of the last position, [1, 2, 256 / 2] (256 elements): 10 calls;
- PP2: stage 0 sends [s, 2, 128], stage 1 receives it; then both take the logits broadcast
  [2, 1, 256] (512 elements) from the last stage: 2 calls;
- TP2 x PP2: stage 0 1 + 2 * 2 = 5 all-reduces, the send and the broadcast; stage 1 the recv,
  4 all-reduces, the gather and the broadcast: 7 calls each.

The tiny MoE GPT (the same, with layers 1-3 MoE: 4 experts, top 2, a shared expert; served as
"last" only) at b = 2, s = 8: T = 16 tokens a prefill, 2 a decode step. Megatron's default
all-gather dispatcher (megatron-core 0.19.2 core/transformer/moe/token_dispatcher.py 278-300,
352-365; patterns/engines/megatron/moe.py) issues per MoE layer, over its group of n ranks, the
all-gathers of the routing map bool [T, 4], the probabilities [T, 4] and the tokens [T, 128],
and the reduce-scatter of [n * T, 128]: 4 calls; at TP also linear_proj's and the shared
expert's all-reduce: 6. Per step and rank:
- TP2 (--dp 2, n = 2): 1 + 2 (dense layer 0) + 3 * 6 + the logits gather = 22;
- TP2 x EP2 (--dp 2 --ep: Megatron's expert TP 2 x EP 2 = all 4 ranks, n = 4): 22;
- TP2 x PP2 (n = 2): stage 0 1 + 2 + 6 + the send + the broadcast = 11; stage 1 the recv,
  2 * 6, the gather, the broadcast = 15;
- PP2 x EP2 (--dp 2 --ep, n = 2, no TP: no all-reduce): stage 0 4 + send + broadcast = 6;
  stage 1 recv + 2 * 4 + broadcast = 10. Its ranks are numbered as Megatron numbers them by
  default (order tp-cp-ep-dp-pp: PP outermost, which EP with PP needs), so validate reads them
  with --rank-order tp-dp-pp.
"""

import json
import subprocess
from pathlib import Path

import pytest

from patterns.traces import read_traces
from tests import real_engine_serving as serving
from tests.conftest import last_json

REPO = Path(__file__).resolve().parents[1]
MEGATRON_PY = REPO / ".venv-megatron" / "bin" / "python"
SCRIPT = REPO / "scripts" / "megatron_cpu_oracle.py"


def _why_not() -> str | None:
    """Why Megatron-Core cannot serve here, or None."""
    if not MEGATRON_PY.exists():
        return ".venv-megatron is missing (make setup-megatron creates it)"
    proc = subprocess.run([str(MEGATRON_PY), "-c", "import importlib.util as u, sys; "
                           "sys.exit(u.find_spec('megatron.core') is None)"], capture_output=True)
    if proc.returncode:
        return "megatron-core is not installed in .venv-megatron (make setup-megatron says why)"
    return None


WHY_NOT = _why_not()
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"Megatron-Core: {WHY_NOT}"),
              pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict:
    """The oracle's oracle.json: every layout served once, on one launch of 4 ranks (in the
    session's background where conftest listed it: tests/real_engine_serving.py)."""
    out = serving.served_out(request.config, ("megatron",), lambda: serving.megatron_job(
        tmp_path_factory.mktemp("megatron")))
    return json.loads((out / "oracle.json").read_text())


def _validate(cli, doc: dict, name: str, *extra: str, drop: str = "") -> tuple[int, str]:
    """validate of one trace folder, `extra` options added and the flag `drop` left out."""
    argv = [a for a in doc["traces"][name]["validate"] if a != drop]
    status, out, err = cli(*argv, *extra)
    return status, out + err


def _rows(stdout: str) -> list[list[str]]:
    """validate's table: rank, phase, op, numel, dtype, group, trace, pattern, status."""
    return [line.split() for line in stdout.splitlines() if line.endswith(
        ("equal", "missing", "extra", "different"))]


def test_tp2_x_pp2_validates_exactly(served, cli) -> None:
    status, out = _validate(cli, served, "tp2-pp2-last")
    assert status == 0, out[-3000:]
    summary = last_json(out)
    # 7 calls a step and rank, 4 steps, 4 ranks
    assert (summary["match"], summary["calls"], summary["ranks"]) == (True, 4 * 7 * 4, 4)
    rows = _rows(out)
    # the prefill gathers the last position only: [1, 2, 128] = 256 elements, not 8 * 256
    assert ["2", "prefill", "allgather", "256", "fp32", "2", "1", "1", "equal"] in rows
    # the logits broadcast [2, 1, 256] = 512 on both stages: 1 in prefill, 3 in decode
    for rank in "0123":
        assert [rank, "prefill", "broadcast", "512", "fp32", "?", "1", "1", "equal"] in rows
        assert [rank, "decode", "broadcast", "512", "fp32", "?", "3", "3", "equal"] in rows


def test_pipeline_peers_are_world_ranks_in_the_trace(served) -> None:
    """Megatron sends on the world group: rank 0 (stage 0, TP rank 0) names rank 2, rank 3
    (stage 1, TP rank 1) receives from rank 1, where the pattern names stages 1 and 0."""
    argv = served["traces"]["tp2-pp2-last"]["validate"]
    trace = read_traces(argv[argv.index("--trace") + 1:argv.index("--engine")])
    peers = {r.rank: {(trace.table[i].op, trace.table[i].peer) for i in r.ids
                      if trace.table[i].op in ("send", "recv")} for r in trace.ranks}
    assert peers == {0: {("send", 2)}, 1: {("send", 3)}, 2: {("recv", 0)}, 3: {("recv", 1)}}


@pytest.mark.parametrize("name, calls", [
    ("tp2-last", 10 * 4 * 4),  # 10 calls a step, 4 steps, 4 ranks
    ("pp2-last", 2 * 4 * 4),  # 2 calls a step
    ("tp2-log-probs", 10 * 3 * 4),  # 3 steps
    ("pp2-log-probs", 2 * 3 * 4),
    ("tp2-pp2-log-probs", 7 * 3 * 4),
    ("moe-tp2-last", 22 * 4 * 4),  # 22 calls a step, 4 steps, 4 ranks
    ("moe-tp2-ep2-last", 22 * 4 * 4),
    ("moe-tp2-pp2-last", (2 * 11 + 2 * 15) * 4),  # 2 ranks a stage
    ("moe-pp2-ep2-last", (2 * 6 + 2 * 10) * 4),
])
def test_every_layout_validates_exactly(served, cli, name: str, calls: int) -> None:
    status, out = _validate(cli, served, name)
    assert status == 0, out[-3000:]
    assert last_json(out)["calls"] == calls


def test_log_probs_gather_and_broadcast_every_prompt_position(served, cli) -> None:
    status, out = _validate(cli, served, "tp2-pp2-log-probs")
    assert status == 0, out[-3000:]
    rows = _rows(out)
    # prefill: the gather of [8, 2, 128] = 2048 elements, the broadcast of [2, 8, 256] = 4096
    assert ["2", "prefill", "allgather", "2,048", "fp32", "2", "1", "1", "equal"] in rows
    assert ["0", "prefill", "broadcast", "4,096", "fp32", "?", "1", "1", "equal"] in rows
    assert ["0", "decode", "broadcast", "512", "fp32", "?", "2", "2", "equal"] in rows


@pytest.mark.parametrize("name, extra, drop, trace, pattern", [
    # the last-position trace held against the log-probs pattern: stage 0's first call
    # that differs is the prefill's broadcast (op 6: 5 all-reduces and the send before it)
    ("tp2-pp2-last", ["--return-log-probs"], "", 2 * 1 * 256, 2 * 8 * 256),
    # and the log-probs trace against the default pattern
    ("tp2-pp2-log-probs", [], "--return-log-probs", 2 * 8 * 256, 2 * 1 * 256),
])
def test_the_traces_tell_the_logits_settings_apart(served, cli, name: str, extra: list[str],
                                                   drop: str, trace: int,
                                                   pattern: int) -> None:
    status, out = _validate(cli, served, name, *extra, drop=drop)
    assert status == 1, out[-3000:]
    assert last_json(out)["first_difference"] == (
        f"rank 0: call 6 (prefill step 0, op 6 of the step) differs: the trace has broadcast "
        f"{trace} x fp32 (group of ? root 1), the pattern has broadcast {pattern} x fp32 "
        "(group of 2 root 1) [pp.logits]")
    # the last stage's prefill gather differs too: [1, 2, 128] against [8, 2, 128]
    gathers = {row[3] for row in _rows(out) if row[:3] == ["2", "prefill", "allgather"]}
    assert gathers == {"256", "2,048"}


@pytest.mark.parametrize("name, group", [("moe-tp2-last", "2"), ("moe-tp2-ep2-last", "4")])
def test_moe_dispatch_gathers_a_bool_routing_map(served, cli, name: str, group: str) -> None:
    status, out = _validate(cli, served, name)
    assert status == 0, out[-3000:]
    rows = _rows(out)
    # prefill T = 16: the routing map [16, 4] = 64 bool, the tokens [16, 128] = 2048, the
    # reduce-scatter's input [n * 16, 128]; 3 MoE layers, so 3 of each; decode T = 2, 3 steps
    n = int(group)
    for rank in "0123":
        assert [rank, "prefill", "allgather", "64", "bool", group, "3", "3", "equal"] in rows
        assert [rank, "decode", "allgather", "8", "bool", group, "9", "9", "equal"] in rows
        assert [rank, "prefill", "reducescatter", f"{n * 2048:,}", "fp32", group, "3", "3",
                "equal"] in rows


def test_moe_trace_reads_every_all_reduce_with_its_dtype(served) -> None:
    """gloo records each reduce-scatter as a gloo:all_reduce event: the TensorList all-reduces
    after the first MoE layer read as dtype "unknown" before patterns/traces/kineto.py paired
    them past it (every call here is fp32 or bool)."""
    argv = served["traces"]["moe-tp2-last"]["validate"]
    trace = read_traces(argv[argv.index("--trace") + 1:argv.index("--engine")])
    # 22 calls a step, 4 steps, 4 ranks
    assert trace.calls == 352 and trace.unparsed == 0
    assert {c.dtype for c in trace.table} == {"fp32", "bool"}


def test_megatron_rank_order_is_named(served, cli) -> None:
    """PP2 x EP2 as Megatron numbers it (PP outermost) held in infercomm's own order: rank 0
    (stage 0, DP 0) sends to rank 2, which infercomm's layout places on stage 0 of DP 1."""
    status, out = _validate(cli, served, "moe-pp2-ep2-last", "--rank-order", "tp-pp-dp")
    assert status == 1, out[-3000:]
    summary = last_json(out)
    # stage 0's 4 dispatcher calls, then the send of [8, 2, 128] = 2048 elements
    assert summary["first_difference"] == (
        "rank 0: call 4 (prefill step 0, op 4 of the step) differs: the trace has send 2048 x "
        "fp32 (group of ? peer 2), the pattern has send 2048 x fp32 (group of 2 peer 1) "
        "[pp.hidden_states]")
    assert any("pass --rank-order tp-dp-pp" in note for note in summary["notes"])
