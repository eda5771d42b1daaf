"""A pattern for people (a profile table, the ordered calls of a step) and for tools (JSON, CSV)."""

import csv
import io
from dataclasses import asdict
from typing import Any

from microbench.views.textfmt import format_bytes, render_table
from patterns import Op, Pattern, Phase, pattern_rows, volume_by_group, volume_bytes
from patterns.config_checks import unknown_family_note
from patterns.dp_steps import wave_tail
from patterns.moe import notes
from patterns.summary import moe_layer_rows, transport_split
from patterns.volume import as_number


def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def pattern_header(pattern: Pattern) -> dict[str, Any]:
    """model, layout, workload and engine: what every pattern-derived file starts with."""
    m, lay, w = pattern.model, pattern.layout, pattern.workload
    return {
        "model": {"name": m.name, "hidden_size": m.hidden_size,
                  "num_hidden_layers": m.num_hidden_layers, "vocab_size": m.vocab_size,
                  "num_attention_heads": m.num_attention_heads,
                  "num_key_value_heads": m.num_key_value_heads,
                  "num_local_experts": m.num_local_experts, "source": m.source},
        "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep,
                   "world_size": lay.world_size},
        "workload": {"prompt": w.prompt, "decode": w.decode, "batch": w.batch,
                     "dp_batches": list(w.dp_batches) if w.dp_batches else None,
                     "dtype": w.dtype, "decode_steps": w.decode_steps},
        "engine": {"name": pattern.engine, **asdict(pattern.options)},
        "notes": pattern_notes(pattern),
    }


def calls_per_inference(pattern: Pattern) -> int:
    """Calls one rank issues per inference, the busiest stage's."""
    return max(pattern.calls_per_inference(s) for s in range(pattern.layout.pp))


def pattern_document(pattern: Pattern, with_steps: bool = False) -> dict[str, Any]:
    doc = pattern_header(pattern)
    doc["rows"] = [
        {**asdict(row), "phase": row.phase.value, "shape": list(row.shape),
         "out_shape": list(row.out_shape), "transport": row.transport.value}
        for row in pattern_rows(pattern)
    ]
    doc["volume_bytes"] = {k: as_number(v) for k, v in volume_bytes(pattern).items()}
    doc["volume_by_group"] = {k: as_number(v) for k, v in volume_by_group(pattern).items()}
    doc["notes"] = pattern_notes(pattern)
    if pattern.model.is_moe:
        doc["moe_layers"] = [{**asdict(row), "phase": row.phase.value}
                             for row in moe_layer_rows(pattern)]
    doc["calls_per_inference"] = calls_per_inference(pattern)
    tail_steps, tail_calls = wave_tail(pattern.stages[0])
    if tail_steps:  # vLLM's DP wave: dummy forwards to the 32-step sync, counted above
        doc["wave_tail_steps"], doc["wave_tail_calls"] = tail_steps, tail_calls
    if with_steps:
        doc["steps"] = [
            {"stage": stage, "phase": phase.value, "tokens": step.tokens, "rows": step.rows,
             "ops": [_op_dict(op) for op in step.ops]}
            for stage, phase, step in _first_steps(pattern)
        ]
    return doc


def _op_dict(op: Op) -> dict[str, Any]:
    return {"op": op.kind.value, "group": op.group, "group_size": op.group_size,
            "shape": list(op.shape), "out_shape": list(op.out_shape), "dtype": op.dtype,
            "tag": op.tag, "peer": op.peer, "root": op.root, "transport": op.transport.value}


def _first_steps(pattern: Pattern) -> list[tuple[int, Phase, Any]]:
    found = []
    for stage in range(pattern.layout.pp):
        for phase in Phase:
            step = pattern.first_step(stage, phase)
            if step is not None:
                found.append((stage, phase, step))
    return found


def pattern_csv(pattern: Pattern) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["phase", "stage", "op", "group", "group_size", "shape", "out_shape",
                     "dtype", "count", "bytes", "transport"])
    for row in pattern_rows(pattern):
        writer.writerow([row.phase.value, row.stage, row.op, row.group, row.group_size,
                         "x".join(map(str, row.shape)), "x".join(map(str, row.out_shape)),
                         row.dtype, row.count, row.bytes, row.transport.value])
    return out.getvalue()


def trace_title(pattern: Pattern) -> str:
    """A trace's pattern has no model or prompt length (patterns/traces/to_pattern.py): name
    its ranks (host:pid:rank), layout, steps and dtype."""
    lay, w = pattern.layout, pattern.workload
    files = pattern.model.source if len(pattern.model.source) <= 80 else \
        pattern.model.source[:77] + "..."
    return (f"trace {files} | tp={lay.tp} pp={lay.pp} ({lay.world_size} ranks) | "
            f"1 prefill + {w.decode - 1} decode step(s) as traced | {w.dtype}")


def title(pattern: Pattern) -> str:
    if pattern.engine == "trace":
        return trace_title(pattern)
    m, lay, w = pattern.model, pattern.layout, pattern.workload
    dp = f" dp={lay.dp}" if lay.dp > 1 else ""
    ep = f" ep={lay.ep_size}" if lay.ep else ""
    batch = (f"dp-batches={','.join(map(str, w.dp_batches))}" if w.dp_batches
             else f"batch={w.batch}" + (" per DP rank" if lay.dp > 1 else ""))
    requests = getattr(pattern, "requests", None)
    if requests:  # a request workload: its requests, not its largest one
        from microbench.views.workload import span
        batch = (f"{len(requests):,} request{'s' if len(requests) != 1 else ''} "
                 f"(prompt {span(r.prompt for r in requests)}, output "
                 f"{span(r.output for r in requests)})")
        return (f"{pattern.engine} | {m.name} (h={m.hidden_size}, L={m.num_hidden_layers}, "
                f"V={m.vocab_size}) | tp={lay.tp} pp={lay.pp}{dp}{ep} ({lay.world_size} "
                f"ranks) | {batch} {w.dtype}")
    return (f"{pattern.engine} | {m.name} (h={m.hidden_size}, L={m.num_hidden_layers}, "
            f"V={m.vocab_size}) | tp={lay.tp} pp={lay.pp}{dp}{ep} ({lay.world_size} ranks) | "
            f"prompt={w.prompt} decode={w.decode} {batch} {w.dtype}")


def pattern_notes(pattern: Pattern) -> list[str]:
    """What the table alone would not say: replicas, experts without EP, uneven DP ranks."""
    said = notes(pattern.model, pattern.layout, pattern.engine)
    family = unknown_family_note(pattern.model.model_type)
    if family is not None:
        said.append(family)
    if any(replica != pattern.dp_stages[0] for replica in pattern.dp_stages[1:]):
        said.append("DP ranks issue different shapes (--dp-batches): the rows are DP rank "
                    "0's; the volume counts every rank's calls")
    return said


def moe_table(pattern: Pattern) -> str:
    """Per phase and layer kind, one layer's dispatch, combine and other calls (first step
    of the phase, a rank of DP rank 0)."""
    rows = [[row.phase.value, row.kind, str(row.layers), str(row.tokens),
             str(row.dispatch_calls), format_bytes(row.dispatch_bytes),
             str(row.combine_calls), format_bytes(row.combine_bytes),
             str(row.other_calls), format_bytes(row.other_bytes)]
            for row in moe_layer_rows(pattern)]
    if not rows:
        return ""
    header = ["phase", "layer", "layers", "T", "dispatch", "dispatch bytes", "combine",
              "combine bytes", "other", "other bytes"]
    return render_table(header, rows, right_align=set(header) - {"phase", "layer"})


def pattern_table(pattern: Pattern) -> str:
    """The profile table: per phase and stage, each distinct call with its count and bytes."""
    header = ["phase", "stage", "op", "group", "shape", "out_shape", "dtype", "transport",
              "count", "bytes/call", "bytes/rank"]
    rows = [[row.phase.value, str(row.stage), row.op, f"{row.group}/{row.group_size}",
             shape_text(row.shape), shape_text(row.out_shape), row.dtype, row.transport.value,
             f"{row.count:,}", format_bytes(row.bytes), format_bytes(row.bytes * row.count)]
            for row in pattern_rows(pattern)]
    volume = volume_bytes(pattern)
    parts = [f"{kind} {format_bytes(float(v))}" for kind, v in volume.items()
             if v and kind not in ("p2p", "total")]
    prefill_steps = sum(r.repeat for r in pattern.stages[0] if r.phase == Phase.PREFILL)
    tail_steps, tail_calls = wave_tail(pattern.stages[0])
    by_group = volume_by_group(pattern)
    group_parts = [f"{group} {format_bytes(float(v))}" for group, v in by_group.items() if v]
    moe = moe_table(pattern)
    busiest = max(range(pattern.layout.pp), key=pattern.calls_per_inference)
    sent = sum(row.bytes * row.count for row in pattern_rows(pattern) if row.stage == busiest
               and row.op != "recv")
    lines = [
        title(pattern),
        *[f"note: {note}" for note in pattern_notes(pattern)],
        f"steps per inference: {prefill_steps} prefill + {pattern.workload.decode_steps} "
        "decode" + (f" + {tail_steps} wave tail" if tail_steps else ""),
        *([f"wave tail: {tail_steps} dummy forwards, {tail_calls:,} calls (the DP ranks' "
           f"lockstep after the last real step, to the wave's sync at step "
           f"{sum(r.repeat for r in pattern.stages[0])}; counted in the calls per rank)"]
          if tail_steps else []),
        f"per rank (busiest): {calls_per_inference(pattern):,} calls, {format_bytes(sent)} "
        "sent per inference (bytes sent: each call's input buffer, as the table's bytes/rank)",
        "",
        render_table(header, rows, right_align={"stage", "count", "bytes/call", "bytes/rank"}),
        "",
        transport_table(pattern),
        "",
        f"whole deployment: {format_bytes(float(volume['total']))} on the wire per inference "
        "(bus volume: every call of every rank once, an all-reduce 2(n-1)/n of its size, an "
        "all-gather (n-1)/n of its output, a send its size): "
        + (", ".join(parts) if parts else "none (one rank)"),
    ]
    if len(by_group) > 1 or any(g != "tp" for g in by_group):
        lines.append("bus volume by group: " + (", ".join(group_parts) or "none"))
    if moe:
        lines += ["", "per layer, first step of each phase (bytes: one rank's inputs):", moe]
    return "\n".join(lines)


def transport_table(pattern: Pattern) -> str:
    """Per phase, the calls and bytes one rank of each stage sends through each transport
    (summed over stages), as the engine would under its defaults."""
    rows = []
    for phase, split in transport_split(pattern).items():
        total = sum(calls for calls, _ in split.values())
        for transport, (calls, nbytes) in sorted(split.items(), key=lambda kv: -kv[1][0]):
            rows.append([phase.value, transport.value, f"{calls:,}",
                         f"{100 * calls / total:.1f}%", format_bytes(nbytes)])
    return ("calls and bytes per transport (one rank per stage, summed over stages):\n"
            + render_table(["phase", "transport", "calls", "share", "bytes"], rows,
                           right_align={"calls", "share", "bytes"}))


def steps_text(pattern: Pattern) -> str:
    """The exact ordered calls of the first prefill step and a decode step, per stage."""
    blocks = [title(pattern)]
    for stage, phase, step in _first_steps(pattern):
        blocks.append(f"\nstage {stage}, {phase.value} step (T={step.tokens}, S={step.rows}): "
                      f"{len(step.ops)} calls")
        rows = [[str(i), op.kind.value, f"{op.group}/{op.group_size}", shape_text(op.shape),
                 shape_text(op.out_shape), op.dtype, op.transport.value, _peer_text(op), op.tag]
                for i, op in enumerate(step.ops, 1)]
        blocks.append(render_table(["#", "op", "group", "shape", "out_shape", "dtype",
                                    "transport", "peer", "tag"], rows, right_align={"#"}))
    return "\n".join(blocks)


def _peer_text(op: Op) -> str:
    if op.peer is not None:
        return f"{'to' if op.kind.value == 'send' else 'from'} stage {op.peer}"
    if op.root is not None:
        return f"root {op.root}"
    return ""


def pattern_summary(pattern: Pattern) -> dict[str, Any]:
    doc = pattern_document(pattern)
    return {k: doc[k] for k in ("model", "layout", "workload", "engine", "volume_bytes",
                                "calls_per_inference", "rows")}
