"""Rank 0 turns every rank's transfer times into a run folder, a table and the last line."""

import argparse
import json
import sys
from typing import Any

import numpy as np

from microbench.results.store import base_meta, csv_text, json_text, write_run_or_keep
from microbench.views.kv_transfer import disagg_document
from microbench.views.textfmt import format_bytes, format_us, render_table
from patterns.disagg import DisaggPattern


def transfer_figures(gathered: list[tuple], iterations: int) -> np.ndarray:
    """Per timed iteration, the slowest rank's time (us): the request's transfer is done
    when the last rank's part is."""
    per_rank = np.array([g[3] for g in gathered], dtype=np.float64).reshape(-1, iterations)
    return per_rank.max(axis=0)


def side_figures(gathered: list[tuple], iterations: int) -> dict[str, np.ndarray] | None:
    """With --with-collectives, per timed iteration: the prefill side's collectives (its
    slowest rank), the decode side's first decode step (its slowest rank)."""
    if any(g[5] is None for g in gathered):
        return None
    out = {}
    for key, index, side in (("prefill_comm_us", 0, "prefill"), ("decode_step_us", 1, "decode")):
        rows = [g[5][index] for g in gathered if g[1] == side]
        out[key] = np.array(rows, dtype=np.float64).reshape(-1, iterations).max(axis=0)
    return out


def write_transfer(d: DisaggPattern, args: argparse.Namespace, gathered: list[tuple],
                   versions: dict[str, Any], backend: Any) -> int:
    from microbench.ranks import cpus

    t = d.transfer
    figures = transfer_figures(gathered, args.iters)
    median = float(np.median(figures))
    p5, p95 = (float(np.percentile(figures, q)) for q in (5, 95))
    wrongs = [g[4] for g in gathered]
    wrong = None if any(w is None for w in wrongs) else sum(wrongs)
    hosts = [g[2] for g in gathered]
    where = cpus.placement(hosts, "cpu")
    head = {"kind": "kvtransfer", "backend": backend.name, "kv_transport": args.kv_transport,
            "device": "cpu", "world_size": backend.world_size, "engine": args.engine,
            "connector": t.connector.name, "connector_version": t.connector.version,
            "direction": t.direction,
            "model": d.decode.model.name, "disagg": d.disagg.text(),
            "prompt": t.tokens, "kv_cache_dtype": d.kv_cache_dtype,
            "kv_transfer_bytes": t.total_bytes,
            "pairs": sum(1 for p in t.pairs if not p.dummy),
            "descriptors": sum(t.descriptor_count(p) for p in t.pairs),
            "iterations": args.iters, "warmup": args.warmup}
    summary = {**head, "kv_transfer_us": round(median, 3), "kv_transfer_p5_us": round(p5, 3),
               "kv_transfer_p95_us": round(p95, 3),
               "gbps": round(t.total_bytes / median / 1e3, 6) if median > 0 else None,
               "wrong": wrong}
    meta = {**base_meta(args.argv), **head, "hosts": hosts, **where,
            "launcher": getattr(args, "launcher", None), "versions": versions,
            "check": args.check, "timeout_s": args.timeout, "pattern": disagg_document(d)}
    rows = [{"iteration": i, "kv_transfer_us": round(float(v), 3)}
            for i, v in enumerate(figures)]
    columns = ["iteration", "kv_transfer_us"]
    sides = side_figures(gathered, args.iters)
    if sides is not None:  # the request's TTFT communication: prefill collectives + transfer
        ttft = sides["prefill_comm_us"] + figures
        for i, row in enumerate(rows):
            row.update(prefill_comm_us=round(float(sides["prefill_comm_us"][i]), 3),
                       ttft_comm_us=round(float(ttft[i]), 3),
                       decode_step_us=round(float(sides["decode_step_us"][i]), 3))
        columns += ["prefill_comm_us", "ttft_comm_us", "decode_step_us"]
        ttft_median = float(np.median(ttft))
        calls = {side: max(g[5][2] for g in gathered if g[1] == side)
                 for side in ("prefill", "decode")}
        summary.update(prefill_calls=calls["prefill"], decode_calls=calls["decode"],
                       prefill_comm_us=round(float(np.median(sides["prefill_comm_us"])), 3),
                       ttft_comm_us=round(ttft_median, 3),
                       decode_step_us=round(float(np.median(sides["decode_step_us"])), 3),
                       kv_share_of_ttft=round(float(np.median(figures / ttft)), 4)
                       if ttft_median > 0 else None)
    ranks = [{"rank": g[0], "side": g[1], "host": g[2], "iteration": i,
              "time_us": round(float(v), 3)} for g in gathered for i, v in enumerate(g[3])]
    files: dict[str, Any] = {
        "meta.json": json_text(meta), "summary.json": json_text(summary),
        "iterations.csv": csv_text(rows, columns),
        "ranks.csv": csv_text(ranks, ["rank", "side", "host", "iteration", "time_us"])}
    label = args.label or (f"kvtransfer-{d.decode.model.name.split('/')[-1]}-"
                           f"{d.disagg.text().replace(',', '-').replace('=', '')}-"
                           f"{args.kv_transport}")
    folder, error = write_run_or_keep(args.out, label, files)
    from microbench.results.store import print_standin_line
    print_standin_line("replay")
    text = cpus.warning("replay", where)
    if text:
        print(text)
    print(render_table(
        ["KV transfer", "bytes", "pairs", "descriptors", "median", "p5", "p95", "GB/s",
         "#wrong"],
        [[f"{t.connector.engine} {t.connector.name} @ {t.connector.version} via "
          f"{args.kv_transport}",
          format_bytes(t.total_bytes), str(head["pairs"]), f"{head['descriptors']:,}",
          format_us(median), format_us(p5), format_us(p95),
          f"{summary['gbps']:.3f}" if summary["gbps"] else "-",
          "N/A" if wrong is None else str(wrong)]],
        right_align={"bytes", "pairs", "descriptors", "median", "p5", "p95", "GB/s",
                     "#wrong"}))
    if sides is not None:
        print()
        print(render_table(["one request (slowest rank, median)", "time"], [
            ["prefill side: its prefill step's collectives", format_us(summary["prefill_comm_us"])],
            ["KV transfer", format_us(median)],
            ["communication under TTFT (the two)", format_us(summary["ttft_comm_us"])],
            ["the transfer's share of it", f"{100 * (summary['kv_share_of_ttft'] or 0):.1f}%"],
            ["decode side: its first decode step", format_us(summary["decode_step_us"])]],
            right_align={"time"}))
    print(f"results: {folder}")
    last = {k: summary[k] for k in ("kind", "kv_transport", "kv_transfer_bytes",
                                    "kv_transfer_us", "gbps", "wrong")}
    if sides is not None:
        last.update({k: summary[k] for k in ("prefill_comm_us", "ttft_comm_us",
                                             "kv_share_of_ttft")})
    last["results_dir"] = str(folder) if folder is not None else None
    print(json.dumps(last, separators=(",", ":")), flush=True)
    if error is not None:
        from microbench.results.store import WRITE_ERROR_EXIT_STATUS, write_error_message
        sys.stderr.write(write_error_message("replay", args.out, error, folder))
        return WRITE_ERROR_EXIT_STATUS
    return 0
