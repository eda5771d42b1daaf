"""A real engine in CI: Hugging Face transformers' tensor-parallel generation on gloo ranks
(torchrun, `tp_plan="auto"`), profiled, and `infercomm validate` of its traces.

What transformers 5.x issues (read from the installed package, `transformers/distributed/`):
- `mixin.py:93-94`: a model with a tp_plan gets `embed_tokens: embedding_rowwise` (vocab
  split, partial lookups summed): one all-reduce of [B, T, h] per forward;
- the models' `base_model_tp_plan` (`models/llama/configuration_llama.py:49-57`,
  `models/qwen3_moe/configuration_qwen3_moe.py:56-69`): o_proj and down_proj `rowwise`
  (`tensor_parallel.py` RowwiseParallel: `dist.all_reduce` of the output); Qwen3-MoE's
  experts `moe_tp_experts` (MoeExpertsParallel: each rank runs its 1/tp shard of every
  expert, the partial outputs all-reduced once per layer);
- `lm_head: colwise_gather_output` (`models/llama/modeling_llama.py:412`): the logits of the
  last position, [B, 1, V/tp], all-gathered every step.
That is vLLM V1's per-step list at --eager (embedding, 2 per layer, logits [R, V_pad/tp]),
when V is a multiple of 64 (vLLM's padded vocabulary equals V) and nothing pads the batch.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
PROMPT, NEW = 5, 3  # 1 prefill step of 5 tokens, then 2 decode steps
HIDDEN, VOCAB, LAYERS = 64, 256, 2  # VOCAB = 4 * 64: vLLM pads nothing, tp 2 and 4 divide it


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Random weights of a tiny Llama and a tiny Qwen3-MoE, saved as HF checkpoints."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                  num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=64)
    configs = {"dense": LlamaConfig(**common),
               "moe": Qwen3MoeConfig(**common, head_dim=16, moe_intermediate_size=32,
                                     num_experts=8, num_experts_per_tok=2)}
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for kind, config in configs.items():
        out[kind] = root / kind
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out[kind])
    return out


def _generate(model_dir: Path, tp: int, out: Path) -> list[str]:
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={tp}", str(REPO / "tests" / "hf_tp_ranks.py"), str(model_dir),
         str(out), str(PROMPT), str(NEW)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(str(p) for p in out.glob("rank*.json"))
    assert len(files) == tp
    return files


@pytest.fixture(scope="module")
def traces(models, tmp_path_factory):
    """One traced generation per (model, tp), made when a test first asks for it."""
    made: dict[tuple[str, int], list[str]] = {}

    def get(kind: str, tp: int) -> list[str]:
        if (kind, tp) not in made:
            made[kind, tp] = _generate(models[kind], tp,
                                       tmp_path_factory.mktemp(f"{kind}-tp{tp}") / "trace")
        return made[kind, tp]
    return get


def _validate(files: list[str], model_dir: Path, tp: int, *extra: str):
    return subprocess.run(
        [sys.executable, "-m", "microbench", "validate", "--trace", *files,
         "--model", str(model_dir), "--tp", str(tp), "--prompt", str(PROMPT),
         "--decode", str(NEW), "--dtype", "fp32", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind, tp", [("dense", 2), ("dense", 4), ("moe", 2), ("moe", 4)])
def test_transformers_tp_matches_vllm_eager(models, traces, kind, tp):
    files = traces(kind, tp)
    proc = _validate(files, models[kind], tp, "--eager")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    # Per rank, by hand: each step 1 embedding + 2 layers x 2 = 5 all-reduces and 1 logits
    # all-gather; 3 steps: 18 calls. Prefill all-reduce numel 5 x 64 = 320, decode 64,
    # logits shard 256 / tp.
    assert f'"ranks":{tp},"calls":{18 * tp},' in proc.stdout
    table = proc.stdout
    assert " prefill  allreduce    320  fp32" in table
    assert " decode   allreduce     64  fp32" in table
    assert f"allgather  {VOCAB // tp:>5}  fp32" in table


def test_transformers_trace_against_a_different_pattern(models, traces):
    files = traces("dense", 2)
    # Without --eager vLLM pads the 5-token prefill to its CUDA-graph size 8: the pattern's
    # first call is the embedding all-reduce of 8 x 64 = 512, the trace's of 5 x 64 = 320.
    proc = _validate(files, models["dense"], 2)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
    assert ("first difference: rank 0: call 0 (prefill step 0, op 0 of the step) differs: "
            "the trace has allreduce 320 x fp32 (group of 2), the pattern has allreduce "
            "512 x fp32 (group of 2) [embed_tokens]") in proc.stdout
    # TRT-LLM pads no batch by default and splits the vocabulary as ceil(V/tp) = 128: the
    # same calls, exit 0.
    assert _validate(files, models["dense"], 2, "--engine", "trtllm").returncode == 0
