"""mxfp4 MoE hidden-size padding (patterns/mxfp4.py), checked by hand and against the real
vLLM V1 trace of gpt-oss-120b at TP8 on B200 (../shared/real_traces, see its README)."""

import subprocess
import sys
from pathlib import Path

import pytest

from patterns.engines import generate
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import resolve_model
from patterns.ops import OpKind
from patterns.pattern import EngineOptions

REPO = Path(__file__).resolve().parents[1]
VLLM_TRACE = (REPO.parent / "shared" / "real_traces"
              / "vllm_gptoss120b_tp8_b200_prefill888_rank0.json.gz")


def _allreduce_shapes(gpu: str, backend: str | None) -> dict[tuple[int, ...], int]:
    model = resolve_model("gpt-oss-120b")
    pattern = generate("vllm", model, Layout(tp=8), Workload(prompt=888, decode=1),
                       EngineOptions(eager=True, gpu=gpu, moe_backend=backend))
    shapes: dict[tuple[int, ...], int] = {}
    for op in pattern.stages[0][0].step.ops:
        if op.kind == OpKind.ALLREDUCE:
            shapes[op.shape] = shapes.get(op.shape, 0) + 1
    return shapes


@pytest.mark.parametrize("gpu, backend, moe_width", [
    # oracle/mxfp4.py:637-685 @ c8109375: Marlin rounds h up to 256: ceil(2880/256)*256 =
    # 12*256 = 3072, and moe_runner.py:494-496 all-reduces before truncating.
    ("a100", None, 3072),
    # Triton (H100/H200 default) pads only the intermediate size: h stays 2880.
    ("h100", None, 2880),
    ("h200", None, 2880),
    # TRT-LLM on B200 pads to 3072 but writes an unpadded [T, 2880] output since b4806c8e
    # (experts/trtllm_mxfp4_moe.py:226-230).
    ("b200", None, 2880),
    ("b200", "flashinfer-trtllm-padded", 3072),
    # FlashInfer CUTLASS rounds to 128: ceil(2880/128)*128 = 23*128 = 2944.
    ("h100", "flashinfer-cutlass", 2944),
])
def test_moe_allreduce_width_by_backend(gpu, backend, moe_width):
    shapes = _allreduce_shapes(gpu, backend)
    # 1 embedding + 36 o_proj all-reduces of [888, 2880]; 36 MoE layers' of [888, width].
    if moe_width == 2880:
        assert shapes == {(888, 2880): 1 + 36 + 36}
    else:
        assert shapes == {(888, 2880): 37, (888, moe_width): 36}


def test_bf16_moe_is_never_padded():
    # Only an mxfp4 checkpoint pads: Qwen3-30B-A3B (bf16) keeps h = 2048 on an A100.
    model = resolve_model("qwen3-30b-a3b")
    pattern = generate("vllm", model, Layout(tp=4), Workload(prompt=16, decode=1),
                       EngineOptions(eager=True, gpu="a100"))
    widths = {op.shape[1] for op in pattern.stages[0][0].step.ops
              if op.kind == OpKind.ALLREDUCE}
    assert widths == {model.hidden_size}


def test_unknown_backend_refused():
    with pytest.raises(ConfigError, match="is not a MoE backend; use one of triton"):
        EngineOptions(moe_backend="cutlass")


def _reads_vllm_ops() -> bool:
    from patterns.traces import read_traces
    try:
        trace = read_traces([str(VLLM_TRACE)])
    except ConfigError:
        return False
    return len(trace.ranks[0].ids) >= 74


VALIDATE = [sys.executable, "-m", "microbench", "validate", "--trace", str(VLLM_TRACE),
            "--model", "gpt-oss-120b", "--tp", "8", "--prompt", "888", "--decode", "1",
            "--gpu", "b200", "--eager", "--ranks", "0"]  # the trace is rank 0's of eight


@pytest.mark.skipif(not VLLM_TRACE.is_file(), reason="../shared/real_traces is absent")
def test_validate_real_vllm_trace_with_padded_moe():
    # The trace (by hand, from its cpu_op events): 37 vllm::all_reduce [888, 2880] (embedding
    # + 36 o_proj), 36 vllm::all_reduce [888, 3072] (MoE), 1 all_gather [1, 25136] (logits:
    # 201088 / 8). It was recorded by a vLLM older than b4806c8e.
    if not _reads_vllm_ops():
        pytest.skip("the Kineto reader does not read vllm::all_reduce yet")
    padded = subprocess.run([*VALIDATE, "--moe-backend", "flashinfer-trtllm-padded"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert padded.returncode == 0, padded.stdout[-2000:] + padded.stderr
    # Today's B200 default (unpadded output) differs at the first MoE all-reduce: op 2 of
    # the step (embedding, layer 0 o_proj, layer 0 MoE).
    current = subprocess.run(VALIDATE, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert current.returncode == 1
    assert "op 2 of the step" in current.stdout and "[layers.0.mlp.experts]" in current.stdout
    # ... and says which option explains it
    assert "try --moe-backend" in current.stdout and "flashinfer-trtllm-padded" in current.stdout
    assert "try --moe-backend" not in padded.stdout


def test_moe_backend_on_a_model_without_mxfp4_refused_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "microbench", "pattern", "--model",
                           "qwen3-30b-a3b", "--tp", "2", "--prompt", "8", "--decode", "2",
                           "--moe-backend", "marlin"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "moe-backend picks the kernel of mxfp4 (gpt-oss) or block-fp8 MoE checkpoints; "
        "qwen3-30b-a3b is neither: drop --moe-backend")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("gpu, w_in, w_out", [
    # Marlin (A100): input padded to 3072 before the dispatch (moe_runner.py:509-535), the
    # output too, combined and all-reduced at 3072 (moe_runner.py:494-496).
    ("a100", 3072, 3072),
    # TRT-LLM (B200): input padded to 3072, output written at 2880 (trtllm_mxfp4_moe.py:
    # 226-230), so the combine and the all-reduce carry 2880.
    ("b200", 3072, 2880),
    # Triton (H100): nothing padded.
    ("h100", 2880, 2880),
])
def test_mxfp4_dp_dispatch_carries_the_padded_input(gpu, w_in, w_out):
    model = resolve_model("gpt-oss-120b")
    pattern = generate("vllm", model, Layout(tp=2, dp=2), Workload(prompt=16, decode=2),
                       EngineOptions(eager=True, gpu=gpu))
    ops = pattern.stages[0][0].step.ops  # prefill: 16 tokens on each DP rank
    by_tag = {op.tag: op for op in ops}
    hidden = by_tag["layers.0.mlp.experts.dispatch.hidden_states"]
    combine = by_tag["layers.0.mlp.experts.combine"]
    reduce = by_tag["layers.0.mlp.experts"]
    # 2 DP ranks x 16 tokens gathered: [16, w] -> [32, w]; combine back; TP all-reduce [16, w].
    assert (hidden.shape, hidden.out_shape) == ((16, w_in), (32, w_in))
    assert (combine.shape, combine.out_shape) == ((32, w_out), (16, w_out))
    assert reduce.kind == OpKind.ALLREDUCE and reduce.shape == (16, w_out)
