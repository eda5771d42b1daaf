"""`plan`'s text: the layouts that fit, the top five with why each lost to the best, and
the layouts that do not fit in memory, with their figures."""

import csv
import io
from typing import Any

from microbench.views.textfmt import format_bytes, format_us, render_table

# --objective: the figure ranked by, its name in the table and in the top five.
OBJECTIVE_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "end to end"}
TOP = 5


def _shape(p: Any) -> str:
    s = p.shape
    return f"tp={s.tp} pp={s.pp} dp={s.dp}" + (" ep" if s.ep else "")


def layout_rows(priced: list[Any], objective: str, budgeted: bool) -> str:
    name = OBJECTIVE_NAMES[objective]
    header = ["", "tp", "pp", "dp", "ep", "prefill", "decode step", "end to end",
              "compute prefill", "compute step", f"{name} floor", "comm share", "bus volume",
              "memory/GPU",
              "KV tokens", "max conc.", "nodes"] + (["budget"] if budgeted else [])
    rows = []
    for p in priced:
        row = ["best" if p.best else "", str(p.shape.tp), str(p.shape.pp), str(p.shape.dp),
               "yes" if p.shape.ep else "no", format_us(p.prefill_us),
               format_us(p.decode_step_us), format_us(p.e2e_us),
               format_us(p.compute_prefill_us), format_us(p.compute_decode_step_us),
               format_us(p.totals()[objective]), f"{100 * p.comm_shares()[objective]:.0f}%",
               format_bytes(float(p.volume_bytes)),
               format_bytes(float(p.memory_bytes)), f"{p.kv_capacity_tokens:,}",
               f"{p.max_concurrency:.2f}x", "spans" if p.crosses_nodes else "one"]
        if budgeted:
            row.append("meets" if p.meets_budget else "over")
        rows.append(row)
    return render_table(header, rows, right_align=set(header) - {"", "ep", "nodes", "budget"})


def memory_lines(doc: dict[str, Any], priced: list[Any]) -> list[str]:
    """The memory model's settings, the best layout's overhead term by term, and why each
    layout that does not fit does not."""
    gib = float(1 << 30)
    lines = [f"memory: {doc['gpu']} {doc['gpu_memory_gib']:.2f} GiB x "
             f"{doc['gpu_memory_utilization']:g}; checkpoint {doc.get('checkpoint', '')}; "
             f"max_model_len {doc.get('max_model_len', 0):,}, KV cache "
             f"{doc.get('kv_cache_dtype', 'auto')}, max_num_seqs {doc.get('max_num_seqs', 0):,}, "
             f"max_batched_tokens {doc.get('max_batched_tokens', 0):,}"]
    best = next((p for p in priced if p.best), None)
    if best is not None and best.memory:
        terms = best.memory["overhead"]
        lines.append(f"  best's rank: weights {best.weight_bytes / gib:.2f} GiB, overhead "
                     f"{terms['total_bytes'] / gib:.2f} GiB (profile peak "
                     f"{terms['profile_peak_bytes'] / gib:.2f}, MoE workspace "
                     f"{terms['moe_workspace_bytes'] / gib:.2f}, CUDA graphs "
                     f"{terms['cuda_graph_bytes'] / gib:.2f}, communication "
                     f"{terms['communication_bytes'] / gib:.2f}, non-torch reserve "
                     f"{terms['non_torch_reserve_bytes'] / gib:.2f}), KV cache "
                     f"{best.memory['available_kv_bytes'] / gib:.2f} GiB = "
                     f"{best.kv_capacity_tokens:,} tokens, {best.max_concurrency:.2f}x "
                     "requests of max_model_len")
    for p in priced:
        if not p.fits_memory and p.memory and p.memory.get("reason"):
            lines.append(f"  {_shape(p)} does not fit: {p.memory['reason']}")
    return lines


def why_lost(p: Any, best: Any, objective: str) -> str:
    """How far `p` is behind the best on the objective's floor, split into communication
    and compute, with the reasons a deployer would act on."""
    comm = {"ttft": "prefill_us", "tpot": "decode_step_us", "e2e": "e2e_us"}[objective]
    compute = {"ttft": "compute_prefill_us", "tpot": "compute_decode_step_us",
               "e2e": "compute_e2e_us"}[objective]
    d_comm = getattr(p, comm) - getattr(best, comm)
    d_compute = getattr(p, compute) - getattr(best, compute)
    gap = p.totals()[objective] - best.totals()[objective]

    def signed(v: float) -> str:
        return ("+" if v >= 0 else "-") + format_us(abs(v))

    parts = [f"communication {signed(d_comm)}", f"compute {signed(d_compute)}"]
    reasons = []
    if best.meets_budget and not p.meets_budget:
        reasons.append("over the budget")
    if p.crosses_nodes and not best.crosses_nodes:
        reasons.append("its groups or hops cross nodes")
    return (f"{format_us(gap)} more ({', '.join(parts)})"
            + (f"; {', '.join(reasons)}" if reasons else ""))


def top_lines(priced: list[Any], objective: str) -> list[str]:
    fitting = [p for p in priced if p.fits_memory]
    if not fitting:
        return []
    best, name = fitting[0], OBJECTIVE_NAMES[objective]
    lines = [f"top {min(TOP, len(fitting))} by the {name} floor (communication + compute):",
             f"  1. {_shape(best)}: {format_us(best.totals()[objective])} (communication "
             f"{format_us(best.totals()[objective] - _compute(best, objective))}, compute "
             f"{format_us(_compute(best, objective))}: communication is "
             f"{100 * best.comm_shares()[objective]:.0f}% of it)"]
    for i, p in enumerate(fitting[1:TOP], start=2):
        lines.append(f"  {i}. {_shape(p)}: {format_us(p.totals()[objective])}, "
                     f"{why_lost(p, best, objective)}")
    return lines


def _compute(p: Any, objective: str) -> float:
    return {"ttft": p.compute_prefill_us, "tpot": p.compute_decode_step_us,
            "e2e": p.compute_e2e_us}[objective]


def plan_text(doc: dict[str, Any], priced: list[Any], scope: str) -> str:
    objective = doc["objective"]
    budgeted = doc["budget_ttft_ms"] is not None or doc["budget_tpot_ms"] is not None
    budgets = [f"{name} {doc[key]} ms" for name, key in
               (("TTFT", "budget_ttft_ms"), ("TPOT", "budget_tpot_ms")) if doc[key] is not None]
    what = (f"prompt {doc['prompt']}, decode {doc['decode']}, batch {doc['batch']}"
            if not doc.get("requests") else f"requests {doc['requests']} (prefill, decode "
            "step: p90 over requests of the figure under TTFT and per TPOT step)")
    fitting = [p for p in priced if p.fits_memory]
    unfit = [p for p in priced if not p.fits_memory]
    lines = [f"plan: {doc['model']} on {doc['gpus']} GPUs ({doc['gpus_per_node']} per node), "
             f"{what}, engine {doc['engine']}, {doc['gpu']} "
             f"({doc['gpu_memory_gib']:.2f} GiB, {doc['gpu_memory_utilization']:g} of it used)"
             + (f"; budget {', '.join(budgets)}" if budgets else ""),
             f"from sweep {doc['sweep']}" + (f", inter-node sweep {doc['sweep_inter']}"
                                              if doc["sweep_inter"] else "")
             + f"; all-reduce: {doc.get('allreduce_algo', 'library')}",
             scope, ""]
    if fitting:
        lines.append(layout_rows(fitting, objective, budgeted))
        if budgeted and not fitting[0].meets_budget:
            lines.append("no layout meets the budget; best is the lowest floor")
        lines += ["", *top_lines(priced, objective)]
    else:
        lines.append(f"no layout fits in {format_bytes(doc['memory_limit_bytes'])} a GPU: "
                     "more GPUs, a larger --gpu, a shorter --max-model-len or a smaller "
                     "batch")
    if unfit:
        lines += ["", f"do not fit in {format_bytes(doc['memory_limit_bytes'])} a GPU "
                  "(weights, the engine's overhead, one max_model_len request's and the "
                  "batch's KV cache of the fullest rank; never best):",
                  layout_rows(unfit, objective, budgeted)]
    lines += ["", *memory_lines(doc, priced)]
    if doc.get("not_loadable"):
        lines += ["", "the engine would not load (listed apart, never priced):"]
        lines += [f"  {r}" for r in doc["not_loadable"]]
    lines += [f"left out: {r}" for r in doc["refused"]]
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def csv_rows(priced: list[Any]) -> str:
    out = io.StringIO()
    rows = [{k: v for k, v in p.as_dict().items() if not isinstance(v, dict)}
            for p in priced]
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().rstrip("\n")
