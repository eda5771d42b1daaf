"""The `plan` commands of docs/predict-plan.md, run as shown (from the shipped sweeps), say what
the page says: 405B on 1,024 GPUs lists TP8 x PP2 x DP64 and its best fits an H100; 70B on
16 GPUs under a Poisson workload prices TP8 x DP2; TP8 wins 70B's TPOT on one node and TP8 x
PP2 405B's on two."""

import contextlib
import io
import json

import pytest

from microbench.cli import main
from tests.test_docs_commands import ROOT, bash_lines, infercomm_argv

PAGE = ROOT / "docs" / "predict-plan.md"
PLANS = [argv for line in bash_lines(PAGE.read_text())
         if (argv := infercomm_argv(line)) is not None and argv[:1] == ["plan"]]


def _run(argv: list[str], monkeypatch) -> dict:
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--format", "json"]) == 0
    return json.loads(out.getvalue())


def _find(model: str, gpus: str, extra: str | None = None) -> list[str]:
    found = [a for a in PLANS if "--model" in a and a[a.index("--model") + 1] == model
             and a[a.index("--gpus") + 1] == gpus and (extra is None or extra in a)]
    assert len(found) == 1, f"the page shows no single plan of {model} on {gpus} GPUs"
    return found[0]


def _shape(row: dict) -> tuple[int, int, int]:
    return row["tp"], row["pp"], row["dp"]


def test_405b_on_1024_gpus(monkeypatch):
    doc = _run(_find("llama-3.1-405b", "1024"), monkeypatch)
    rows = {_shape(r): r for r in doc["layouts"]}
    assert (8, 2, 64) in rows and rows[(8, 2, 64)]["fits_memory"]
    [best] = [r for r in doc["layouts"] if r["best"]]
    assert _shape(best) == (8, 2, 64)
    # An H100's 81,559 MiB (as nvidia-smi reports it, analysis/hardware.py) at vLLM's 0.9:
    # what the best needs (weights, vLLM's overhead, one max_model_len request's KV cache
    # and the batch's) fits in it.
    used = (best["weight_bytes_per_gpu"] + best["kv_cache_bytes_per_gpu"]
            + best["overhead_bytes_per_gpu"] + best["max_model_len_kv_bytes_per_gpu"])
    assert used <= doc["memory_limit_bytes"] == int(81559 / 1024 * 0.9 * 2**30)
    assert not rows[(1, 1, 1024)]["fits_memory"]


def test_70b_under_a_poisson_workload_prices_tp8_dp2(monkeypatch):
    doc = _run(_find("llama-3.1-70b", "16", "--requests"), monkeypatch)
    rows = {_shape(r): r for r in doc["layouts"]}
    assert (8, 1, 2) in rows and rows[(8, 1, 2)]["fits_memory"]
    assert rows[(8, 1, 2)]["prefill_us"] > 0 and rows[(8, 1, 2)]["compute_prefill_us"] > 0
    assert len(doc["layouts"]) == 15 and not doc["refused"]


@pytest.mark.parametrize("model,gpus,best", [("llama-3.1-70b", "8", (8, 1, 1)),
                                             ("llama-3.1-405b", "16", (8, 2, 1))])
def test_tp_or_pp(model, gpus, best, monkeypatch):
    doc = _run(_find(model, gpus, "--objective"), monkeypatch)
    [chosen] = [r for r in doc["layouts"] if r["best"]]
    assert _shape(chosen) == best
    rows = {_shape(r): r for r in doc["layouts"]}
    # PP does not cut a token's compute: the pure pipeline's step floor is the same
    # layout's at TP1 walked over every stage, TP8's x 8 on the 70B node.
    if model == "llama-3.1-70b":
        assert rows[(1, 8, 1)]["compute_decode_step_us"] == pytest.approx(
            8 * rows[(8, 1, 1)]["compute_decode_step_us"], rel=0.01)
