"""Streams, timing events and CUDA graphs of the stand-in `torch.cuda` (a CPU torch), with
the rules real torch and CUDA enforce, for the GPU tests run on stand-ins.

A "launch" here runs at once on the host; what the stand-in checks is the order and the
places of things (each rule's source beside it):
- `torch.cuda.graph(g, stream=s)` refuses the legacy default stream ("CUDA graphs must be
  captured on a non-default stream": CUDAGraph::capture_begin, aten/src/ATen/cuda/
  CUDAGraph.cpp) and nesting; while it captures, `torch.cuda.synchronize`,
  `Stream/Event.synchronize`, an event record, `.item()`/`.cpu()`/`.tolist()` (device-to-host
  copies that wait) raise, as CUDA refuses a sync of a capturing stream
  (cudaErrorStreamCaptureUnsupported) and torch's tensor copies sync;
- a collective issued on another stream than the capturing one raises: on a GPU it would
  escape the graph and run eagerly;
- `Event.elapsed_time` needs both events recorded on one stream, no call on another stream
  between them, and a synchronize after the later one (cudaEventElapsedTime answers
  cudaErrorNotReady: torch/csrc/cuda/Event.cpp elapsed_time);
- a graph that was `reset()` cannot be replayed; the live graphs are what
  `destroy_process_group` must find none of (tests/fake_torch_nccl.py).
"""

import contextlib
import itertools
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar


class CaptureError(RuntimeError):
    """What CUDA answers to a call a stream capture cannot contain."""


_ids = itertools.count(1)
_clock = itertools.count(1)  # orders event records and synchronizes


class Stream:
    def __init__(self, streams: "Streams", device: Any = None, priority: int = 0,
                 legacy: bool = False) -> None:
        self._streams, self.legacy = streams, legacy
        self.id = 0 if legacy else next(_ids)
        self.synced_at = 0
        self.outstanding: set[Any] = set()  # process groups of graphs launched here

    def wait_stream(self, other: "Stream") -> None:
        self._streams.refuse_cross_capture(self)

    def synchronize(self) -> None:
        self._streams.refuse("Stream.synchronize")
        self.synced_at = next(_clock)
        self.outstanding.clear()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.id == self.id

    def __hash__(self) -> int:
        return self.id


class Graph:
    """torch.cuda.CUDAGraph: `replay()` runs what the capture recorded; `reset()` frees it."""

    streams: ClassVar["Streams | None"] = None
    live: ClassVar["weakref.WeakSet[Graph]"] = weakref.WeakSet()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls: list[Callable[[], None]] = []
        self.groups: set[Any] = set()
        self.captured = False
        Graph.live.add(self)

    def replay(self) -> None:
        streams = Graph.streams
        assert streams is not None and self.captured and self in Graph.live, \
            "replay of a graph not captured, or reset"
        streams.refuse("CUDAGraph.replay")
        stream = streams.current()
        streams.issued.append(stream.id)
        for call in self.calls:
            call()
        stream.outstanding |= self.groups

    def reset(self) -> None:
        Graph.live.discard(self)
        self.calls, self.groups = [], set()


class Streams:
    """The stand-in's stream state: the current stream, the capture, what ran where."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.default = Stream(self, legacy=True)
        self._current: Stream | None = None
        self.capturing: Graph | None = None
        self.capture_stream: Stream | None = None
        self.issued: list[int] = []  # the stream of every call issued, in order
        Graph.streams = self

    def current(self) -> Stream:
        return self._current or self.default

    def refuse(self, what: str) -> None:
        if self.capturing is not None:
            raise CaptureError(f"{what} while a CUDA graph captures (cudaErrorStreamCapture"
                               "Unsupported: it would invalidate the capture)")

    def refuse_cross_capture(self, stream: Stream) -> None:
        pass  # wait_stream between streams is legal during a capture (it joins them)

    def run(self, work: Callable[[], None], group: Any, what: str) -> None:
        """Issue one library call on the current stream: recorded into the graph that
        captures, else run now."""
        stream = self.current()
        if self.capturing is not None:
            if stream is not self.capture_stream:
                raise CaptureError(f"{what} on stream {stream.id} while stream "
                                   f"{self.capture_stream.id} captures: it joins no graph")
            self.capturing.calls.append(work)
            self.capturing.groups.add(group)
            return
        if os.environ.get("NCCL_GRAPH_MIXING_SUPPORT") == "0" and any(
                group in s.outstanding for s in self.all_streams()):
            raise AssertionError(f"an eager {what} on a communicator whose launched graph may "
                                 "still run, with NCCL_GRAPH_MIXING_SUPPORT=0: not supported "
                                 "(NCCL env.rst, observed hangs); synchronize first")
        self.issued.append(stream.id)
        work()

    def all_streams(self) -> list[Stream]:
        seen = [self.default, self.current()]
        if self.capture_stream is not None:
            seen.append(self.capture_stream)
        return seen + list(_made)

    def synchronize(self) -> None:
        self.refuse("torch.cuda.synchronize")
        tick = next(_clock)
        for stream in self.all_streams():
            stream.synced_at = tick
            stream.outstanding.clear()


_made: "weakref.WeakSet[Stream]" = weakref.WeakSet()


class Event:
    streams: ClassVar[Streams | None] = None

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.timing, self.stream, self.at, self.t = enable_timing, None, -1, 0.0
        self.tick = 0

    def record(self, stream: Stream | None = None) -> None:
        streams = Event.streams
        assert streams is not None
        streams.refuse("a timing event recorded")
        self.stream = stream if stream is not None else streams.current()
        self.at, self.t, self.tick = len(streams.issued), time.perf_counter(), next(_clock)

    def synchronize(self) -> None:
        assert Event.streams is not None
        Event.streams.refuse("Event.synchronize")
        if self.stream is not None:
            self.stream.synced_at = max(self.stream.synced_at, next(_clock))

    def elapsed_time(self, end: "Event") -> float:
        streams = Event.streams
        assert streams is not None
        if not (self.timing and end.timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.stream is None or end.stream is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        if self.stream != end.stream:
            raise AssertionError(f"events on streams {self.stream.id} and {end.stream.id}: "
                                 "their difference times neither stream's calls")
        lo, hi = sorted((self.at, end.at))
        others = set(streams.issued[lo:hi]) - {self.stream.id}
        if others:
            raise AssertionError(f"calls on stream(s) {sorted(others)} between events on "
                                 f"stream {self.stream.id}: the events do not time them")
        if end.stream.synced_at < max(self.tick, end.tick):
            raise RuntimeError("CUDA error: device not ready (cudaErrorNotReady): the stream "
                               "was not synchronized after the event was recorded")
        return (end.t - self.t) * 1e3


def install(torch: Any, cuda: Any) -> None:
    """Set torch.cuda's stream, event, graph and sync calls, and the CUDA tensor makers."""
    streams: Streams = cuda.streams
    Event.streams = streams

    def make_stream(device: Any = None, priority: int = 0, **_: Any) -> Stream:
        cuda._need_device("torch.cuda.Stream()")
        made = Stream(streams, device, priority)
        _made.add(made)
        return made

    @contextlib.contextmanager
    def use_stream(stream: Stream | None) -> Iterator[None]:
        before = streams._current
        streams._current = stream if stream is not None else before
        try:
            yield
        finally:
            streams._current = before

    @contextlib.contextmanager
    def graph(cuda_graph: Graph, pool: Any = None, stream: Stream | None = None,
              capture_error_mode: str = "global") -> Iterator[None]:
        if streams.capturing is not None:
            raise CaptureError("a capture inside a capture")
        streams.synchronize()  # graph.__enter__: synchronize, gc.collect, empty_cache
        stream = stream if stream is not None else make_stream()
        if stream.legacy:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. "
                               "(However, after capture, it's ok to replay them on the "
                               "default stream.)")
        before = streams._current
        streams._current, streams.capturing, streams.capture_stream = stream, cuda_graph, stream
        try:
            yield
        finally:
            streams._current, streams.capturing, streams.capture_stream = before, None, None
        cuda_graph.captured = True

    torch.cuda.Stream, torch.cuda.stream, torch.cuda.graph = make_stream, use_stream, graph
    torch.cuda.CUDAGraph, torch.cuda.Event = Graph, Event
    torch.cuda.synchronize = lambda device=None: streams.synchronize()
    torch.cuda.is_current_stream_capturing = lambda: streams.capturing is not None
    torch.cuda.nccl.version = lambda: (2, 27, 3)
    for name in ("zeros", "empty", "ones"):
        setattr(torch, name, _on_this_device(getattr(torch, name), cuda, torch))
    for name in ("item", "cpu", "tolist"):
        setattr(torch.Tensor, name, _refused_in_capture(getattr(torch.Tensor, name), streams,
                                                        f"Tensor.{name}()"))


def _on_this_device(make: Callable[..., Any], cuda: Any, torch: Any) -> Callable[..., Any]:
    """torch.zeros(..., device='cuda[:i]'): host memory that stands for device memory
    (tests/fake_device_memory.py: no MPI that is not CUDA-aware may be handed it), refused
    off this rank's GPU."""
    from tests.fake_device_memory import on_device as as_device_memory

    def on_device(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None and torch.device(device).type == "cuda":
            index = torch.device(device).index
            current = cuda._need_device(f"torch.{make.__name__} on a CUDA device")
            if index is not None and index != current:
                raise AssertionError(f"a tensor on GPU {index} made by the rank of GPU "
                                     f"{current}")
            return as_device_memory(make(*args, device="cpu", **kwargs))
        return make(*args, device=device, **kwargs)
    return on_device


def _refused_in_capture(method: Callable[..., Any], streams: Streams,
                        what: str) -> Callable[..., Any]:
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        streams.refuse(what)
        return method(self, *args, **kwargs)
    return guarded
