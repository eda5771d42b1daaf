"""The report's title and heading for one run: what ran, on what, with which versions, so a
shared page or screenshot stands alone."""
import re
from typing import Any

from microbench.results.runs import RunFolder


def _version_words(versions: dict[str, Any]) -> str:
    """Library versions without their raw banners ("MPICH Version:      5.0.2" -> MPICH 5.0.2)."""
    said = []
    for key in ("nccl", "mpi_library", "torch", "mpi4py", "cuda"):
        value = versions.get(key)
        if value:
            text = re.sub(r"\s*Version:?\s*", " ", str(value).split(",")[0]).strip()
            said.append(text if key == "mpi_library" else f"{key} {text}")
    return ", ".join(said)


def run_heading(run: RunFolder) -> str:
    """One line: model and engine, layout, workload, iterations, backend, versions, hosts."""
    m = run.meta
    pattern = m.get("pattern") or {}
    model = (pattern.get("model") or {}).get("name", "?")
    engine = (pattern.get("engine") or {}).get("name", "")
    lay = pattern.get("layout") or {}
    w = pattern.get("workload") or {}
    hosts = sorted(set(m.get("hosts") or []))
    parts = [f"{model} ({engine})" if engine else model if pattern else str(m.get("kind"))]
    if lay:
        parts.append(f"TP{lay.get('tp', 1)} PP{lay.get('pp', 1)}"
                     + (f" DP{lay['dp']}" if lay.get("dp", 1) > 1 else ""))
    if w:
        parts.append(f"prompt {w.get('prompt')}, decode {w.get('decode')}, "
                     f"batch {w.get('batch')}, {w.get('dtype')}")
    if m.get("iterations"):
        parts.append(f"{m['iterations']} iterations")
    parts.append(f"{m.get('backend')} on {m.get('device')}, {m.get('world_size')} ranks")
    versions = _version_words(m.get("versions") or {})
    if versions:
        parts.append(versions)
    if hosts:
        parts.append("hosts " + ", ".join(hosts[:4]) + (" ..." if len(hosts) > 4 else ""))
    return " | ".join(parts)
