"""Traces made by real PyTorch: 2 and 4 gloo ranks issue vLLM V0's calls for the tiny model
under torch.profiler (tests/emulated_engine.py), and `trace`, `validate` and `replay --trace`
read the Kineto JSON they export.

Tiny model (tests/replay_helpers.TINY_CONFIG): h=64, L=4, vocab 1000 padded to 1024, bf16.
Prompt 4, decode 3: a prefill step of T=4 tokens and 2 decode steps of T=1.
TP2, per step (engine spec 2.1): 1 + 2*4 = 9 all-reduces of [T,64], then a gather of
[1, 1024/2 = 512] to TP rank 0: 10 calls a step, 30 an inference.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.ranks.launch import free_port
from tests.replay_helpers import infercomm, last_json, tiny_model

REPO = Path(__file__).resolve().parent.parent


def _emulate(out: Path, *args: str) -> list[str]:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "emulated_engine.py"), str(out),
                           "--port", str(free_port()), *args], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sorted(str(p) for p in out.glob("rank*.json*"))


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str], str]:
    """TP2 traces, and the same run with the 3rd all-reduce of decode step 1 left out."""
    out = tmp_path_factory.mktemp("tp2")
    clean = _emulate(out, "--tp", "2", "--pp", "1", "--also-drop", "1:3")
    dropped = sorted(str(p) for p in (out / "drop").glob("rank*.json"))
    return clean, dropped, tiny_model(out)


@pytest.fixture(scope="module")
def tp2pp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    out = tmp_path_factory.mktemp("tp2pp2")
    return _emulate(out, "--tp", "2", "--pp", "2", "--gz"), tiny_model(out)


PATTERN = ["--prompt", "4", "--decode", "3", "--engine", "vllm-v0", "--eager"]


def test_trace_json_of_tp2(tp2: tuple[list[str], list[str], str]) -> None:
    files, _, _ = tp2
    assert len(files) == 2
    proc, _ = infercomm("trace", *files, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    # group_size 2: every group of two or more ranks in distributedInfo.pg_config is
    # (world, the TP group); bytes = calls x numel x 2 (bf16).
    rows = [{"rank": r, "group_size": 2, "op": op, "numel": n, "dtype": "bf16",
             "calls": c, "bytes": c * n * 2}
            for r in (0, 1)
            for op, n, c in (("allreduce", 4 * 64, 9),  # prefill: T=4 rows of h=64
                             ("gather", 512, 3),  # one per step
                             ("allreduce", 64, 18))]  # 9 per decode step x 2
    assert doc == {"ranks": 2, "calls": 60, "unparsed": 0, "rows": rows}


def test_trace_table_and_csv_of_tp2(tp2: tuple[list[str], list[str], str]) -> None:
    files, _, _ = tp2
    proc, _ = infercomm("trace", *files)
    assert proc.returncode == 0, proc.stderr
    assert "2 ranks, 60 calls, 0 lines or events not understood" in proc.stdout
    # ProfilerStep#0..2 annotate the 3 steps; prefill and decode steps differ: 2 runs
    assert "3 steps (profiler steps), 2 runs after folding repeats" in proc.stdout
    proc, _ = infercomm("trace", *files, "--format", "csv")
    lines = proc.stdout.splitlines()
    assert lines[0] == "rank,group_size,op,numel,dtype,calls,bytes"
    assert lines[1] == "0,2,allreduce,256,bf16,9,4608"  # 9 x 256 x 2 bytes


def test_validate_tp2_matches(tp2: tuple[list[str], list[str], str]) -> None:
    files, _, model = tp2
    proc, _ = infercomm("validate", "--trace", *files, "--model", model, "--tp", "2", *PATTERN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = last_json(proc.stdout)
    assert summary["match"] is True and summary["first_difference"] is None
    # per rank: prefill allreduce, prefill gather, decode allreduce, decode gather
    assert summary["equal"] == 8 and summary["different"] == 0
    assert summary["calls"] == 60


def test_validate_names_the_first_differing_call(tp2: tuple[list[str], list[str], str]) -> None:
    _, dropped, model = tp2
    proc, _ = infercomm("validate", "--trace", *dropped, "--model", model, "--tp", "2",
                        *PATTERN)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = last_json(proc.stdout)
    # Step 0 is calls 0-9; decode step 1 starts at call 10 and lost one of its 9
    # all-reduces, so its gather comes at call 10 + 8 = 18, where the pattern has the
    # step's 9th all-reduce (op 8: layers.3.mlp.down_proj).
    assert summary["first_difference"] == (
        "rank 0: call 18 (decode step 1, op 8 of the step) differs: the trace has gather 512 x "
        "bf16 (group of 2 root 0), the pattern has allreduce 64 x bf16 (group of 2) "
        "[layers.3.mlp.down_proj]")
    assert summary["match"] is False
    # decode all-reduces of [1,64]: 17 in the trace, 18 in the pattern, on both ranks
    assert summary["different"] == 2
    assert "  0  decode   allreduce     64  bf16       2     17       18  different" in proc.stdout
    assert any("fewer all-reduces" in n for n in summary["notes"])


def test_trace_and_validate_tp2pp2(tp2pp2: tuple[list[str], str]) -> None:
    files, model = tp2pp2
    assert [Path(f).name for f in files] == [f"rank{r}.json.gz" for r in range(4)]
    proc, _ = infercomm("trace", *files, "--format", "json")
    doc = json.loads(proc.stdout)
    # Stage 0 (ranks 0, 1): 1 + 2*2 = 5 all-reduces and 2 sends of T*64/2 a step = 7 calls;
    # stage 1 (ranks 2, 3): 2 recvs + 2 all-gathers of T*64/2, 2*2 = 4 all-reduces and one
    # gather = 9 calls; 3 steps: 2 x 21 + 2 x 27 = 96.
    assert doc["ranks"] == 4 and doc["calls"] == 96 and doc["unparsed"] == 0
    rank2 = [(r["op"], r["numel"], r["calls"], r["group_size"]) for r in doc["rows"]
             if r["rank"] == 2]
    # the gloo trace has no group sizes (the rank is in groups of 4 and of 2), except for
    # the all-gather, whose output/input ratio is its group size (256/128 = 2)
    assert rank2 == [("recv", 128, 2, None), ("allgather", 128, 2, 2),
                     ("allreduce", 256, 4, None), ("gather", 512, 3, None),
                     ("recv", 32, 4, None), ("allgather", 32, 4, 2),
                     ("allreduce", 64, 8, None)]
    proc, _ = infercomm("validate", "--trace", *files, "--model", model, "--tp", "2", "--pp",
                        "2", *PATTERN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert last_json(proc.stdout)["match"] is True


def test_replay_of_a_tp2_trace(tp2: tuple[list[str], list[str], str], tmp_path: Path) -> None:
    files, _, _ = tp2
    proc, _ = infercomm("replay", "--trace", *files, "--device", "cpu", "-n", "1", "-w", "0",
                        "--check", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = last_json(proc.stdout)
    assert summary["calls_per_inference"] == 30  # 10 calls a step x 3 steps
    assert (summary["tp"], summary["pp"], summary["engine"]) == (2, 1, "trace")
    # Sd = 2 decode steps + the token the prefill samples
    assert summary["decode"] == 3 and summary["wrong"] == 0


def test_replay_of_a_tp2pp2_trace(tp2pp2: tuple[list[str], str], tmp_path: Path) -> None:
    files, _ = tp2pp2
    proc, _ = infercomm("replay", "--trace", *files, "--device", "cpu", "-n", "1", "-w", "0",
                        "--check", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = last_json(proc.stdout)
    # TP = the all-gathers' group size (2), PP = 4 ranks / 2; the busiest stage (stage 1)
    # issues 9 calls a step x 3 steps
    assert (summary["tp"], summary["pp"]) == (2, 2)
    assert summary["calls_per_inference"] == 27 and summary["wrong"] == 0


def test_replay_refuses_a_trace_it_cannot_lay_out(tp2: tuple[list[str], list[str], str],
                                                  tmp_path: Path) -> None:
    files, _, _ = tp2
    proc, _ = infercomm("replay", "--trace", files[0], "--device", "cpu", "--out",
                        str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == ("infercomm replay: error: the trace's 1 ranks are not a multiple of "
                           "its collectives' group size 2; replay needs a TP x PP layout\n")
    assert not list(tmp_path.iterdir())


def test_a_file_without_calls_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1.0, "dur": 2.0}]}))
    proc, _ = infercomm("trace", str(path))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"infercomm trace: error: {path}: no communication call "
                                  "found; expected NCCL/RCCL COLL lines")
    assert proc.stdout == ""
