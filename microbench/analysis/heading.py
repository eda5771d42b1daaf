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


def _library(meta: dict[str, Any]) -> str:
    """The library that moved the bytes, in words: NCCL 2.21.5, MPICH 5.0.2, torch 2.13.0."""
    v = meta.get("versions") or {}
    if meta.get("kv_transport") == "nixl" and v.get("nixl"):  # "nixl-cu12 1.5.1"
        return str(v["nixl"])
    if meta.get("kv_transport") == "mooncake" and v.get("mooncake"):
        return f"{v['mooncake']} ({v.get('mooncake_protocol', 'tcp')})"
    for key, name in (("nccl", "NCCL"), ("mpi_library", ""), ("torch", "torch")):
        if v.get(key):
            text = re.sub(r"\s*Version:?\s*", " ", str(v[key]).split(",")[0]).strip()
            text = " ".join(text.split())[:32]
            return f"{name} {text}".strip()
    return ""


def _user_label(meta: dict[str, Any]) -> str:
    """--label as given on the command line, unless it repeats what the heading says anyway
    (the default's form, replay-MODEL-... or sweep-...)."""
    argv = [str(a) for a in meta.get("argv") or []]
    label = ""
    for i, arg in enumerate(argv):
        if arg == "--label" and i + 1 < len(argv):
            label = argv[i + 1]
        elif arg.startswith("--label="):
            label = arg.split("=", 1)[1]
    return "" if label.startswith(("replay-", "sweep-")) else label


def run_labels(runs: list[RunFolder]) -> list[str]:
    """A name per run for legends and tables that says what the run was, so that a figure
    shared alone still reads: transport and library ("gloo, torch 2.13.0+cpu", "mpi-host,
    MPICH 5.0.2"), after the user's --label when there is one ("drift-1 (mpi-host, ...)").
    Runs of one kind that would share a name get their start time (UTC), then a count."""
    names = []
    for run in runs:
        m = run.meta
        # a disaggregated replay is named by its KV transport (nixl, rma, p2p, torch)
        what = ", ".join(x for x in (str(m.get("transport") or m.get("kv_transport")
                                         or m.get("backend") or "?"), _library(m)) if x)
        user = _user_label(m)
        names.append(f"{user} ({what})" if user else what)
    out = list(names)
    for i, run in enumerate(runs):
        twins = [j for j, r in enumerate(runs) if names[j] == names[i] and r.kind == run.kind]
        if len(twins) > 1:
            stamp = str(run.meta.get("created_utc", ""))[11:19]
            out[i] = f"{names[i]} ({stamp})" if stamp else names[i]
    stamped = list(out)
    for i, run in enumerate(runs):
        twins = [j for j, r in enumerate(runs) if stamped[j] == stamped[i] and r.kind == run.kind]
        if len(twins) > 1:
            out[i] = f"{stamped[i]} #{twins.index(i) + 1}"
    return out


METRIC_WORDS = {"prefill_us": "prefill", "decode_step_us": "decode step", "e2e_us": "end to end"}


def metric_words(metric: str) -> str:
    """prefill_us -> prefill, allreduce_us -> allreduce: names for figures, not column keys."""
    return METRIC_WORDS.get(metric, metric.removesuffix("_us"))


def runs_heading(runs: list[RunFolder], labels: list[str]) -> str:
    """The heading of a page of several runs: what they share (model, layout, workload,
    ranks, hosts: the parts of run_heading equal in every run), then the runs by name."""
    shared = run_heading(runs[0]).split(" | ")
    for run in runs[1:]:
        theirs = set(run_heading(run).split(" | "))
        shared = [part for part in shared if part in theirs]
    if len({run.kind for run in runs}) > 1:  # replays beside sweeps: say which is which
        labels = [f"{run.kind} {label}" for run, label in zip(runs, labels, strict=True)]
    return " | ".join([*shared, f"{len(runs)} runs: " + " vs ".join(labels)])
