"""A disaggregated deployment for people (a table) and for tools (JSON): the prefill side's
calls, the KV transfer's rows, the decode side's calls, and `kv_transfer_bytes`."""

from dataclasses import asdict
from typing import Any

from microbench.views.pattern import pattern_header
from microbench.views.textfmt import format_bytes, render_table
from patterns import Phase, pattern_rows, volume_bytes
from patterns.disagg import DisaggPattern, KVTransfer, Pair
from patterns.disagg.layouts import side_text
from patterns.volume import as_number


def pair_dict(transfer: KVTransfer, pair: Pair, decode_offset: int) -> dict[str, Any]:
    """One rank pair; ranks are job ranks (prefill side first, then the decode side)."""
    return {"prefill_rank": pair.prefill, "decode_rank": decode_offset + pair.decode,
            "prefill_tp_rank": pair.prefill, "decode_tp_rank": pair.decode,
            "bytes": transfer.pair_bytes(pair), "descriptors": transfer.descriptor_count(pair),
            "descriptor_bytes": 0 if pair.dummy else transfer.descriptor_bytes(pair),
            "descriptor_groups": [{"descriptors": n, "bytes": size}
                                  for n, size in transfer.descriptor_groups(pair)],
            "src_head": pair.src_head, "dst_head": pair.dst_head, "heads": pair.heads,
            "notification_only": pair.dummy}


def transfer_rows(transfer: KVTransfer) -> list[dict[str, Any]]:
    """Pairs that move the same descriptors folded into one row, in pair order."""
    op = "kv_read" if transfer.direction == "read" else "kv_write"
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for pair in transfer.pairs:
        for key in transfer.descriptor_groups(pair) or [(0, 0)]:
            if key not in rows:
                rows[key] = {"phase": "transfer", "stage": 0, "op": op, "group": "kv",
                             "group_size": 2, "shape": [key[1]], "out_shape": [key[1]],
                             "dtype": "uint8", "count": key[0], "bytes": key[1],
                             "transport": transfer.connector.name, "pairs": 0}
            rows[key]["pairs"] += 1
    return list(rows.values())


def _side_rows(pattern: Any, phase: Phase, side: str) -> list[dict[str, Any]]:
    return [{**asdict(row), "phase": row.phase.value, "shape": list(row.shape),
             "out_shape": list(row.out_shape), "transport": row.transport.value, "side": side}
            for row in pattern_rows(pattern) if row.phase == phase]


def disagg_document(d: DisaggPattern) -> dict[str, Any]:
    t = d.transfer
    doc = pattern_header(d.decode)
    doc.pop("layout")
    doc["disagg"] = {side: {"tp": lay.tp, "dp": lay.dp, "world_size": lay.world_size}
                     for side, lay in (("prefill", d.disagg.prefill),
                                       ("decode", d.disagg.decode))}
    doc["disagg"]["world_size"] = d.disagg.world_size
    doc["disagg"]["spec"] = d.disagg.text()
    doc["connector"] = asdict(t.connector)
    doc["kv_cache"] = {"dtype": d.kv_cache_dtype, "block_tokens": t.prefill.block_tokens,
                       "blocks": t.prefill.blocks, "layers": t.prefill.layers,
                       "regions": t.prefill.regions,
                       "prefill_rank_bytes": t.prefill.rank_bytes,
                       "decode_rank_bytes": t.decode.rank_bytes}
    doc["kv_transfer_bytes"] = t.total_bytes
    doc["kv_cache"]["attention_backend"] = t.backend or None
    doc["kv_transfer"] = {"direction": t.direction, "granularity": t.granularity,
                          "when": t.when, "tokens": t.tokens, "transfers": t.transfers,
                          "chunk_blocks": list(t.chunks) or None,
                          "pairs": [pair_dict(t, p, d.disagg.decode_offset) for p in t.pairs]}
    doc["rows"] = (_side_rows(d.prefill, Phase.PREFILL, "prefill")
                   + [{**row, "side": "transfer"} for row in transfer_rows(t)]
                   + _side_rows(d.decode, Phase.DECODE, "decode"))
    doc["volume_bytes"] = {
        "prefill": as_number(volume_bytes(d.prefill)["total"]),
        "decode": as_number(volume_bytes(d.decode)["total"]
                            - _prefill_volume(d.decode)),
        "kv_transfer": t.total_bytes}
    weights, cache = d.decode_memory
    doc["decode_memory"] = {"weight_bytes_per_gpu": weights, "kv_cache_bytes_per_gpu": cache}
    doc["notes"] = disagg_notes(d)
    return doc


def _prefill_volume(pattern: Any) -> Any:
    """The volume of a pattern's prefill step(s): its decode side does not run them."""
    from dataclasses import replace
    prefill_only = replace(pattern, stages=tuple(
        tuple(r for r in runs if r.phase == Phase.PREFILL) for runs in pattern.stages),
        dp_stages=())
    return volume_bytes(prefill_only)["total"]


def disagg_notes(d: DisaggPattern) -> list[str]:
    t = d.transfer
    notes = [f"{t.connector.source}: {t.when}",
             *_cache_notes(d),
             "the decode side's rows are its decode steps; its prefill step is replaced by "
             "the transfer (vLLM's first decode-side step also recomputes the last prompt "
             "token)",
             "one request's KV per transfer; a batch moves one transfer per request"]
    if any(p.dummy for p in t.pairs):
        notes.append("MLA with more prefill than decode ranks: one prefill rank a decode "
                     "rank sends the latent, the others only a notification")
    if d.disagg.prefill.dp > 1 or d.disagg.decode.dp > 1:
        notes.append("dp replicas: a request goes to one replica a side; the pairs are of "
                     "replica 0 of each")
    return notes


def _cache_notes(d: DisaggPattern) -> list[str]:
    t, model = d.transfer, d.decode.model
    notes = []
    if t.backend:
        unit, engine = (("blocks", "vLLM") if t.connector.engine == "vllm" else
                        ("pages", "SGLang"))
        notes.append(f"{unit} of {t.prefill.block_tokens} tokens: {engine}'s {t.backend} "
                     f"attention backend on the {d.decode.options.gpu}")
    if t.connector.engine == "vllm" and model.sliding_window and model.sliding_layers:
        kept = -(-model.sliding_window // t.prefill.block_tokens) + 1
        notes.append(f"hybrid KV cache manager: {t.prefill.layers} tensors a rank shared by the "
                     f"full and sliding-window groups; sliding-window groups "
                     f"({model.sliding_window} tokens) move their last {kept} blocks at most")
    if t.swa_layers:
        notes.append(f"SGLang's hybrid SWA pool: {t.swa_layers} sliding-window layers move the "
                     f"window's last {t.swa_blocks} pages, one run a layer and K/V, in a "
                     f"transfer of their own after the last chunk")
    if t.chunks:
        notes.append(f"chunked prefill: {len(t.chunks)} transfers of "
                     f"{', '.join(map(str, t.chunks))} pages (one a chunk)")
    return notes


def disagg_table(d: DisaggPattern) -> str:
    t = d.transfer
    m, w = d.decode.model, d.decode.workload
    direction = "decode ranks READ (pull)" if t.direction == "read" else \
        "prefill ranks WRITE (push)"
    lines = [f"{d.decode.engine} {t.connector.name} @ {t.connector.version} | {m.name} | prefill "
             f"{side_text(d.disagg.prefill)} -> decode {side_text(d.disagg.decode)} "
             f"({d.disagg.world_size} ranks) | prompt={w.prompt} decode={w.decode} "
             f"batch={w.batch} {w.dtype} | kv cache {d.kv_cache_dtype}",
             f"KV transfer of one request: {format_bytes(t.total_bytes)} ({t.total_bytes:,} "
             f"bytes), {t.prefill.blocks} blocks of {t.prefill.block_tokens} tokens x "
             f"{t.prefill.layers * t.prefill.regions} regions; {direction}; "
             f"{sum(1 for p in t.pairs if not p.dummy)} rank pairs", ""]
    header = ["prefill rank", "decode rank", "descriptors", "bytes/descriptor", "bytes",
              "heads"]
    rows = [[str(p["prefill_rank"]), str(p["decode_rank"]), f"{p['descriptors']:,}",
             format_bytes(p["descriptor_bytes"]), format_bytes(p["bytes"]),
             "notification" if p["notification_only"] else
             f"{p['src_head']}+{p['heads']} -> {p['dst_head']}"]
            for p in (pair_dict(t, pair, d.disagg.decode_offset) for pair in t.pairs)]
    lines.append(render_table(header, rows, right_align=set(header) - {"heads"}))
    doc = disagg_document(d)
    calls = [[r["side"], r["phase"], r["op"], f"{r['group']}/{r['group_size']}",
              str(r["shape"]), r["transport"], f"{r['count']:,}", format_bytes(r["bytes"]),
              format_bytes(r["bytes"] * r["count"] * r.get("pairs", 1))]
             for r in doc["rows"]]
    lines += ["", "calls beside the transfer (count: calls of one rank, or descriptors of one "
              "pair; total: all pairs of a transfer row):",
              render_table(["side", "phase", "op", "group", "shape", "transport", "count",
                            "bytes/call", "total"], calls,
                           right_align={"count", "bytes/call", "total"})]
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def disagg_csv(d: DisaggPattern) -> str:
    """The rows of `disagg_document` as CSV: side, phase, op, ..., pairs (transfer rows)."""
    import csv
    import io

    out = io.StringIO()
    columns = ["side", "phase", "stage", "op", "group", "group_size", "shape", "dtype",
               "count", "bytes", "transport", "pairs"]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in disagg_document(d)["rows"]:
        writer.writerow([row["side"], row["phase"], row["stage"], row["op"], row["group"],
                         row["group_size"], "x".join(map(str, row["shape"])), row["dtype"],
                         row["count"], row["bytes"], row["transport"], row.get("pairs", "")])
    return out.getvalue()
