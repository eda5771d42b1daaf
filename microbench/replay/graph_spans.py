"""Where CUDA graphs may be cut: a pure function of the pattern, the same on every rank.

NCCL: "Whether an operation launch is graph-captured is considered a collective property of
that operation and therefore must be uniform over all ranks participating in the launch"
(NVIDIA/nccl docs/userguide/source/usage/cudagraph.rst @ 5067397c), and each capture's
warm-up is real communication, so every member of a communicator must warm up, capture and
launch the same graphs in the same order. Cutting graphs from each rank's own run list
breaks that as soon as ranks' run lists differ (uneven `--dp-batches`: one DP rank still
prefills while another decodes, and its decode runs are cut elsewhere).

So the cuts come from the whole pattern: the step timeline is cut wherever any rank's run
changes (every DP rank, every stage), and a piece is captured only if every rank of the world
is decoding throughout it. vLLM does the same agreement at run time: DP ranks exchange their
batch and cudagraph mode before each step and fall back to eager together
(vllm/v1/worker/dp_utils.py `_synchronize_dp_ranks` @ c8109375, cited in patterns/dp_steps.py).
Every rank computes the same pieces from the same pattern, so no exchange is needed here.
"""

import itertools

from patterns import Op, OpKind, Pattern, Phase

Piece = tuple[int, int, bool]  # [start step, end step), captured
# Steps a graph may capture: decodes, and vLLM's DP wave tail, whose dummy forwards run the
# one-token full graph (`_dummy_run(1, uniform_decode=True)`: patterns/engines/vllm/dp_wave.py)
CAPTURED_PHASES = frozenset({Phase.DECODE, Phase.WAVE_TAIL})


def graph_pieces(pattern: Pattern) -> tuple[Piece, ...]:
    """The global step pieces of one inference, each captured or eager on every rank.

    One pass over each rank's runs per piece boundary: linear in runs and pieces, as long
    request workloads have thousands of runs."""
    timelines = [runs for replica in pattern.replicas() for runs in replica]
    cuts: set[int] = {0}
    for runs in timelines:
        step = 0
        for run in runs:
            step += run.repeat
            cuts.add(step)
    points = sorted(cuts)
    decoding = [True] * (len(points) - 1)  # piece i: [points[i], points[i + 1])
    for runs in timelines:
        i, end = 0, 0
        for run in runs:
            end += run.repeat
            while i < len(decoding) and points[i] < end:
                decoding[i] = decoding[i] and run.phase in CAPTURED_PHASES
                i += 1
        while i < len(decoding):  # past this rank's last step: nothing to capture with
            decoding[i] = False
            i += 1
    return tuple((start, stop, captured) for (start, stop), captured
                 in zip(itertools.pairwise(points), decoding, strict=True))


def piece_keys(pattern: Pattern, pieces: tuple[Piece, ...]) -> tuple[tuple[object, ...], ...]:
    """For each piece, every rank's step in it (None past a rank's last step): two pieces
    with one key issue the same calls on every rank, so a graph captured for the first can
    be launched for the second, and every rank decides so alike (vLLM too captures a fixed
    set of batch sizes once and reuses them)."""
    timelines = [runs for replica in pattern.replicas() for runs in replica]
    columns = []
    for runs in timelines:
        column, i = [], 0
        ends = list(itertools.accumulate(run.repeat for run in runs))
        for start, _, _ in pieces:
            while i < len(runs) and ends[i] <= start:
                i += 1
            column.append(runs[i].step if i < len(runs) else None)
        columns.append(column)
    return tuple(zip(*columns, strict=True)) if columns else tuple(() for _ in pieces)


# Groups whose calls an engine issues between its stages' graphs, never inside one: the PP
# send/recv and the last stage's broadcast of the sampled tokens, which vLLM Model Runner V2
# issues after sampling, outside the captured forward (v1/worker/gpu/pp_utils.py `PPHandler`,
# v1/worker/gpu/model_runner.py @ c8109375, as patterns/engines/vllm/profile.py cites them).
EAGER_GROUPS = ("pp", "pp_broadcast")
P2P = (OpKind.SEND, OpKind.RECV)


def kept_eager(op: Op) -> bool:
    """An op a captured step issues eagerly between its graphs: point-to-point, the PP
    groups' calls, and what the engine runs on a CPU group (gloo), replay/graphs.py."""
    from patterns.ops import Transport
    return op.kind in P2P or op.group in EAGER_GROUPS or op.transport == Transport.GLOO


def mixes_graphs_and_eager(pattern: Pattern, pieces: tuple[Piece, ...]) -> bool:
    """Whether an eager call may follow a graph launch with no synchronize between: a
    captured piece followed by an eager one (a request workload's next prefill), or a
    captured piece holding ops the replay keeps eager between its graphs (PP send/recv, the
    sampled tokens' broadcast, host-path ops). Which communicator each eager call uses is not
    asked: NCCL_GRAPH_MIXING_SUPPORT=0 forbids it on the graph's communicator "(or
    split-shared communicators)" (NVIDIA/nccl docs/userguide/source/env.rst @ 0186f08d), and
    torch's groups are split from the world's where a device is bound, the nccl backend's PP
    group is the world's communicator itself at TP1, so any of them may share one."""
    captured = [captured for _, _, captured in pieces]
    if any(a and not b for a, b in itertools.pairwise(captured)):
        return True
    keys = piece_keys(pattern, pieces)
    return any(step is not None and any(kept_eager(op) for op in step.ops)
               for key, (_, _, on) in zip(keys, pieces, strict=True) if on for step in key)
