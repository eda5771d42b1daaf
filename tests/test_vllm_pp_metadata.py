"""vLLM's pipeline metadata: what `send_object` sends before each step's tensors, and its size.

vLLM @ c8109375 `distributed/parallel_state.py`: `isend_tensor_dict` (1019-1081) pickles
`[(key, TensorMetadata(tensor.device.type, tensor.dtype, tensor.size())), ...]` (70, 81-104)
with the standard library's pickle (28) and sends its length as one int64, then its bytes
(`send_object`, 822-847), over the gloo CPU group, before the tensors. The size is worked
out opcode by opcode in patterns/engines/vllm/pp_transfer.py; here it is held against
CPython's own pickle of that very list (real torch dtypes and sizes, the namedtuple under
vLLM's module name) and against vLLM's AVX2 build, which sent 183 bytes a step for the
engine tests' [T < 256, 128] fp32 (tests/test_real_engine_vllm.py, --isa avx2).
"""

import json
import pickle
import subprocess
import sys
import types
from collections import namedtuple
from pathlib import Path

import pytest

from patterns import EngineOptions, Layout, OpKind, Transport, Workload, generate
from patterns.engines.vllm.pp_transfer import metadata_pickle_bytes
from patterns.models import resolve_model

REPO = Path(__file__).resolve().parents[1]
KEYS = ("hidden_states", "residual")


def _vllm_pickle(shape: tuple[int, ...], dtype: str, device: str,
                 monkeypatch: pytest.MonkeyPatch) -> int:
    """len(pickle.dumps(metadata_list)) as vLLM builds it: TensorMetadata a namedtuple of
    `vllm.distributed.parallel_state` (stand-in modules of those names for this test alone:
    vLLM is not in this venv, and pickle imports a class's module to name it), real torch
    dtypes and torch.Size, a fresh device-type string a tensor (as `value.device.type`
    returns one)."""
    torch = pytest.importorskip("torch")
    metadata = namedtuple("TensorMetadata", ["device", "dtype", "size"])
    metadata.__module__ = "vllm.distributed.parallel_state"
    for name in ("vllm", "vllm.distributed", "vllm.distributed.parallel_state"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm.distributed.parallel_state"].TensorMetadata = metadata
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    listed = [(key, metadata("".join(list(device)), torch_dtype, torch.Size(shape)))
              for key in KEYS]
    return len(pickle.dumps(listed))


@pytest.mark.parametrize("shape, dtype, device, size", [
    # the AVX2 build's traces: [5, 128] and [1, 128] fp32 on the CPU, 183 bytes (by hand:
    # PROTO 2 + FRAME 9 + EMPTY_LIST 2 + MARK 1 + APPENDS 1 + STOP 1 = 16; hidden_states'
    # entry 16 + 53 + 6 + 20 + 17 + 4 + 2 + 10 = 128; residual's 11 + 2 + 6 + 2 + 2 + 4 + 2
    # + 10 = 39; 16 + 128 + 39 = 183)
    ((5, 128), "fp32", "cpu", 183),
    ((1, 128), "fp32", "cpu", 183),
    # T = 300 >= 256: BININT2, a byte more in each entry: 185
    ((300, 128), "fp32", "cpu", 185),
    # on GPUs "cuda", a byte longer than "cpu" in each entry: 185
    ((5, 128), "fp32", "cuda", 185),
    # Llama-3.1-8B, bf16 ("bfloat16" a byte longer than "float32", once), h 4096 (3 bytes)
    ((104, 4096), "bf16", "cuda", 188),
    # T >= 65,536: BININT, 5 bytes, 3 more than 104's in each entry: 188 + 6 = 194
    ((65536, 8192), "bf16", "cuda", 194),
    # "float16" as long as "float32", a byte shorter than "bfloat16": 187
    ((8, 2048), "fp16", "cuda", 187),
])
def test_the_pickled_size_by_hand_and_by_pickle(shape, dtype, device, size,
                                                monkeypatch) -> None:
    assert metadata_pickle_bytes(KEYS, shape, dtype, device) == size
    assert _vllm_pickle(shape, dtype, device, monkeypatch) == size


def test_the_pattern_sends_the_metadata_before_the_tensors_on_gloo() -> None:
    """Llama-3.1-8B PP2, prompt 100 (padded to the graph size 104), decode 3: each step
    stage 0 sends [1] int64 and [188] uint8 on the gloo CPU group, then the 2 tensors of
    104 x 4096 on NCCL; stage 1 receives them in that order."""
    pattern = generate("vllm", resolve_model("llama-3.1-8b"), Layout(pp=2),
                       Workload(100, 3), EngineOptions())
    for stage, kind in ((0, OpKind.SEND), (1, OpKind.RECV)):
        step = pattern.stages[stage][0].step
        p2p = [(op.shape, op.dtype, op.transport, op.tag) for op in step.ops if op.kind == kind]
        assert p2p == [((1,), "int64", Transport.GLOO, "pp.metadata.size"),
                       ((188,), "uint8", Transport.GLOO, "pp.metadata"),
                       ((104 * 4096,), "bf16", Transport.NCCL, "pp.hidden_states"),
                       ((104 * 4096,), "bf16", Transport.NCCL, "pp.residual")]


def test_the_cpu_builds_shared_memory_path_sends_no_metadata() -> None:
    pattern = generate("vllm", resolve_model("llama-3.1-8b"), Layout(pp=2), Workload(100, 3),
                       EngineOptions(pp_whole_tensors=True))
    tags = [op.tag for op in pattern.stages[0][0].step.ops if op.kind == OpKind.SEND]
    assert tags == ["pp.hidden_states", "pp.residual"]


def test_tensor_device_cpu_and_its_refusals() -> None:
    def metadata(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "microbench", "pattern", "--model",
                               "llama-3.1-8b", "--pp", "2", "--prompt", "8", "--decode", "2",
                               "--format", "json", *extra], cwd=REPO, capture_output=True,
                              text=True, timeout=60)

    proc = metadata("--tensor-device", "cpu")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["engine"]["tensor_device"] == "cpu"
    # "cpu" a byte shorter than "cuda" in each of the 2 entries: 188 - 2 = 186, on gloo
    assert [(r["phase"], r["stage"], r["op"], r["shape"], r["transport"]) for r in doc["rows"]
            if r["dtype"] == "uint8"] == [("prefill", 0, "send", [186], "gloo"),
                                          ("prefill", 1, "recv", [186], "gloo"),
                                          ("decode", 0, "send", [186], "gloo"),
                                          ("decode", 1, "recv", [186], "gloo")]
    proc = metadata("--engine", "sglang", "--tensor-device", "cpu")
    assert proc.returncode == 2 and "--tensor-device" in proc.stderr, proc.stderr
    proc = metadata("--tensor-device", "tpu")
    assert proc.returncode == 2 and "invalid choice: 'tpu'" in proc.stderr


def test_engines_lists_the_metadata_as_modelled() -> None:
    proc = subprocess.run([sys.executable, "-m", "microbench", "engines"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    vllm = proc.stdout.split("\nvllm: ")[1].split("\n\n")[0]
    assert "send_object" not in vllm.split("not modelled", 1)[1]
    assert "--tensor-device" in proc.stdout


def test_the_hint_names_the_pipeline_path_a_trace_took() -> None:
    """validate's rows (rank, phase, op, numel, dtype, group, trace, pattern): the metadata is
    the only uint8 a vLLM pipeline sends, so its presence on one side alone names the path."""
    from patterns.engines.vllm.pp_hints import pp_path_hint
    from patterns.traces.validate import Row

    def rows(trace: int, pattern: int, size: int = 183) -> list[Row]:
        return [Row(0, "decode", "send", size, "uint8", 2, trace, pattern),
                Row(0, "decode", "send", 128, "fp32", 2, 2, 2)]

    # a trace with the metadata held against --pp-whole-tensors
    assert "drop --pp-whole-tensors" in pp_path_hint(rows(1, 0), True, "cuda")
    # a shared-memory trace (no metadata) held against the GPU path
    assert "add --pp-whole-tensors" in pp_path_hint(rows(0, 1), False, "cuda")
    # both have it, the sizes differ: 183 (cpu) in the trace, 185 (cuda) in the pattern
    both = [*rows(1, 0), *rows(0, 1, 185)]
    assert pp_path_hint(both, False, "cuda") == (
        "the pickled pipeline metadata is 183 bytes in the trace, 185 in the pattern: it names "
        "the tensors' device type (--tensor-device cuda here; --tensor-device cpu?), dtype "
        "and shape")
    assert pp_path_hint(rows(1, 1), False, "cpu") is None
