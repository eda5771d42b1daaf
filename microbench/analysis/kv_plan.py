"""`plan --disagg`: disaggregated layouts of N GPUs priced beside the colocated ones.

A candidate is a prefill side (tp a, dp replicas) and a decode side (tp b, dp replicas) of
N ranks together, prefill ranks first; `--disagg auto` tries every split whose prefill side
fills whole nodes (P a multiple of --gpus-per-node, 0 < P < N) and every tp of each side the
model and the connector accept; `--disagg prefill=...,decode=...` prices that one. For one
request path (replica 0 of each side):

- prefill_us: the prefill side's collectives in its prefill step (predict, as `plan`);
- transfer_us: the KV transfer of the batch's requests. A pair of K' descriptors of S' bytes
  costs K'/K x t(S') a request, t the fit of a `sweep --op kvtransfer` of K descriptors
  (intra- or inter-node by where the two ranks sit, G ranks a node); a rank's pairs share
  its link and add up; the slowest rank sets the time. Without an inter-node KV sweep, a
  crossing pair is priced by the inter-node `stream` fit, a message a descriptor (noted);
- decode_step_us: the decode side's decode step (predict), placed from a node boundary;
- TTFT's communication is prefill_us + transfer_us; end to end adds (Sd - 1) decode steps.
Replicas (dp) change throughput, which is not priced; memory: the decode side holds the
batch's whole sequences, the prefill side its prompts (patterns/weights.py).
"""

import argparse
import math
from dataclasses import dataclass, replace
from typing import Any

from microbench.analysis.fits import Fit, Topology, fit_levels
from microbench.argtypes import UsageError
from microbench.views.textfmt import format_bytes, format_us, render_table
from patterns import ConfigError, Layout, ModelConfig, Workload
from patterns.disagg import DisaggPattern, KVTransfer, generate_disagg, parse_disagg
from patterns.disagg.layouts import DisaggLayout, connector_of, side_text
from patterns.weights import gpu_memory_bytes

# What a colocated pattern is made with: none of the disaggregated options.
COLOCATED = {"disagg": None, "connector": None, "connector_version": None,
             "kv_cache_dtype": "auto", "kv_block_size": None}
KV_OP = "kvtransfer"


def add_plan_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--kv-sweep", default=None, metavar="SWEEP_RUN",
                       help="with --disagg: a `sweep --op kvtransfer` within a node (default: "
                            "the kvtransfer rows of --sweep)")
    group.add_argument("--kv-sweep-inter", default=None, metavar="SWEEP_RUN",
                       help="with --disagg: a `sweep --op kvtransfer` across nodes (default: "
                            "the inter-node stream fit, a message a descriptor)")


@dataclass(frozen=True)
class KVFits:
    intra: Fit
    inter: Fit | None
    descriptors: int  # K of the sweep's transfers
    stream_inter: Fit | None  # the stand-in for crossing pairs without an inter KV sweep


@dataclass(frozen=True)
class DisaggPriced:
    disagg: DisaggLayout
    connector: str
    connector_version: str
    prefill_us: float
    transfer_us: float
    decode_step_us: float
    e2e_us: float
    kv_transfer_bytes: int  # the batch's, every pair
    meets_budget: bool
    crosses_nodes: bool
    memory_bytes: int  # the fullest decode rank's weights and KV cache
    splits: int = 1  # node-boundary splits of --gpus with these sides' tp (`candidates`)
    best: bool = False

    @property
    def ttft_us(self) -> float:
        return self.prefill_us + self.transfer_us

    def as_dict(self) -> dict[str, Any]:
        return {"disagg": self.disagg.text(), "connector": self.connector,
                "connector_version": self.connector_version,
                "prefill_tp": self.disagg.prefill.tp, "prefill_dp": self.disagg.prefill.dp,
                "decode_tp": self.disagg.decode.tp, "decode_dp": self.disagg.decode.dp,
                "prefill_us": round(self.prefill_us, 3),
                "kv_transfer_us": round(self.transfer_us, 3),
                "ttft_comm_us": round(self.ttft_us, 3),
                "decode_step_us": round(self.decode_step_us, 3),
                "e2e_us": round(self.e2e_us, 3), "kv_transfer_bytes": self.kv_transfer_bytes,
                "meets_budget": self.meets_budget, "crosses_nodes": self.crosses_nodes,
                "decode_memory_bytes_per_gpu": self.memory_bytes, "splits": self.splits,
                "best": self.best}


def kv_fits(args: argparse.Namespace, sweep_rows: list[dict[str, Any]],
            inter_rows: list[dict[str, Any]] | None) -> KVFits:
    from microbench.results.runs import load_sweep, sweep_table

    rows = (sweep_table(load_sweep("--kv-sweep", args.kv_sweep)) if args.kv_sweep
            else sweep_rows)
    kv = [r for r in rows if r["op"] == KV_OP]
    if not kv:
        raise UsageError("plan --disagg prices the KV transfer from a transfer sweep; run "
                         "`infercomm sweep --op kvtransfer` and pass it as --kv-sweep")
    levels = fit_levels(kv)
    if "intra" not in levels:
        raise UsageError("--kv-sweep has no rows within one node; pass a one-node "
                         "kvtransfer sweep as --kv-sweep and the other as --kv-sweep-inter")
    inter = levels.get("inter", {}).get((KV_OP, 2))
    if args.kv_sweep_inter:
        other = fit_levels([r for r in sweep_table(load_sweep(
            "--kv-sweep-inter", args.kv_sweep_inter)) if r["op"] == KV_OP])
        inter = (other.get("inter") or other.get("intra") or {}).get((KV_OP, 2))
    stream = None
    if inter is None and inter_rows is not None:
        levels_inter = fit_levels([r for r in inter_rows if r["op"] == "stream"])
        stream = (levels_inter.get("inter") or levels_inter.get("intra") or {}).get(
            ("stream", 2))
    return KVFits(levels["intra"][(KV_OP, 2)], inter, int(kv[0]["count"]), stream)


def transfer_us(t: KVTransfer, offset: int, per_node: int, fits: KVFits, batch: int,
                notes: set[str]) -> tuple[float, bool]:
    """(the batch's transfer time, whether a pair crosses nodes)."""
    busy: dict[int, float] = {}
    crosses = False
    for pair in (p for p in t.pairs if not p.dummy):
        src, dst = pair.prefill, offset + pair.decode
        across = src // per_node != dst // per_node
        crosses |= across
        cost = 0.0
        for k, size in t.descriptor_groups(pair):
            if not across:
                cost += fits.intra.time_us(size) * k / fits.descriptors
            elif fits.inter is not None:
                cost += fits.inter.time_us(size) * k / fits.descriptors
            elif fits.stream_inter is not None:
                notes.add("KV pairs across nodes priced by the inter-node stream fit, a "
                          "message a descriptor: pass --kv-sweep-inter (sweep --op kvtransfer "
                          "across two nodes) for the transfer's own figures")
                cost += fits.stream_inter.time_us(size) * k
            else:
                raise UsageError("a KV pair crosses nodes and no inter-node fit was given; "
                                 "pass --kv-sweep-inter or --sweep-inter")
        for rank in (src, dst):
            busy[rank] = busy.get(rank, 0.0) + cost * batch
    return max(busy.values(), default=0.0), crosses


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def split_for(gpus: int, per_node: int, a: int, b: int) -> tuple[int, int] | None:
    """(P, count): of the prefill worlds P that end on a node boundary and that tp a and
    tp b can fill (P a multiple of per_node and of a, gpus - P > 0 a multiple of b), the one
    nearest an even split, and how many there are; None when there is none. Solved, not
    enumerated: P = k x L with L = lcm(per_node, a), and k x L = gpus (mod b) is a linear
    congruence, k = k0 (mod b / gcd(L, b)), solvable only where gcd(L, b) divides gpus."""
    step = math.lcm(per_node, a)
    most = (gpus - 1) // step  # the largest k with k x L < gpus
    g = math.gcd(step, b)
    if gpus % g:
        return None
    m = b // g
    k0 = (gpus // g) * pow(step // g, -1, m) % m if m > 1 else 0
    first = k0 if k0 >= 1 else k0 + m
    if first > most:
        return None
    count = (most - first) // m + 1
    t = min(max(round((gpus / (2 * step) - first) / m), 0), count - 1)
    return (first + t * m) * step, count


def candidates(args: argparse.Namespace, gpus: int, per_node: int,
               heads: int) -> list[tuple[DisaggLayout, int]]:
    """`--disagg auto`: each tp a divisor of the attention heads (no engine takes another)
    on each side, at a split on a node boundary (dp fills each side), with the number of
    splits it stands for. A side's figures (its collectives from replica 0, placed from a
    node boundary; the KV pairs between two sides on different nodes) do not depend on
    which split it is, so each (prefill tp, decode tp) is priced once, at the split nearest
    an even one (`split_for`): at most (divisors of the heads)^2 candidates, however many
    GPUs. `--disagg prefill=...,decode=...`: that one, which must use --gpus exactly."""
    if args.disagg != "auto":
        d = parse_disagg(args.disagg)
        if d.world_size > gpus:
            raise UsageError(f"--disagg {d.text()} has {d.world_size} ranks and --gpus is "
                             f"{gpus}: {d.world_size - gpus} too many; lower a side's dp or "
                             f"tp, or give --gpus {d.world_size}")
        if d.world_size < gpus:
            raise UsageError(f"--disagg {d.text()} has {d.world_size} ranks and --gpus is "
                             f"{gpus}: add dpN to a side to use the other "
                             f"{gpus - d.world_size}, or give --gpus {d.world_size}")
        return [(d, 1)]
    out = []
    for a in _divisors(heads):
        for b in _divisors(heads):
            found = split_for(gpus, per_node, a, b)
            if found is not None:
                prefill_world, count = found
                out.append((DisaggLayout(Layout(tp=a, dp=prefill_world // a),
                                         Layout(tp=b, dp=(gpus - prefill_world) // b)), count))
    if not out:
        raise UsageError(f"--disagg auto splits {gpus} GPUs at node boundaries of "
                         f"{per_node}: give more than one node's GPUs, or a --disagg layout")
    return out


def plan_disagg(args: argparse.Namespace, model: ModelConfig, topology: Topology,
                budget: Any, memory_limit: int | None, sweep_rows: list[dict[str, Any]],
                inter_rows: list[dict[str, Any]] | None,
                ) -> tuple[list[DisaggPriced], list[str], list[str]]:
    """Every candidate priced (best first), the refused with why, and notes."""
    from microbench.analysis.predict import predict_pattern
    from microbench.options.disagg_args import engine_options

    # the connector and its version once: a wrong one left every candidate out, exit 0
    connector_of(args.engine, args.connector, args.connector_version)
    fits = kv_fits(args, sweep_rows, inter_rows)
    workload = Workload(prompt=args.prompt, decode=args.decode, batch=args.batch,
                        dtype=args.dtype)
    priced, refused, notes = [], [], set()
    for cand, splits in candidates(args, args.gpus, args.gpus_per_node,
                                   model.num_attention_heads):
        label = cand.text()
        try:
            d: DisaggPattern = generate_disagg(args.engine, model, cand, workload,
                                               engine_options(args), args.connector,
                                               args.kv_cache_dtype, args.kv_block_size,
                                               check_memory=False,
                                               connector_version=args.connector_version)
        except ConfigError as err:
            refused.append(f"{label}: {err}")
            continue
        dtype = workload.dtype or model.default_dtype
        prefill_memory = sum(gpu_memory_bytes(model, cand.prefill, dtype,
                                              args.batch * args.prompt))
        decode_memory = sum(d.decode_memory)
        if memory_limit is not None and max(prefill_memory, decode_memory) > memory_limit:
            refused.append(f"{label}: a {'decode' if decode_memory > memory_limit else 'prefill'}"
                           f" GPU needs {format_bytes(max(prefill_memory, decode_memory))} "
                           f"(weights and KV cache), more than the "
                           f"{format_bytes(memory_limit)} allowed")
            continue
        try:
            topology.reset()
            prefill = predict_pattern(d.prefill, topology, token_order=True)[0]["prefill_us"]
            topology.reset()
            step = predict_pattern(d.decode, topology, token_order=True)[0].get(
                "decode_step_us", 0.0)
            moved, crosses = transfer_us(d.transfer, cand.decode_offset, args.gpus_per_node,
                                         fits, args.batch, notes)
        except UsageError as err:
            refused.append(f"{label}: not priced: {err}")
            continue
        crosses |= "inter" in topology.used
        e2e = prefill + moved + (args.decode - 1) * step
        chosen = d.transfer.connector
        priced.append(DisaggPriced(cand, chosen.name, chosen.version, prefill, moved, step, e2e,
                                   d.transfer.total_bytes * args.batch,
                                   budget.met(prefill + moved, step), crosses, decode_memory,
                                   splits))
    priced.sort(key=lambda p: (not p.meets_budget, p.e2e_us, p.kv_transfer_bytes))
    if priced:
        priced[0] = replace(priced[0], best=True)
    return priced, refused, sorted(notes)


def disagg_table(priced: list[DisaggPriced], budgeted: bool) -> str:
    header = ["", "prefill", "decode", "prefill comm", "KV transfer", "TTFT comm",
              "decode step", "end to end", "KV bytes", "memory/GPU", "nodes"] + (
                  ["budget"] if budgeted else [])
    rows = []
    for p in priced:
        row = ["best" if p.best else "", side_text(p.disagg.prefill),
               side_text(p.disagg.decode), format_us(p.prefill_us), format_us(p.transfer_us),
               format_us(p.ttft_us), format_us(p.decode_step_us), format_us(p.e2e_us),
               format_bytes(p.kv_transfer_bytes), format_bytes(p.memory_bytes),
               "spans" if p.crosses_nodes else "one"]
        if budgeted:
            row.append("meets" if p.meets_budget else "over")
        rows.append(row)
    return render_table(header, rows, right_align=set(header) - {"", "prefill", "decode",
                                                                  "nodes", "budget"})


def best_overall(colocated: list[Any], priced: list[DisaggPriced]) -> str | None:
    """Communication end to end against communication end to end: the colocated layouts are
    ranked by their floor (communication + compute), so the first of them is not the one to
    take; those that do not fit in memory are never it."""
    options = [(not c.meets_budget, c.e2e_us, f"colocated tp={c.shape.tp} pp={c.shape.pp} "
                f"dp={c.shape.dp}" + (" ep" if c.shape.ep else ""))
               for c in colocated if getattr(c, "fits_memory", True)]
    options += [(not p.meets_budget, p.e2e_us, f"disaggregated {p.disagg.text()}")
                for p in priced[:1]]
    return min(options)[2] if options else None


def add_disagg_plan(doc: dict[str, Any], args: argparse.Namespace, model: ModelConfig,
                    topology: Topology, budget: Any, colocated: list[Any],
                    memory_limit: int | None, sweep_rows: list[dict[str, Any]],
                    inter_rows: list[dict[str, Any]] | None) -> str:
    """Adds `disagg_layouts`, `disagg_refused`, `disagg_notes`, `best_overall` to plan's
    document; returns the same as text, for the table output."""
    priced, refused, notes = plan_disagg(args, model, topology, budget, memory_limit,
                                         sweep_rows, inter_rows)
    doc["disagg_layouts"] = [p.as_dict() for p in priced]
    doc["disagg_refused"] = refused
    doc["disagg_notes"] = notes
    doc["best_overall"] = best_overall(colocated, priced)
    budgeted = doc["budget_ttft_ms"] is not None or doc["budget_tpot_ms"] is not None
    connector = (f"{priced[0].connector} @ {priced[0].connector_version}" if priced else
                 args.connector or "")
    lines = ["", "", f"disaggregated candidates ({args.engine} {connector}, KV transfer of the "
             "batch inside TTFT; one request path, replica 0 of each side):"]
    if priced:
        lines.append(disagg_table(priced, budgeted))
        alike = sum(p.splits for p in priced) - len(priced)
        if alike:
            lines.append(f"note: {alike:,} other splits at node boundaries have the same "
                         "sides' tp and price the same (one request path); each is shown at "
                         "the split nearest an even one (JSON: splits)")
    lines += [f"left out: {r}" for r in refused]
    lines += [f"note: {n}" for n in notes]
    if doc["best_overall"]:
        lines.append(f"best overall by end to end: {doc['best_overall']}")
    return "\n".join(lines)
