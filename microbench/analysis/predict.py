"""Predict a pattern's communication time from a sweep's fits (analysis/fits.py).

A collective's predicted time is its sweep message's (nccl-tests size convention, see
busbw.py). A transfer between pipeline stages has two costs (LogP's latency and gap): its
latency, half a sendrecv iteration (each rank of the sweep's ring sends and receives one after
the other, so an iteration is two one-way trips), and its gap, a `stream` iteration (the rate
at which a stream of messages is passed on; the latency where the sweep has no stream).

What is modelled is the replay that is measured (microbench/replay/replayer.py): after a
barrier every rank issues its stage's calls back to back, with no barrier inside an inference,
and each figure is the slowest rank's (prefill: end of the prefill; decode: end minus end of
prefill; end to end). A stage is one clock (its ranks run the same calls; a collective costs
the group the fit's time). A send costs its stage the gap and its data arrives a latency after
the send began; a recv ends at the later of its own clock plus the gap and that arrival. So
the prefill, and a step whose upstream stages are still busy, cost the chain along the
pipeline, and the steady state of the decode steps runs at the busiest stage's rate.

This is the replay, not the engine: the replay has no dependency from the last stage back to
the first (the engine's step k+1 needs step k's sampled token; the pattern does not carry that
transfer), so stage 0 begins decode step k+1 while later stages are still on step k, as the
MPI and gloo replays do (their sends return once the data is handed to the library).
`token_order=True` models the engine's order instead (`plan` uses it): a decode step begins
on the first stage once the last stage has finished the previous one.

Runs of identical steps are not expanded: each is simulated for a few steps until every stage
advances by a fixed amount per step (the pipeline's transient lasts about as many steps as
there are stages), then extrapolated, so the cost does not grow with the decode length.

Two levels: given the ranks per node (consecutive ranks per node, TP innermost, then PP, then
DP: global rank = (dp_rank x pp + pp_rank) x tp + tp_rank, `patterns.groups`), a group whose
ranks lie on more than one node (tp, dp, ep, pp_broadcast), or a transfer between stages on
different nodes, uses the inter-node fits.

Not priced: a transfer's cost after a larger one. The sweep times each size in a warm stream
of its own; in a replay the first transfers after large ones run cold. Over MPICH's shared
memory on the 2-core VM (mpi4py, one host, medians of 280 inferences): after two 512 KiB
sends, the next two 16 KiB sends took 10.4 and 4.7 us against 3.1 warm; after 2 MiB ones 35.8
and 7.6; after 128 KiB ones 3.8 and 3.1; a 50 us pause or a barrier in between did not warm
them. So a decode step just after a prefill of large activations costs more than predicted,
once an inference: about 6-9 us of an MPI PP2 replay's decode with 512 KiB prefill sends,
11% of its mean decode step over 7 steps, 3% over 31 (benchmarks/predict_accuracy.py).

Data parallelism: every DP rank runs its own run list (`Pattern.replicas()`; they differ under
uneven --dp-batches) through its own stages. A collective on the `dp` or `ep` group joins
the DP ranks of one stage: it begins when the last of them reaches it (each DP rank's k-th
such call pairs with the others' k-th, as the engine's aligned steps issue them) and costs
each the group's fit from there. Without such calls the DP ranks are independent replicas,
and only the distinct ones are simulated (same run list and the same position against node
boundaries price the same). Each figure is the slowest DP rank's, as replay reports the
slowest rank's.
"""

from typing import Any

from microbench.analysis.costs import DP_GROUPS, Cost, Costs
from microbench.analysis.fits import (
    LARGE_RMS,
    Fit,
    FitTable,
    Topology,
)
from microbench.argtypes import UsageError
from patterns import Op, OpKind, Pattern, Phase
from patterns.pattern import Run

TRANSIENT_STEPS = 4  # steps simulated beyond the stage count before extrapolating


class Pipeline:
    """The clocks of some DP ranks' stages (index i x pp + stage for the i-th DP rank
    simulated), per-kind totals and the transfers in flight between stages."""

    def __init__(self, replicas: int, pp: int) -> None:
        self.pp = pp
        self.clock = [0.0] * (replicas * pp)
        self.kinds: list[dict[str, float]] = [{} for _ in self.clock]
        self.arrivals: dict[tuple[int, int], list[float]] = {}  # (from, to) -> FIFO

    def _spend(self, stage: int, cost: Cost, before: float) -> None:
        kinds = self.kinds[stage]
        kinds[cost.kind] = kinds.get(cost.kind, 0.0) + self.clock[stage] - before

    def issue(self, stage: int, cost: Cost) -> None:
        before = self.clock[stage]
        base = stage - stage % self.pp  # stage 0 of this DP rank
        if cost.kind == OpKind.SEND:
            queue = self.arrivals.setdefault((stage, base + (cost.peer_stage or 0)), [])
            queue.append(before + cost.latency_us)
            self.clock[stage] = before + cost.busy_us
        elif cost.kind == OpKind.RECV:
            queue = self.arrivals.get((base + (cost.peer_stage or 0), stage))
            if not queue:
                raise UsageError(f"stage {stage % self.pp} receives from stage "
                                 f"{cost.peer_stage} before it sends: the pattern's steps "
                                 "do not pair up")
            self.clock[stage] = max(before + cost.busy_us, queue.pop(0))
        else:
            self.clock[stage] = before + cost.busy_us
        self._spend(stage, cost, before)

    def _ready(self, stage: int, cost: Cost) -> bool:
        base = stage - stage % self.pp
        return not (cost.kind == OpKind.RECV
                    and not self.arrivals.get((base + (cost.peer_stage or 0), stage)))

    def step(self, ops: list[list[Cost]]) -> None:
        """One step of every stage, in an order that respects each transfer and each call
        that joins the DP ranks: a stage issues calls until a recv whose data is not yet
        sent, or a joining call that another DP rank has not reached, then the next stage
        takes over. A joining call begins on all its DP ranks at the latest one's clock."""
        position = [0] * len(ops)
        # Stages waiting at a joining call, per stage column: the last to arrive issues it.
        arrived, waiting = [False] * len(ops), [0] * self.pp
        replicas = len(ops) // self.pp
        while True:
            progressed = False
            for s, stage_ops in enumerate(ops):
                while position[s] < len(stage_ops):
                    cost = stage_ops[position[s]]
                    if cost.joins:
                        column = s % self.pp
                        if not arrived[s]:
                            arrived[s] = True
                            waiting[column] += 1
                        if waiting[column] < replicas:
                            break
                        members = range(column, len(ops), self.pp)
                        waiting[column] = 0
                        for m in members:
                            arrived[m] = False
                        start = max(self.clock[m] for m in members)
                        for m in members:
                            before, own = self.clock[m], ops[m][position[m]]
                            self.clock[m] = start + own.busy_us
                            self._spend(m, own, before)
                            position[m] += 1
                        progressed = True
                        continue
                    if not self._ready(s, cost):
                        break
                    self.issue(s, cost)
                    position[s] += 1
                    progressed = True
            if all(p == len(o) for p, o in zip(position, ops, strict=True)):
                return
            if not progressed:
                raise UsageError("the pattern's stages wait on each other's recvs, or its DP "
                                 "ranks issue different dp/ep calls, in a cycle")

    def snapshot(self) -> tuple[list[float], list[dict[str, float]]]:
        return list(self.clock), [dict(k) for k in self.kinds]

    def queued(self) -> dict[tuple[int, int], list[float]]:
        return {k: list(v) for k, v in self.arrivals.items() if v}

    def moved(self, clock: list[float], queued: dict[tuple[int, int], list[float]],
              ) -> float | None:
        """The one amount every clock and every pending arrival moved by since `clock` and
        `queued`, or None where they moved by different amounts."""
        shift = self.clock[0] - clock[0]
        if any(now - then != shift for now, then in zip(self.clock, clock, strict=True)):
            return None
        pending = {k: v for k, v in self.arrivals.items() if v}
        if pending.keys() != queued.keys():
            return None
        for key, times in pending.items():
            was = queued[key]
            if len(times) != len(was) or any(a - b != shift for a, b in zip(times, was,
                                                                              strict=True)):
                return None
        return shift


def _runs_by_step(lists: list[tuple[Run, ...]]) -> list[tuple[Phase, int, list[list[Op]]]]:
    """Run lists aligned (one per DP rank and stage): (phase, repeat, ops of each) for each
    stretch of steps over which none changes what it issues."""
    totals = {sum(run.repeat for run in runs) for runs in lists}
    if len(totals) > 1:
        raise UsageError(f"the pattern's stages or DP ranks run {sorted(totals)} steps: "
                         "every one must run the same steps to be simulated together")
    bounds: set[int] = set()
    for runs in lists:
        at = 0
        for run in runs:
            at += run.repeat
            bounds.add(at)
    out: list[tuple[Phase, int, list[list[Op]]]] = []
    cursors = [(0, 0) for _ in lists]  # (run index, steps used of it)
    at = 0
    for end in sorted(bounds):
        ops, phase = [], Phase.PREFILL
        for s, runs in enumerate(lists):
            i, used = cursors[s]
            run = runs[i]
            phase = run.phase
            ops.append(list(run.step.ops))
            used += end - at
            cursors[s] = (i + 1, 0) if used == run.repeat else (i, used)
        out.append((phase, end - at, ops))
        at = end
    return out


def _units(pattern: Pattern, topology: Topology) -> list[list[int]]:
    """The DP ranks to simulate, in groups simulated together: one DP rank per distinct
    replica, that is per run list and per offset of the replica's first rank within its
    node (its tp and pp groups then sit alike against node boundaries, so they cost alike).
    Replicas alike in both run alike, joins included (a join waits for the latest, the same
    for each of them), so one stands for all. When a call joins the DP ranks (a dp or ep
    call) the representatives are simulated together; else each on its own."""
    layout = pattern.layout
    replicas = pattern.dp_stages or (pattern.stages,)
    rpn, size = topology.ranks_per_node, layout.tp * layout.pp
    seen: dict[tuple[int, int], int] = {}
    # Equal replicas (no dp_stages) differ only by their node offset, which repeats every
    # rpn DP ranks: that many stand for a million replicas. A replica is told by its object
    # (hashing its runs hashed every call of every step, once a DP rank).
    for d in range(layout.dp if pattern.dp_stages else min(layout.dp, max(rpn or 0, 1))):
        seen.setdefault((id(replicas[d % len(replicas)]), d * size % rpn if rpn else 0), d)
    distinct = {id(r): r for r in replicas}.values()  # equal replicas are often one object
    if layout.dp > 1 and any(op.group in DP_GROUPS for replica in distinct
                             for runs in replica for run in runs for op in run.step.ops):
        return [list(seen.values())]
    return [[d] for d in seen.values()]


def _simulate_unit(pattern: Pattern, costs: Costs, dp_ranks: list[int], token_order: bool,
                   ) -> tuple[list[float], list[float], list[float], list[dict[str, float]]]:
    pp = pattern.layout.pp
    lists = [pattern.runs(s, d) for d in dp_ranks for s in range(pp)]
    pipe = Pipeline(len(dp_ranks), pp)
    prefill_end: list[float] | None = None
    real_end: list[float] | None = None  # where vLLM's DP wave tail begins
    real_kinds: list[dict[str, float]] | None = None
    settle = pp + TRANSIENT_STEPS
    for phase, repeat, ops in _runs_by_step(lists):
        if phase != Phase.PREFILL and prefill_end is None:
            prefill_end = list(pipe.clock)
        if phase == Phase.WAVE_TAIL and real_end is None:
            real_end, real_kinds = pipe.snapshot()
        step_costs = [[costs.of(dp_ranks[v // pp], v % pp, op) for op in stage_ops]
                      for v, stage_ops in enumerate(ops)]
        simulated = min(repeat, settle)
        before = pipe.snapshot()
        done, shift = 0, None
        for _ in range(simulated):
            before = pipe.snapshot()
            queued = pipe.queued()
            if token_order and phase == Phase.DECODE:
                for first in range(0, len(pipe.clock), pp):
                    pipe.clock[first] = max(pipe.clock[first], pipe.clock[first + pp - 1])
            pipe.step(step_costs)
            done += 1
            # Steady once a step moved every clock and every pending arrival by one amount
            # the step before moved them by: each later step repeats it exactly (a deep
            # pipeline's decode chain settles in two steps, not pp + 4).
            moved = pipe.moved(before[0], queued)
            if moved is not None and moved == shift:
                break
            shift = moved
        left = repeat - done
        if left:  # steady state: every stage advances as much each step as in the last
            clock, kinds = pipe.snapshot()
            for s in range(len(clock)):
                pipe.clock[s] += left * (clock[s] - before[0][s])
                for k, v in kinds[s].items():
                    pipe.kinds[s][k] = v + left * (v - before[1][s].get(k, 0.0))
    if prefill_end is None:
        prefill_end = list(pipe.clock)
    # per-kind times are the inference's own steps', without the wave's tail
    return prefill_end, real_end or list(pipe.clock), list(pipe.clock), real_kinds or pipe.kinds


def simulate(pattern: Pattern, topology: Topology, token_order: bool = False,
             ) -> tuple[list[float], list[float], list[float], list[dict[str, float]]]:
    """(each simulated stage's clock at the end of the prefill, at the end of the
    inference's own steps (the start of vLLM's DP wave tail, Phase.WAVE_TAIL, or the end),
    at the end, per-kind time of the inference's own steps), over every distinct DP rank's
    stages.

    token_order: the engine's order, where a decode step begins on the first stage only once
    the last stage has sampled the previous step's token (the transfer of that token is not
    in the pattern and costs nothing here); without it, the replay's order."""
    costs = Costs(pattern, topology)
    prefill_end: list[float] = []
    real_end: list[float] = []
    end: list[float] = []
    kinds: list[dict[str, float]] = []
    for unit in _units(pattern, topology):
        p, r, e, k = _simulate_unit(pattern, costs, unit, token_order)
        prefill_end += p
        real_end += r
        end += e
        kinds += k
    return prefill_end, real_end, end, kinds


def predict_pattern(pattern: Pattern, fits: FitTable | Topology, token_order: bool = False,
                    ) -> tuple[dict[str, float], list[str]]:
    """Predicted prefill, decode step, end to end and per op kind, each the slowest stage's
    of the slowest DP rank, as replay reports the slowest rank's (where vLLM's DP ranks
    run a wave's tail after the inference, `wave_tail_us` apart), and notes on
    extrapolation, bad fits and calls priced by proxy.
    token_order: decode steps in the engine's order (`simulate`), not the replay's."""
    topology = fits if isinstance(fits, Topology) else Topology(fits)
    steps = pattern.workload.decode_steps
    prefill_end, real_end, end, kinds = simulate(pattern, topology, token_order)
    out: dict[str, float] = {
        "prefill_us": max(prefill_end),
        "decode_us": max(e - p for e, p in zip(real_end, prefill_end, strict=True)),
        "e2e_us": max(real_end)}  # the inference's end, as its requests see it
    if any(run.phase == Phase.WAVE_TAIL for run in pattern.stages[0]):
        # vLLM's DP wave: the lockstep's dummy forwards after the inference, apart
        out["wave_tail_us"] = max(e - r for e, r in zip(end, real_end, strict=True))
    for k in sorted({k for stage in kinds for k in stage}):
        out[f"{k}_us"] = max(stage.get(k, 0.0) for stage in kinds)
    out["decode_step_us"] = out["decode_us"] / steps if steps else 0.0
    notes: set[str] = set()
    outside: dict[int, tuple[Fit, list[int]]] = {}
    for (_, size, _), fit in topology.fits_seen.items():
        if not fit.min_bytes <= size <= fit.max_bytes:
            outside.setdefault(id(fit), (fit, []))[1].append(size)
    for fit, sizes in outside.values():
        notes.add(f"{fit.op} over {fit.group_size} ranks: {len(sizes)} size(s) from "
                  f"{min(sizes)} to {max(sizes)} B outside the swept {fit.min_bytes}-"
                  f"{fit.max_bytes} B: extrapolated")
    notes |= topology.notes
    for fit in {id(f): f for f in topology.fits_seen.values()}.values():
        if fit.scaled_from is not None:
            notes.add(f"{fit.op} over {fit.group_size} ranks: scaled from the sweep's "
                      f"{fit.scaled_from} ranks ({fit.group_size - 1} ring steps where it "
                      f"had {fit.scaled_from - 1}, same bus bandwidth); sweep "
                      f"{fit.group_size} ranks to measure it")
        if fit.rms_rel_error > LARGE_RMS:
            notes.add(f"the {fit.op} fit over {fit.group_size} ranks is off by "
                      f"{100 * fit.rms_rel_error:.0f}% on average: its prediction is rough")
    headline = ("prefill_us", "decode_step_us", "e2e_us", *(
        ("wave_tail_us",) if "wave_tail_us" in out else ()))
    ordered = [*headline, *sorted(k for k in out if k not in (*headline, "decode_us"))]
    if not steps:
        ordered.remove("decode_step_us")
    return {k: out[k] for k in ordered}, sorted(notes)


def caveats(sweep_meta: dict[str, Any], pattern: Pattern,
            replay_meta: dict[str, Any] | None) -> list[str]:
    """What makes a sweep a poor witness for a prediction: another backend, transport,
    device or world than the replay's, a sweep or replay with more ranks than its host's
    CPUs (microbench/ranks/cpus.py), or (without a replay) fewer ranks than the pattern."""
    out = []
    if replay_meta is not None:
        for key in ("backend", "transport", "device", "world_size"):
            a, b = sweep_meta.get(key), replay_meta.get(key)
            if a is not None and b is not None and a != b:
                out.append(f"the sweep ran with {key} {a} and the replay with {b}: the "
                           "prediction prices another setup than the one measured")
    for name, meta in (("sweep", sweep_meta), ("replay", replay_meta or {})):
        if meta.get("oversubscribed"):
            out.append(f"the {name} ran {meta.get('ranks_on_host')} ranks on "
                       f"{meta.get('host_cpus')} CPUs: its times include waits for a CPU, "
                       "which no fit prices")
    world = sweep_meta.get("world_size")
    if world is not None and replay_meta is None and world != pattern.layout.world_size:
        out.append(f"the sweep ran on {world} ranks and the pattern has "
                   f"{pattern.layout.world_size}: contention between its groups is not "
                   "in the fits")
    return out


# Calls that reduce: their cost per byte depends on the element type (an MPI library sums
# fp32 with its built-in op and bf16 with a user-defined one; NCCL's kernels differ too).
REDUCING = frozenset({OpKind.ALLREDUCE, OpKind.REDUCESCATTER})


def dtype_caveats(sweep_rows: list[dict[str, Any]], pattern: Pattern) -> list[str]:
    """A reduction of the pattern in a dtype the sweep never measured for that op: its fit,
    made of other dtypes' times, prices another reduction than the one the pattern issues.
    Calls that only move bytes (gathers, sends) cost the same whatever their dtype."""
    swept: dict[str, set[str]] = {}
    for row in sweep_rows:
        swept.setdefault(str(row.get("op")), set()).add(str(row.get("dtype")))
    used: dict[str, set[str]] = {}
    for replica in pattern.replicas():
        for runs in replica:
            for run in runs:
                for op in run.step.ops:
                    if op.kind in REDUCING:
                        used.setdefault(op.kind.value, set()).add(op.dtype)
    out = []
    for kind, dtypes in sorted(used.items()):
        have = swept.get(kind)
        missing = sorted(dtypes - have) if have else []
        if missing:
            out.append(f"the pattern's {kind} calls are {', '.join(missing)} and the sweep "
                       f"measured {kind} in {', '.join(sorted(have))} only: a reduction's "
                       "time depends on its dtype, so these calls are priced from another "
                       f"dtype's times (sweep with --dtype {missing[0]})")
    return out
