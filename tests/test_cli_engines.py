"""`infercomm engines`, the transport view of `infercomm pattern`, and real 2-rank replays of
every new engine's pattern (the calls the engine issues, checked element by element)."""

import json
from collections import Counter

import pytest

from microbench.views.replay import engine_transport_line
from patterns import ENGINES
from tests.conftest import last_json
from tests.replay_helpers import infercomm, needs_mpi, tiny_model

BASE = ["pattern", "--model", "llama-3.1-8b", "--prompt", "128", "--decode", "128"]


def test_engines_lists_every_profile_with_its_source(cli):
    status, out, _ = cli("engines")
    assert status == 0
    assert sorted(last_json(out)["engines"]) == sorted(ENGINES)  # the short last line
    status, json_out, _ = cli("engines", "--format", "json")
    rows = {r["name"]: r for r in last_json(json_out)["engines"]}
    assert set(rows) == set(ENGINES) == {"vllm", "vllm-v0", "sglang", "trtllm", "megatron"}
    assert "c8109375" in rows["vllm"]["source"] and "8905cbd4" in rows["sglang"]["source"]
    assert "--model-runner" in rows["vllm"]["options"] and rows["megatron"]["options"] == [
        "--sp", "--return-log-probs"]
    assert all(r["not_modelled"] and r["version"] for r in rows.values())
    table = out.splitlines()
    assert table[0].split() == ["engine", "follows", "version", "options"]
    assert [line.split()[0] for line in table[2:7]] == sorted(ENGINES)
    status, out, _ = cli("engines", "--format", "json")
    assert status == 0 and len(out.strip().splitlines()) == 1


def test_pattern_defaults_to_vllm_and_shows_transports(cli):
    status, out, _ = cli(*BASE, "--tp", "2")
    assert status == 0
    summary = last_json(out)
    assert summary["engine"] == "vllm"
    header = next(line for line in out.splitlines() if line.startswith("phase "))
    assert "fused-allreduce-rmsnorm" in out and "transport" in header.split()
    # The split: prefill 65 fused all-reduces + 1 NCCL all-gather; decode 127 times that.
    split = [line.split() for line in out.splitlines()
             if line.startswith(("prefill ", "decode ")) and "%" in line]
    assert [(s[0], s[1], s[2]) for s in split] == [
        ("prefill", "fused-allreduce-rmsnorm", "65"), ("prefill", "nccl", "1"),
        ("decode", "fused-allreduce-rmsnorm", "8,255"), ("decode", "nccl", "127")]


def test_json_rows_carry_transport(cli):
    status, out, _ = cli(*BASE, "--tp", "4", "--format", "json", "--steps")
    assert status == 0
    doc = json.loads(out)
    assert {(r["op"], r["transport"]) for r in doc["rows"]} == {
        ("allreduce", "fused-allreduce-rmsnorm"), ("allgather", "nccl")}
    assert doc["notes"] == [] and doc["engine"]["gpu"] == "h100"
    assert doc["steps"][0]["ops"][0]["transport"] == "fused-allreduce-rmsnorm"
    status, out, _ = cli(*BASE, "--tp", "4", "--format", "json", "--nccl-only")
    assert status == 0
    assert {r["transport"] for r in json.loads(out)["rows"]} == {"nccl"}


def test_moe_without_ep_says_so(cli):
    status, out, _ = cli("pattern", "--model", "qwen3-30b-a3b", "--tp", "4", "--prompt", "16",
                         "--decode", "2")
    assert status == 0
    note = out.splitlines()[1]
    assert note.startswith("note: qwen3-30b-a3b is a MoE model (128 experts, 48 MoE layers)")
    assert "every expert sharded over TP (one all-reduce per MoE layer)" in note
    assert "for expert parallelism give --dp N --ep" in note
    status, out, _ = cli("pattern", "--model", "qwen3-30b-a3b", "--tp", "4", "--prompt", "16",
                         "--decode", "2", "--format", "json")
    assert "every expert sharded over TP" in json.loads(out)["notes"][0]


@pytest.mark.parametrize("args, message", [
    (["--engine", "vllm", "--sp"], "--sp does not apply to engine vllm; it applies to megatron"),
    (["--engine", "megatron", "--sp", "--tp", "2", "--prompt", "128", "--decode", "4"],
     "--sp: Megatron's static engine refuses sequence parallelism for the dense model "
     "llama-3.1-8b"),
    (["--engine", "vllm", "--return-log-probs"],
     "--return-log-probs does not apply to engine vllm; it applies to megatron"),
    (["--gpu", "v100"], "argument --gpu: invalid choice: 'v100'"),
])
def test_bad_engine_options_are_one_line(cli, args, message):
    argv = ["pattern", "--model", "llama-3.1-8b", "--prompt", "16", "--decode", "2", *args]
    status, out, err = cli(*argv)
    assert status == 2 and out == "" and len(err.strip().splitlines()) >= 1
    assert message in err


def test_megatron_pattern_gathers_the_last_position_and_broadcasts_logits(cli):
    # megatron-core 0.19.2 static engine (patterns/engines/megatron/profile.py): Llama-3.1-8B
    # TP2 x PP2, prompt 128, decode 4 = 1 prefill + 3 decode steps. V 128256 = 256 * 501 needs
    # no padding at TP2: the prefill gathers [1, 1, 64128] (the last position, not 128), and
    # both stages take the broadcast of the logits [1, 1, 128256] in every step: 1 + 3.
    status, out, _ = cli("pattern", "--engine", "megatron", "--model", "llama-3.1-8b", "--tp",
                         "2", "--pp", "2", "--prompt", "128", "--decode", "4", "--format",
                         "json")
    assert status == 0
    rows = [(r["phase"], r["stage"], r["op"], r["group"], r["shape"], r["count"])
            for r in last_json(out)["rows"] if r["op"] in ("allgather", "broadcast")]
    assert rows == [("prefill", 0, "broadcast", "pp", [1, 1, 128256], 1),
                    ("prefill", 1, "allgather", "tp", [1, 1, 64128], 1),
                    ("prefill", 1, "broadcast", "pp", [1, 1, 128256], 1),
                    ("decode", 0, "broadcast", "pp", [1, 1, 128256], 3),
                    ("decode", 1, "allgather", "tp", [1, 1, 64128], 3),
                    ("decode", 1, "broadcast", "pp", [1, 1, 128256], 3)]


def test_megatron_sp_is_refused_in_one_line(cli):
    status, out, err = cli("pattern", "--engine", "megatron", "--model", "llama-3.1-8b",
                           "--tp", "2", "--prompt", "128", "--decode", "1", "--sp")
    assert (status, out) == (2, "") and len(err.strip().splitlines()) == 1
    assert "refuses sequence parallelism for the dense model llama-3.1-8b" in err


def test_engines_names_the_megatron_engine_and_version(cli):
    status, out, _ = cli("engines", "--format", "json")
    assert status == 0
    row = next(r for r in last_json(out)["engines"] if r["name"] == "megatron")
    assert row["version"] == "megatron-core 0.19.2"
    assert "StaticInferenceEngine, legacy=True" in row["engine"]
    assert any(item.startswith("the dynamic inference engine") for item in row["not_modelled"])


def test_engine_transport_line():
    # Spec's example: V0-style numbers through a custom all-reduce engine.
    line = engine_transport_line({"custom-allreduce": 8255, "nccl": 127}, "mpi", "mpi-host")
    assert line == ("the engine would send 8,255 of these 8,382 calls through "
                    "custom-allreduce, 127 through nccl; replayed here over MPI (mpi-host)")


# --- real replays: 2 ranks, every call checked (--check) ---------------------------------

# Tiny model (h 64, L 4, V 1000 -> 1024 padded, 4 heads), prompt 8, decode 3, TP2 or PP2.
# Calls per inference on the busiest rank, by hand:
#   vllm TP2: 1 + 2*4 = 9 all-reduces + 1 logits all-gather = 10 a step, 3 steps -> 30
#   vllm PP2 (Model Runner V2): stage 1: the metadata's 2 gloo recvs (its size, then its
#     pickled bytes: parallel_state.py:1148 @ c8109375) and 2 tensor recvs a step, plus the
#     2 pp_broadcast calls on the prefill and on every decode step, the last included
#     (pp_utils.py:35-49: 8 + 2 + 1 < 8 + 3) -> 4*3 + 2*3 = 18
#   sglang TP2 --control-plane: 1 gloo size broadcast + 10 -> 11 a step -> 33
#   trtllm PP2: stage 1: 2 whole-tensor recvs a step -> 6
#   megatron TP2: 9 + 1 -> 30
REPLAYS = [
    ("vllm", ["--tp", "2"], 30, "torch"),
    ("vllm", ["--pp", "2"], 18, "torch"),
    ("sglang", ["--tp", "2", "--control-plane"], 33, "torch"),
    ("trtllm", ["--pp", "2"], 6, "torch"),
    pytest.param("megatron", ["--tp", "2"], 30, "mpi", marks=needs_mpi),
]


@pytest.mark.parametrize("engine, layout, calls, backend", REPLAYS)
def test_new_engines_replay_on_two_ranks(tmp_path, engine, layout, calls, backend):
    proc, _ = infercomm("replay", "--nproc", "2", "--backend", backend, "--device", "cpu",
                        "--engine", engine, "--model", tiny_model(tmp_path), *layout,
                        "--prompt", "8", "--decode", "3", "-n", "1", "-w", "0", "--check",
                        "--timeout", "60", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert (line["engine"], line["wrong"], line["calls_per_inference"]) == (engine, 0, calls)
    header = next(li for li in proc.stdout.splitlines() if li.startswith("the engine would"))
    assert f"of these {calls:,} calls" in header
    summary = json.loads(next((tmp_path / "out").iterdir()).joinpath("summary.json")
                         .read_text())
    assert Counter(summary["engine_transports"]).total() == calls
