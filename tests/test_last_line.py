"""The last stdout line of the commands that print tables is one short JSON object (the
whole document is their --format json), so a script can read any of them the same way."""

import json
from pathlib import Path

from tests.conftest import last_json

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "fixtures" / "traces" / "nccl_interleaved_tp2.log"
SWEEP = ROOT / "results" / "examples" / "plan-sweeps" / "20261125T163229Z-intra-shm"


def test_trace_table_ends_with_its_totals(cli):
    status, out, err = cli("trace", str(TRACE))
    assert status == 0, err
    # 2 ranks x 4 all-reduces of 8192 bf16 (tests/test_trace_fixtures.py): 8 x 8192 x 2 B
    assert last_json(out) == {"ranks": 2, "calls": 8, "unparsed": 0, "bytes": 131_072,
                              "ep_kernels": 0, "notes": 0}
    assert len(out.strip().splitlines()[-1]) < 200


def test_plan_table_ends_with_the_best_layout(cli):
    status, out, err = cli("plan", "--model", "llama-3.1-8b", "--gpus", "4",
                           "--gpus-per-node", "4", "--prompt", "128", "--decode", "16",
                           "--sweep", str(SWEEP))
    assert status == 0, err
    line = last_json(out)
    status, doc_out, _ = cli("plan", "--model", "llama-3.1-8b", "--gpus", "4",
                             "--gpus-per-node", "4", "--prompt", "128", "--decode", "16",
                             "--sweep", str(SWEEP), "--format", "json")
    doc = json.loads(doc_out.strip().splitlines()[-1])
    best = next(p for p in doc["layouts"] if p["best"])
    # the same plan as --format json: its layout count, refusals and best layout
    assert (line["layouts"], line["refused"]) == (len(doc["layouts"]), len(doc["refused"]))
    assert line["best"]["tp"] == best["tp"] and line["best"]["dp"] == best["dp"]
    assert len(out.strip().splitlines()[-1]) < 200
