"""From run folders to the report's tables and figures (the HTML page: `report_html.py`).

Everything comes from the files runs wrote (and, for patterns, from `patterns`, which is pure
computation): nothing is rerun.
"""

import json
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from microbench.analysis import figures
from microbench.analysis.compare import compare_runs, mismatch
from microbench.analysis.heading import metric_words, run_labels
from microbench.analysis.sameness import same_run
from microbench.argtypes import UsageError
from microbench.results.runs import (
    RunFolder,
    kv_samples,
    replay_samples,
    run_pattern,
    sweep_table,
)
from patterns import ConfigError, Layout, Pattern, generate, pattern_rows, volume_bytes

DECODE_LENGTHS = (1, 4, 16, 64, 256, 1024, 4096)


@dataclass
class Entry:
    name: str  # file stem for `plot`
    title: str
    figure: Any
    caption: str


def phase_rows(runs: list[tuple[str, RunFolder]]) -> list[dict[str, Any]]:
    rows = []
    for label, run in runs:
        row: dict[str, Any] = {"label": label}
        for key, samples in replay_samples(run).items():
            row[key] = float(np.median(samples))
            row[f"{key}_p5"], row[f"{key}_p95"] = map(float, np.percentile(samples, [5, 95]))
        rows.append(row)
    return rows


def kv_rows(runs: list[tuple[str, RunFolder]]) -> list[dict[str, Any]]:
    """One row a disaggregated replay: what moved, median and p5-p95 of its transfer time."""
    rows = []
    for label, run in runs:
        samples = kv_samples(run)["kv_transfer_us"]
        m = run.meta
        rows.append({"label": label, "disagg": m.get("disagg"), "connector": m.get("connector"),
                     "kv_transport": m.get("kv_transport"),
                     "bytes": m.get("kv_transfer_bytes"),
                     "median_us": float(np.median(samples)),
                     "p5_us": float(np.percentile(samples, 5)),
                     "p95_us": float(np.percentile(samples, 95))})
    return rows


def op_rows(runs: list[tuple[str, RunFolder]]) -> list[dict[str, Any]]:
    return [{"label": label, "kind": key.removesuffix("_us"), "time_us": float(np.median(v))}
            for label, run in runs for key, v in replay_samples(run).items()
            if key not in ("prefill_us", "decode_step_us", "e2e_us")]


def layouts_for(pattern: Pattern) -> list[Layout]:
    """Every (tp, pp) with tp x pp = the run's world size that the model accepts."""
    world = pattern.layout.world_size
    out = []
    for tp in range(1, world + 1):
        if world % tp:
            continue
        try:
            layout = Layout(tp=tp, pp=world // tp)
            layout.check_model(pattern.model)
        except ConfigError:
            continue
        out.append(layout)
    return out


def _name(layout: Layout) -> str:
    """TP2, PP2, TP2xPP2, DP2 (replicas), DP2xTP2 EP; TP1 for one rank."""
    parts = [f"DP{layout.dp}"] if layout.dp > 1 else []
    if layout.tp > 1 or (layout.pp == 1 and layout.dp == 1):
        parts.append(f"TP{layout.tp}")
    if layout.pp > 1:
        parts.append(f"PP{layout.pp}")
    return "x".join(parts) + (" EP" if layout.ep else "")


def volume_rows(pattern: Pattern) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volume by kind per layout at the run's workload, total volume vs decode length)."""
    by_layout, by_decode = [], []
    for layout in layouts_for(pattern):
        try:
            vol = volume_bytes(generate(pattern.engine, pattern.model, layout,
                                        pattern.workload, pattern.options))
            row: dict[str, Any] = {"layout": _name(layout)}
            row.update({k: float(v) for k, v in vol.items() if k not in ("p2p", "total")})
            by_layout.append(row)
            for sd in sorted({*DECODE_LENGTHS, pattern.workload.decode}):
                w = replace(pattern.workload, decode=sd)
                total = volume_bytes(generate(pattern.engine, pattern.model, layout, w,
                                              pattern.options))["total"]
                by_decode.append({"layout": _name(layout), "decode": sd,
                                  "volume_bytes": float(total)})
        except (ConfigError, ValueError):  # a layout the engine or the volume rules refuse
            continue
    return by_layout, by_decode


def sweep_rows(runs: list[tuple[str, RunFolder]]) -> list[dict[str, Any]]:
    return [{**row, "label": label} for label, run in runs for row in sweep_table(run)]


def comparison_rows(runs: list[tuple[str, RunFolder]], threshold: float,
                    notes: list[str]) -> list[dict[str, Any]]:
    """Each same-kind run against the first of its kind; runs that differ are left out."""
    rows = []
    for kind in ("replay", "sweep", "kvtransfer"):
        mine = [(label, run) for label, run in runs if run.kind == kind]
        if len(mine) < 2:
            continue
        kept = [mine[0]]
        for label, run in mine[1:]:
            why = mismatch(mine[0][1], run) or same_run(mine[0][1], run)
            if why:
                notes.append(f"{label} not compared with {mine[0][0]}: {why}")
            else:
                kept.append((label, run))
        if len(kept) < 2:
            continue
        names = {str(run.path): label for label, run in kept}
        for c in compare_runs([run for _, run in kept], threshold):
            rows.append({**c.as_dict(), "label": f"{metric_words(c.metric)}: {names[c.run]} "
                                                 f"/ {kept[0][0]}"})
    return rows


def _pattern_or_note(label: str, run: RunFolder, notes: list[str]) -> Pattern | None:
    """The run's pattern; when it cannot be rebuilt (a config.json since moved), a note."""
    try:
        return run_pattern(run)
    except UsageError as err:
        notes.append(f"{label}: no pattern figures: {err}")
        return None


def predicted_rows(runs: list[tuple[str, RunFolder]], sweep: RunFolder,
                   notes: list[str]) -> list[dict[str, Any]]:
    from microbench.analysis.fits import fit_sweep, unstable_sizes
    from microbench.analysis.predict import caveats, predict_pattern

    fits = fit_sweep(sweep_table(sweep))
    notes += [f"sweep {sweep.name}: {u}" for u in unstable_sizes(sweep_table(sweep))]
    rows = []
    for label, run in runs:
        if run.kind != "replay":
            continue
        pattern = _pattern_or_note(label, run, notes)
        if pattern is None:
            continue
        notes += [f"{label}: {c}" for c in caveats(sweep.meta, pattern, run.meta)]
        try:  # a call the sweep cannot price: said, as the plan page says it
            predicted, _ = predict_pattern(pattern, fits)
        except UsageError as err:
            notes.append(f"{label}: not predicted: {err}")
            continue
        measured = {k: float(np.median(v)) for k, v in replay_samples(run).items()}
        rows += [{"label": f"{label}: {metric_words(k)}", "run": label,
                  "metric": metric_words(k), "predicted_us": v, "measured_us": measured.get(k)}
                 for k, v in predicted.items()]
    return rows


def plan_rows(runs: list[tuple[str, RunFolder]], sweep: RunFolder,
              notes: list[str]) -> list[dict[str, Any]]:
    """Every layout of each replayed pattern's world (dp x tp x pp, with ep for MoE models,
    as `plan` enumerates them), predicted from the sweep in the replay's order (so that
    replays can be read against it), with the measured replays of the same model and
    workload beside their layout."""
    from microbench.analysis.fits import fit_sweep
    from microbench.analysis.layouts import layout_of, valid_layouts
    from microbench.analysis.predict import predict_pattern

    fits = fit_sweep(sweep_table(sweep))
    groups: dict[str, tuple[Pattern, dict[str, list[str]]]] = {}
    for label, run in runs:
        pattern = _pattern_or_note(label, run, [])
        if pattern is None:
            continue
        key = json.dumps([pattern.model.name, pattern.layout.world_size, pattern.engine,
                          repr(pattern.workload), repr(pattern.options)])
        _, measured = groups.setdefault(key, (pattern, {}))
        measured.setdefault(_name(pattern.layout), []).append(label)
    rows = []
    for pattern, measured in groups.values():
        title = (f"{pattern.model.name}, {pattern.layout.world_size} ranks, prompt "
                 f"{pattern.workload.prompt}, decode {pattern.workload.decode}")
        shapes, _ = valid_layouts(pattern.model, pattern.layout.world_size)
        for layout in (layout_of(shape) for shape in shapes):  # as `plan` lists them
            try:
                other = generate(pattern.engine, pattern.model, layout, pattern.workload,
                                 pattern.options)
                predicted, _ = predict_pattern(other, fits)
            except (ConfigError, UsageError) as err:
                notes.append(f"plan {title}, {_name(layout)}: not predicted: {err}")
                continue
            row = {"group": title, "layout": _name(layout),
                   "predicted_e2e_us": predicted["e2e_us"],
                   "predicted_prefill_us": predicted["prefill_us"],
                   "predicted_decode_step_us": predicted.get("decode_step_us"),
                   "measured": []}
            for label in measured.get(_name(layout), []):
                run = dict(runs)[label]
                row["measured"].append({"label": label, "e2e_us": float(
                    np.median(replay_samples(run)["e2e_us"]))})
            rows.append(row)
    return rows


def build(paths: list[RunFolder], sweep: RunFolder | None, threshold: float,
          ) -> tuple[list[Entry], dict[str, Any]]:
    """Every figure the runs allow, and the tables the page shows beside them."""
    if not paths:
        raise UsageError("give at least one run folder")
    runs = list(zip(run_labels(paths), paths, strict=True))
    replays = [(label, r) for label, r in runs if r.kind == "replay"]
    sweeps = [(label, r) for label, r in runs if r.kind == "sweep"]
    notes: list[str] = []
    entries: list[Entry] = []
    tables: dict[str, Any] = {"notes": notes}
    if replays:
        rows = phase_rows(replays)
        tables["phases"] = rows
        entries.append(Entry("phase_times", "Time per phase", figures.phase_times(rows),
                             "Median over timed inferences, whiskers p5-p95; each inference "
                             "counts its slowest rank."))
        ops = op_rows(replays)
        if ops:
            entries.append(Entry("op_kind_times", "Time per op kind",
                                 figures.op_kind_times(ops),
                                 "Per inference, the summed time of each kind's calls on its "
                                 "slowest rank (runs with --timing op)."))
        seen: set[str] = set()
        for number, (label, run) in enumerate(replays, start=1):
            pattern = _pattern_or_note(label, run, notes)
            if pattern is None:
                continue
            key = json.dumps({k: run.meta["pattern"].get(k) for k in
                              ("model", "layout", "workload", "engine")}, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            suffix = f"_{number}" if len(replays) > 1 else ""  # file stems stay short
            title = (f"{pattern.model.name}, prompt {pattern.workload.prompt}, "
                     f"decode {pattern.workload.decode}")
            hist = [{"op": r.op, "bytes": r.bytes, "count": r.count}
                    for r in pattern_rows(pattern)]
            entries.append(Entry(f"message_sizes{suffix}", f"Message sizes ({label})",
                                 figures.message_histogram(hist, title),
                                 f"Calls per inference by size, {_name(pattern.layout)}: "
                                 "every stage's calls, one rank per stage."))
            by_layout, by_decode = volume_rows(pattern)
            if by_layout:
                entries.append(Entry(f"volume_by_layout{suffix}", f"Bus volume by layout ({label})",
                                     figures.volume_by_layout(by_layout, title),
                                     f"Layouts of {pattern.layout.world_size} ranks; every "
                                     "call of the deployment counted once, as bus bytes (an "
                                     "all-reduce 2(n-1)/n of its size)."))
                entries.append(Entry(f"volume_vs_decode{suffix}",
                                     f"Bus volume vs decode length ({label})",
                                     figures.volume_vs_decode(by_decode, pattern.model.name),
                                     "Total bus volume of one inference as Sd grows."))
    if sweeps:
        rows = sweep_rows(sweeps)
        entries.append(Entry("sweep_latency", "Latency vs size", figures.sweep_latency(rows),
                             "Median time per call (slowest rank), band p5-p95."))
        entries.append(Entry("sweep_busbw", "Bus bandwidth vs size", figures.sweep_busbw(rows),
                             "nccl-tests' bus bandwidth: algbw x the collective's factor."))
    transfers = [(label, r) for label, r in runs if r.kind == "kvtransfer"]
    if transfers:  # disaggregated replays: one request's KV transfer
        tables["kv_transfers"] = kv_rows(transfers)
    comparisons = comparison_rows(runs, threshold, notes)
    if comparisons:
        tables["comparisons"] = comparisons
        entries.append(Entry("ratios", "Run vs baseline", figures.ratios(comparisons),
                             "Ratio of medians with its 95% bootstrap interval; green faster, "
                             "red slower or regression, grey same within the threshold, "
                             "orange inconclusive (more runs or iterations needed); one run a "
                             "side: widened by the drift allowed (docs/compare.md)."))
    predicted = predicted_rows(replays, sweep, notes) if sweep is not None else []
    if predicted and sweep is not None:
        tables["predicted"] = predicted
        entries.append(Entry("predicted_vs_measured", "Predicted vs measured",
                             figures.predicted_vs_measured(predicted),
                             f"alpha-beta fits of sweep {sweep.name} summed over the pattern."))
    layouts = plan_rows(replays, sweep, notes) if sweep is not None and replays else []
    if layouts and sweep is not None:
        tables["plan"] = layouts
        groups = list(dict.fromkeys(r["group"] for r in layouts))
        for i, group in enumerate(groups):
            rows = [r for r in layouts if r["group"] == group]
            name = "plan_layouts" + (f"_{i + 1}" if len(groups) > 1 else "")
            entries.append(Entry(name, f"Layouts: {group}",
                                 figures.plan_layouts(rows, group),
                                 f"Every layout of the world, end to end predicted from sweep "
                                 f"{sweep.name} (bars; the replay's order), and the replays "
                                 "measured of that layout (markers, median). Communication "
                                 "only."))
    tables["runs"] = runs
    return entries, tables
