"""A trace folded into the project's `Pattern`, so `replay` can issue it: every rank of a
pipeline stage must have issued the same calls, and the groups must be a TP x PP layout
(collectives over the TP group of consecutive ranks, send/recv between stages)."""

from collections import Counter

from patterns.dtypes import DTYPE_BYTES
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import P2P_KINDS, Op, OpKind, Phase, Step
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.traces.calls import Call, RankCalls, Trace
from patterns.traces.steps import fold, split_steps

REPLAYABLE = {kind.value for kind in OpKind}


def _unsized(call: Call) -> tuple[object, ...]:
    return (call.op, call.numel, call.dtype, call.group_size, call.peer, call.root)


def trace_layout(trace: Trace) -> Layout:
    """TP from the collectives' group size, PP = ranks / TP; refuse what cannot be one."""
    world = len(trace.ranks)
    if [r.rank for r in trace.ranks] != list(range(world)):
        raise ConfigError(f"the trace holds ranks {[r.rank for r in trace.ranks]}, not 0..N-1: "
                          "replay needs every rank's calls (one Kineto file per rank, or the "
                          "logs of every process)")
    sizes: Counter = Counter()
    p2p = False
    used = sorted({i for rank in trace.ranks for i in set(rank.ids)})
    for call in (trace.table[i] for i in used):
        if call.op in ("send", "recv"):
            p2p = True
        elif call.group_size is not None:
            sizes[call.group_size] += 1
    if len(sizes) > 1:
        raise ConfigError(f"the trace's collectives run over groups of {sorted(sizes)} ranks; "
                          "replay reproduces one TP group size (a TP x PP layout)")
    if sizes:
        tp = next(iter(sizes))
    elif not p2p:
        tp = world
    else:
        raise ConfigError("the trace does not record its collectives' group size (c10d events "
                          "on gloo) and has send/recv: the TP x PP layout cannot be told; "
                          "capture with NCCL (record_param_comms) or an NCCL log")
    if tp < 1 or world % tp:
        raise ConfigError(f"the trace's {world} ranks are not a multiple of its collectives' "
                          f"group size {tp}; replay needs a TP x PP layout")
    if tp == world and p2p:
        raise ConfigError("the trace's send/recv run inside the one group of all ranks; "
                          "replay reproduces send/recv between pipeline stages only")
    return Layout(tp=tp, pp=world // tp)


def _op(call: Call, layout: Layout) -> Op:
    if call.op not in REPLAYABLE:
        raise ConfigError(f"the trace holds {call.op} calls, which replay does not issue; "
                          f"it issues {', '.join(sorted(REPLAYABLE))}")
    if call.dtype not in DTYPE_BYTES:
        raise ConfigError(f"the trace holds {call.op} calls of dtype {call.dtype}, which replay "
                          f"does not issue; it issues {', '.join(DTYPE_BYTES)}")
    kind = OpKind(call.op)
    if call.dtype == "bool" and kind in (OpKind.ALLREDUCE, OpKind.REDUCESCATTER):
        raise ConfigError(f"the trace holds {call.op} calls of bool, which replay does not "
                          "issue (NCCL has no bool: torch sums it as uint8); it gathers, "
                          "broadcasts and sends bool")
    n = call.numel
    if kind in P2P_KINDS:
        if call.peer is None:
            raise ConfigError(f"a {call.op} of the trace has no peer recorded; replay needs it")
        return Op(kind=kind, group="pp", group_size=layout.pp, shape=(n,), out_shape=(n,),
                  dtype=call.dtype, tag=f"trace.{call.op}", peer=call.peer)
    tp = layout.tp
    out = {OpKind.ALLGATHER: n * tp, OpKind.GATHER: n * tp,
           OpKind.REDUCESCATTER: n // tp}.get(kind, n)
    if kind == OpKind.REDUCESCATTER and n % tp:
        raise ConfigError(f"a reducescatter of {n} elements does not split over {tp} ranks")
    root = call.root if call.root is not None else (
        0 if kind in (OpKind.GATHER, OpKind.BROADCAST) else None)
    return Op(kind=kind, group="tp", group_size=tp, shape=(n,), out_shape=(out,),
              dtype=call.dtype, tag=f"trace.{call.op}", root=root)


def _check_stage(trace: Trace, ranks: list[RankCalls], stage: int) -> None:
    first = [_unsized(trace.table[i]) for i in ranks[0].ids]
    for other in ranks[1:]:
        calls = [_unsized(trace.table[i]) for i in other.ids]
        if calls != first:
            pairs = zip(first, calls, strict=False)
            index = next((i for i, (a, b) in enumerate(pairs) if a != b),
                         min(len(first), len(calls)))
            raise ConfigError(f"ranks {ranks[0].rank} and {other.rank} of stage {stage} issued "
                              f"different calls (from call {index} on); replay needs every "
                              "rank of a stage to issue the same calls")


def _fold_run(calls: list[Call], i: int) -> tuple[Call, int] | None:
    """The gather or all-to-all that grouped Send/Recv from `calls[i]` on make, and how many
    calls it took; None when they are plain point-to-point calls."""
    first = calls[i]
    n = first.group_size or 0
    same = [c for c in calls[i:i + 2 * n]
            if c.group == first.group and (c.numel, c.dtype) == (first.numel, first.dtype)]
    # all-to-all: Send r, Recv r for every r of the group, self included
    pairs = [(c.op, c.peer) for c in same[:2 * n]]
    if n > 1 and len(pairs) == 2 * n and pairs == [(op, r) for r in range(n)
                                                    for op in ("send", "recv")]:
        return Call("alltoall", first.numel * n, first.dtype, n, first.group), 2 * n
    if first.op == "send":  # a gather's non-root: one Send to the root
        return Call("gather", first.numel, first.dtype, n, first.group, root=first.peer), 1
    run = []
    for c in same:
        if c.op != "recv":
            break
        run.append(c.peer)
    if len(run) >= n - 1 and n > 1:
        run = run[:n - 1]
        missing = sorted(set(range(n)) - set(run))
        if len(missing) == 1 and run == sorted(run):  # the root receives from all others
            return (Call("gather", first.numel, first.dtype, n, first.group, root=missing[0]),
                    n - 1)
    return None


def fold_grouped_p2p(trace: Trace) -> None:
    """NCCL logs show torch's gather and all-to-all as grouped Send/Recv (no ncclGather
    before 2.30): fold them back where they run on a communicator that also carries the
    rank's all-reduces (a TP group), never on a pipeline's send/recv communicator."""
    for rank in trace.ranks:
        calls = trace.rank_calls(rank)
        reducing = {c.group for c in calls if c.op == "allreduce"}
        if not any(c.op in ("send", "recv") and c.group in reducing for c in calls):
            continue
        out, i = [], 0
        while i < len(calls):
            c = calls[i]
            folded = (_fold_run(calls, i) if c.op in ("send", "recv") and c.group in reducing
                      else None)
            if folded is None:
                out.append(trace.intern(c))
                i += 1
            else:
                out.append(trace.intern(folded[0]))
                i += folded[1]
        rank.ids = type(rank.ids)("I", out)
        rank.step_starts = None  # positions moved; logs carry no step annotations anyway


def trace_pattern(trace: Trace) -> Pattern:
    """The trace as a pattern: the first step is the prefill, the others decode steps."""
    if not trace.calls:
        raise ConfigError("the trace holds no call with a size to replay"
                          + (" (only expert-parallel kernels, whose events record no sizes)"
                             if trace.ep_kernels else "") + "; pass a trace with its calls")
    if any(call.dtype == "unknown" and not call.numel for call in trace.table):
        raise ConfigError("the trace's calls have no sizes (recorded without shapes): replay "
                          "needs them; profile with torch.profiler.profile(record_shapes=True)")
    if trace.disjoint:
        raise ConfigError(trace.disjoint + "; pass the logs of one run (every process of it)")
    if "nccl" in trace.formats:
        fold_grouped_p2p(trace)
    layout = trace_layout(trace)
    stages = []
    decode_steps = 0
    dtypes: Counter = Counter()
    for stage in range(layout.pp):
        ranks = trace.ranks[stage * layout.tp:(stage + 1) * layout.tp]
        _check_stage(trace, ranks, stage)
        lead = ranks[0]
        steps = split_steps(lead.ids, lead.step_starts)
        runs: list[Run] = []
        for index, (ids, repeat) in enumerate(fold(lead.ids, steps)):
            ops = tuple(_op(trace.table[i], layout) for i in ids)
            dtypes.update(op.dtype for op in ops)
            if index == 0:  # the first step is the prefill; its repeats are decode steps
                runs.append(Run(Phase.PREFILL, Step(ops, 0, 0), 1))
                if repeat > 1:
                    runs.append(Run(Phase.DECODE, Step(ops, 0, 0), repeat - 1))
            else:
                runs.append(Run(Phase.DECODE, Step(ops, 0, 0), repeat))
        stages.append(tuple(runs))
        decode_steps = max(decode_steps, sum(r.repeat for r in runs) - 1)
    model_dtype = next((d for d, _ in dtypes.most_common() if d in ("bf16", "fp16", "fp32")),
                       "bf16")
    model = ModelConfig(name="trace", hidden_size=0, num_hidden_layers=0, vocab_size=0,
                        num_attention_heads=layout.tp, num_key_value_heads=layout.tp,
                        intermediate_size=0, torch_dtype=model_dtype,
                        source=", ".join(r.name for r in trace.ranks))
    workload = Workload(prompt=1, decode=decode_steps + 1, dtype=model_dtype)
    return Pattern(engine="trace", model=model, layout=layout, workload=workload,
                   options=EngineOptions(eager=True), stages=tuple(stages))
