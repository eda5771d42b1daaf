"""The replay's table for people."""

from typing import Any

from microbench.views.textfmt import format_us, render_table


def _us(value: float | None) -> str:
    return format_us(value) if value is not None else "-"


def engine_transport_line(by_transport: dict[str, int], backend: str, carrier: str) -> str:
    """How the engine would carry the calls, against how this replay carries them."""
    total = sum(by_transport.values())
    parts = [f"{calls:,} of these {total:,} calls through {transport}" if i == 0 else
             f"{calls:,} through {transport}"
             for i, (transport, calls) in enumerate(by_transport.items())]
    return (f"the engine would send {', '.join(parts)}; replayed here over "
            f"{_BACKEND_NAMES.get(backend, backend)} ({carrier})")


_BACKEND_NAMES = {"mpi": "MPI", "torch": "torch.distributed", "nccl": "NCCL"}


def replay_table(summary: dict[str, Any], title: str) -> str:
    s = summary
    lines = [
        title,
        *([engine_transport_line(s["engine_transports"], s["backend"], s["transport"])]
          if s.get("engine_transports") else []),
        f"backend {s['backend']} ({s['transport']}) on {s['device']}, {s['world_size']} ranks "
        f"on {len(set(s['hosts']))} host(s); {s['iterations']} timed inferences after "
        f"{s['warmup']} warm-up; timing per {s['timing']}; all-reduce: "
        f"{s.get('allreduce_algo', 'library')}; figures are the slowest rank's",
        "",
    ]
    rows = [
        ["prefill (TTFT share)", _us(s["prefill_us"]), f"{s['prefill_steps']} step(s)"],
        ["decode step (TPOT share)", _us(s["decode_step_us"]),
         "decode / steps, median over inferences"],
        ["decode step p99", _us(s["decode_step_p99_us"]),
         "" if s["decode_step_p99_us"] is not None else "needs --timing step or op"],
        ["decode, all steps", _us(s["decode_us"]), f"{s['decode_steps']} steps"],
        ["end to end", _us(s["e2e_us"]),
         f"p5 {_us(s['e2e_p5_us'])}, p95 {_us(s['e2e_p95_us'])}"],
    ]
    if s.get("wave_tail_steps"):  # vLLM's DP lockstep after the inference, timed apart
        rows.append(["wave tail (DP lockstep)", _us(s["wave_tail_us"]),
                     f"{s['wave_tail_steps']} dummy forwards after the inference, to the "
                     "wave's sync"])
    lines.append(render_table(["communication of one inference", "median", "note"], rows,
                              right_align={"median"}))
    lines.append("(each row is its own median over inferences of the slowest rank, so prefill "
                 "and decode need not add up to end to end)")
    if s.get("by_op"):
        # Each kind's time is its slowest rank's, so the kinds need not add up to the total.
        op_rows = [[kind, f"{v['calls']:,}", _us(v["time_us"])]
                   for kind, v in s["by_op"].items()]
        lines += ["", render_table(["op", "calls/inference", "time/inference (slowest rank)"],
                                   op_rows, right_align={"calls/inference",
                                                         "time/inference (slowest rank)"})]
    checked = ("not checked (add --check)" if s["wrong"] is None
               else f"{s['wrong']} wrong element{'' if s['wrong'] == 1 else 's'}"
               + (" (CHECK FAILED)" if s["wrong"] else ""))
    lines += ["", f"calls per inference (busiest rank): {s['calls_per_inference']:,}; "
                  f"data: {checked}",
              f"results: {s['results_dir']}"]
    return "\n".join(lines)
