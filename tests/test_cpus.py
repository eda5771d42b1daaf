"""More CPU ranks than CPUs on a host: recorded in meta.json, said above the run's table
(stdout, before its last JSON line), and carried into predict's caveats
(microbench/ranks/cpus.py)."""

import json
import os

import pytest

from microbench.analysis.predict import caveats
from microbench.ranks import cpus
from tests.replay_helpers import infercomm, last_json, tiny_model


def test_placement_counts_rank_zeros_host(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert cpus.placement(["a", "a", "a", "b"], "cpu") == {
        "host_cpus": 2, "ranks_on_host": 3, "oversubscribed": True}
    assert cpus.placement(["a", "a", "b", "b"], "cpu")["oversubscribed"] is False
    # On a GPU the device does the work: not flagged.
    assert cpus.placement(["a", "a", "a"], "cuda")["oversubscribed"] is False
    line = cpus.warning("replay", cpus.placement(["a"] * 3, "cpu"))
    assert line is not None and line.startswith("infercomm replay: warning: 3 ranks on 2 CPUs")
    assert cpus.warning("replay", cpus.placement(["a"] * 2, "cpu")) is None


def test_predict_names_an_oversubscribed_replay():
    said = caveats({"backend": "mpi", "world_size": 2}, None,  # type: ignore[arg-type]
                   {"backend": "mpi", "world_size": 2, "oversubscribed": True,
                    "ranks_on_host": 4, "host_cpus": 2})
    assert said == ["the replay ran 4 ranks on 2 CPUs: its times include waits for a CPU, "
                    "which no fit prices"]


@pytest.mark.skipif((os.cpu_count() or 1) >= 3,
                    reason="needs a host with fewer than 3 CPUs (3 ranks must oversubscribe it)")
def test_a_replay_of_more_ranks_than_cpus_says_so(tmp_path):
    proc, _ = infercomm("replay", "--backend", "torch", "--device", "cpu", "--model",
                        tiny_model(tmp_path), "--pp", "3", "--prompt", "4", "--decode", "2",
                        "-n", "2", "-w", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert any(f"warning: 3 ranks on {os.cpu_count()} CPUs" in line for line in lines[:-1])
    meta = json.loads((tmp_path.glob("*/meta.json").__next__()).read_text())
    assert meta["oversubscribed"] is True and meta["ranks_on_host"] == 3
    assert last_json(proc.stdout)["results_dir"]
