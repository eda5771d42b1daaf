"""`--graph decode`: each decode step captured once in a CUDA graph and replayed, as vLLM does.

vLLM runs the prefill eagerly and every decode step as one CUDA-graph launch, so the host
issues one launch per step instead of ~65 library calls. Here each decode run of the plan
(a run is a stretch of identical steps; consecutive runs always differ) gets one graph of
its step, and the run's calls become that graph's launch; the prefill stays eager. Calls
inside a graph cannot be timed one by one, so op-level timing refuses graphs; step and
inference marks are CUDA events recorded on the stream after each launch. --check issues
every call eagerly, one by one, to compare each result; tests/test_gpu_nccl.py checks that
graphs and eager calls produce the same data.

Capture, per backend:
- torch: one warm-up of the step on a side stream (it creates NCCL communicators lazily,
  P2P ones included, which cannot happen inside a capture), then `torch.cuda.graph` on that
  side stream; the launch is `CUDAGraph.replay()` on the current stream, where the events
  are. ProcessGroupNCCL supports capture (NCCL >= 2.9): while a stream captures it hands no
  work to its watchdog thread, and since torch 2.2 a capture first waits for the work the
  watchdog still holds, whose event queries would otherwise break the capture. The capture
  mode is "thread_local", so that thread's queries cannot invalidate it in any case. Graph
  launches create no Work objects, so TORCH_NCCL_ASYNC_ERROR_HANDLING and the NCCL timeout
  never see them: a stalled launch surfaces in the end-of-inference synchronize, which the
  replay's own watchdog (--timeout) bounds. TORCH_NCCL_BLOCKING_WAIT=1 makes every call wait
  on the host, which a capture cannot contain: refused.
- nccl (CuPy): one warm-up on the backend's stream, then `Stream.begin_capture()` (CuPy's
  default relaxed mode) / `end_capture()` -> `cupy.cuda.Graph`; the launch is
  `graph.launch(stream)`.
Which steps are captured is a pure function of the pattern that every rank computes alike
(replay/graph_spans.py): the step timeline is cut wherever any rank's run changes, and a piece
is captured only where every rank decodes, so the warm-ups and captures of one rank meet
their peers' (NCCL requires a captured call to be captured on every rank of its communicator,
and each graph to be launched by all of them). Point-to-point calls (PP send/recv), and the
last stage's broadcast of sampled tokens, stay out of the graphs and are issued eagerly
between them, as vLLM moves intermediate tensors between
its stages' graphs: in vllm-project/vllm vllm/v1/worker/gpu_worker.py @ 35d5cda1
`execute_model`, a later stage's `get_pp_group().recv_tensor_dict(...)` runs before
`model_runner.execute_model` (whose model forward is the captured part) and the
`send_tensor_dict` of its IntermediateTensors after it. Torch P2P under capture is also
fragile (pytorch/pytorch#133984). A pattern generated with --eager (an engine without
graphs) is replayed eagerly by default and refuses an explicit --graph decode.

Teardown: NCCL's destroy/finalize waits until every graph that captured the communicator is
destroyed (commDestroySync, src/init.cc @ 5067397c), so `release_graphs` drops and resets
every graph before the backend closes.
"""

import contextlib
import gc
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from microbench.argtypes import UsageError
from microbench.backends import Backend, BoundCall
from microbench.replay.graph_spans import CAPTURED_PHASES, kept_eager
from microbench.replay.plan import BoundOp, BoundRun, Plan
from patterns import Pattern
from patterns.ops import Transport

MODES = ("decode", "none")
CAPTURING_BACKENDS = ("torch", "nccl")

Capture = Callable[[list[BoundCall]], BoundCall]


def eager_pattern_mode(pattern: Pattern, requested: str | None) -> str | None:
    """An --eager pattern (the engine runs no CUDA graphs) replays eagerly: `none` by
    default, an explicit --graph decode refused in one line."""
    if not pattern.options.eager:
        return requested
    if requested == "decode":
        raise UsageError("--graph decode captures CUDA graphs, but the pattern was generated "
                         "with --eager (an engine that runs none); drop --graph decode or "
                         "--eager")
    return "none"


def p2p_algorithm_mode(backend: str, algorithm: str | None, requested: str | None) -> str | None:
    """`--allreduce-algo` other than the library's, on torch: its all-reduce is torch
    batch_isend_irecv + wait (algorithms/execute.py), and ProcessGroupNCCL hands back no Work
    for P2P under capture (pytorch/pytorch#133984, torch 2.3-2.6), so it replays eagerly by
    default and an explicit --graph decode is refused. The nccl backend's ncclSend/ncclRecv
    are captured as NCCL allows (>= 2.9)."""
    if backend != "torch" or algorithm in (None, "library"):
        return requested
    if requested == "decode":
        raise UsageError(f"--allreduce-algo {algorithm} on --backend torch is torch send/recv, "
                         "which a CUDA graph cannot capture (pytorch/pytorch#133984); use "
                         "--graph none, or --backend nccl")
    return "none"


def resolve_mode(requested: str | None, backend: str, device: str, level: str) -> str:
    """The graph mode of a run: `requested`, or the default (decode on CUDA for torch and
    nccl, unless op-level timing; none otherwise). Refusals are one-line UsageErrors.

    `device` may still be "auto" (before the ranks start): only "cpu" is refused then.
    """
    if requested is None:
        capturable = device == "cuda" and backend in CAPTURING_BACKENDS
        return "decode" if capturable and level != "op" else "none"
    if requested == "decode":
        if backend not in CAPTURING_BACKENDS:
            raise UsageError(f"--graph decode needs --backend torch or nccl: {backend} calls "
                             "run on the host, where no CUDA graph can capture them; use "
                             "--graph none")
        if device == "cpu":
            raise UsageError("--graph decode captures CUDA graphs and needs a CUDA device; "
                             "use --graph none with --device cpu")
        if level == "op":
            raise UsageError("--timing op cannot time calls one by one inside a CUDA graph; "
                             "use --timing step or inference, or --graph none")
    return requested


def use_graphs(plan: Plan, backend: Backend, capture: Capture | None = None,
               progress: Callable[[], None] | None = None) -> int:
    """Cut the plan's runs at the pattern's global pieces and replace the calls of every
    captured piece by graph launches, point-to-point and host-path calls left eager between
    them (calls added to a run after its ops, such as test faults, stay after them). A piece
    whose key (every rank's step) equals an earlier captured one launches that one's graphs.
    `progress` is called after each capture (the watchdog's step count: capturing thousands
    of pieces is progress, not a hang). Returns the number of graphs. Every rank calls this
    at the same point: the warm-ups communicate."""
    capture = capture or capture_function(backend)
    if progress is not None:
        capture = _counting(capture, progress)
    pieces = plan.pieces if plan.pieces is not None else _own_decode_runs(plan)
    keys = (plan.piece_keys if plan.pieces is not None and plan.piece_keys is not None
            else (None,) * len(pieces))
    captured_by_key: dict[object, list[BoundCall]] = {}
    runs: list[BoundRun] = []
    step = 0
    for run in plan.runs:
        extra = run.calls[len(run.ops):]
        for (start, end, captured), key in zip(pieces, keys, strict=True):
            lo, hi = max(start, step), min(end, step + run.repeat)
            if lo >= hi:
                continue
            if captured and run.phase in CAPTURED_PHASES and run.ops:
                calls = captured_by_key.get(key) if key is not None else None
                if calls is None:
                    calls = _captured_step(run.ops, capture, plan.graphs, backend.synchronize)
                    if key is not None:
                        captured_by_key[key] = calls
            else:
                calls = [op.call for op in run.ops]
            runs.append(BoundRun(run.phase, hi - lo, run.ops, [*calls, *extra]))
        step += run.repeat
    plan.runs[:] = runs
    backend.synchronize()
    return len(plan.graphs)


def _counting(capture: Capture, progress: Callable[[], None]) -> Capture:
    def counted(calls: list[BoundCall]) -> BoundCall:
        launch = capture(calls)
        progress()
        return launch
    return counted


def check_mixing(pattern: Pattern, mode: str | None, backend: str, device: str,
                 environ: Any = None) -> None:
    """NCCL_GRAPH_MIXING_SUPPORT=0 with graphs on a pattern that issues eager calls after a
    graph launch on its communicators (a request workload's prefills after decode graphs,
    host-path ops between graphs): NCCL does not support an eager call during an outstanding
    graph launch on the same communicator with that setting (docs/userguide/source/env.rst
    NCCL_GRAPH_MIXING_SUPPORT @ 5067397c, "observed hangs"). Refused in one line."""
    from microbench.replay.graph_spans import graph_pieces, mixes_graphs_and_eager

    env = os.environ if environ is None else environ
    graphs = mode == "decode" or (mode is None and backend in CAPTURING_BACKENDS
                                  and device != "cpu")
    if not graphs or env.get("NCCL_GRAPH_MIXING_SUPPORT", "").strip() != "0":
        return
    if mixes_graphs_and_eager(pattern, graph_pieces(pattern)):
        raise UsageError("NCCL_GRAPH_MIXING_SUPPORT=0 with CUDA graphs: this pattern issues "
                         "eager calls after graph launches on the same communicators, which "
                         "NCCL does not support with that setting (it can hang); unset it, "
                         "or use --graph none")


def _own_decode_runs(plan: Plan) -> tuple[tuple[int, int, bool], ...]:
    """A plan built by hand (no pattern): each of its decode runs is a piece."""
    pieces, step = [], 0
    for run in plan.runs:
        pieces.append((step, step + run.repeat, run.phase in CAPTURED_PHASES))
        step += run.repeat
    return tuple(pieces)


def _captured_step(ops: list[BoundOp], capture: Capture, graphs: list[BoundCall],
                   synchronize: BoundCall) -> list[BoundCall]:
    """One step's calls: each stretch of collectives one graph launch; P2P calls and the
    PP groups' calls eager between them; an op the engine runs on a CPU group (gloo: vLLM's
    per-step DP sync, SGLang's MLPSyncBatchInfo all-gather) eager too and followed by a
    synchronize, the host read-back that follows it in the engine (vllm-project/vllm
    vllm/v1/worker/dp_utils.py @ c8109375 lines 18-98: the all-reduce on the DP cpu_group,
    then .item()/.cpu() to choose the padding and the graph)."""
    calls: list[BoundCall] = []
    stretch: list[BoundCall] = []
    for op in ops:
        host_path = op.op is not None and op.op.transport == Transport.GLOO
        if op.op is not None and kept_eager(op.op):
            if stretch:
                graphs.append(capture(stretch))
                calls.append(graphs[-1])
                stretch = []
            calls.append(op.call)
            if host_path:
                calls.append(synchronize)
        else:
            stretch.append(op.call)
    if stretch:
        graphs.append(capture(stretch))
        calls.append(graphs[-1])
    return calls


def release_graphs(plan: Plan, backend: Backend) -> None:
    """Drop every graph the plan launches, and its memory pool, before the backend closes:
    ncclCommDestroy/ncclCommFinalize wait for every graph that captured the communicator
    (commDestroySync, NVIDIA/nccl src/init.cc @ 5067397c), and torch's
    destroy_process_group finalizes its communicators the same way."""
    if not plan.graphs:
        return
    backend.synchronize()  # no launch still in flight
    launches = {id(g) for g in plan.graphs}
    for run in plan.runs:
        run.calls = [call for call in run.calls if id(call) not in launches]
    for launch in plan.graphs:
        reset = getattr(getattr(launch, "__self__", None), "reset", None)
        if reset is not None:  # torch.cuda.CUDAGraph: frees the graph and its pool now
            reset()
    plan.graphs.clear()
    gc.collect()  # CuPy's Graph is destroyed with its last reference


def capture_function(backend: Backend) -> Capture:
    """How this backend warms up and captures a list of bound calls into one launch."""
    if backend.name == "torch":
        blocking = os.environ.get("TORCH_NCCL_BLOCKING_WAIT") or os.environ.get(
            "NCCL_BLOCKING_WAIT")
        if blocking not in (None, "", "0"):
            raise UsageError("TORCH_NCCL_BLOCKING_WAIT makes each NCCL call wait on the host, "
                             "which a CUDA graph capture cannot contain; unset it or use "
                             "--graph none")
        return _capture_torch
    if backend.name == "nccl":
        return partial(_capture_cupy, backend.stream)  # the nccl backend's own stream
    raise UsageError(f"--graph decode needs --backend torch or nccl, not {backend.name}")


def _issue(calls: list[BoundCall]) -> None:
    for call in calls:
        call()


def _capture_torch(calls: list[BoundCall]) -> BoundCall:
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _issue(calls)  # warm-up: NCCL communicators (P2P ones too) come to exist here
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        _issue(calls)
    return graph.replay  # the bound method keeps the graph alive


def _capture_cupy(stream: Any, calls: list[BoundCall]) -> BoundCall:
    _issue(calls)  # warm-up on the stream the calls are bound to
    stream.synchronize()
    stream.begin_capture()
    try:
        _issue(calls)
    except BaseException:
        _end_capture_quietly(stream)
        raise
    graph = stream.end_capture()
    return partial(graph.launch, stream)


def _end_capture_quietly(stream: Any) -> None:
    """Leave the stream usable after a failed capture; the first error is the one to show."""
    with contextlib.suppress(Exception):  # an invalidated capture raises here too
        stream.end_capture()
