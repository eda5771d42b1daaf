"""What explains a vLLM pipeline trace that differs from its pattern: which of vLLM's two
ways of handing a stage's tensors on the trace shows (pp_transfer.py here).

- vLLM on GPUs, and its CPU build without the shared-memory communicator (`_C_AVX2`, an
  AVX2-only CPU), send each step's metadata first (`send_object` on gloo: an int64 [1],
  then the pickled list as uint8) and the tensors as TP slices, all-gathered after the
  receive: the pattern's default.
- vLLM's CPU build with it (`_C` / `_C_AVX512`, AVX-512 CPUs) sends the tensors whole in one
  shared-memory list and no metadata: `--pp-whole-tensors`.

Read from validate's rows (rank, phase, op, numel, dtype, trace and pattern counts): the
metadata is the only uint8 a vLLM pipeline sends.
"""

from collections.abc import Iterable
from typing import Protocol


class _Row(Protocol):
    op: str
    numel: int
    dtype: str
    trace_calls: int
    pattern_calls: int


def _metadata_sizes(rows: Iterable[_Row], side: str) -> set[int]:
    """The pickled metadata sizes (uint8 sends and receives) the trace or the pattern has."""
    return {r.numel for r in rows if r.op in ("send", "recv") and r.dtype == "uint8"
            and getattr(r, side) > 0}


def pp_path_hint(rows: list[_Row], whole_tensors: bool, tensor_device: str) -> str | None:
    """One line naming what differs in the pipeline's hand-over, or None where it agrees."""
    traced, modelled = _metadata_sizes(rows, "trace_calls"), _metadata_sizes(rows,
                                                                             "pattern_calls")
    if traced and not modelled and whole_tensors:
        return ("the trace sends vLLM's pipeline metadata before each step's tensors "
                "(send_object on gloo: an int64, then " + _sizes(traced) + " pickled bytes): "
                "the path vLLM takes on GPUs, and its CPU build without the shared-memory "
                "communicator (_C_AVX2, on CPUs without AVX-512); drop --pp-whole-tensors "
                "(the tensors then go as TP slices, all-gathered after the receive)")
    if modelled and not traced:
        return ("the trace sends no pipeline metadata: vLLM's CPU build with its "
                "shared-memory communicator (_C or _C_AVX512, on AVX-512 CPUs) sends a "
                "stage's tensors whole in one shared-memory list; add --pp-whole-tensors")
    if traced and modelled and traced != modelled:
        other = "cpu" if tensor_device == "cuda" else "cuda"
        return (f"the pickled pipeline metadata is {_sizes(traced)} bytes in the trace, "
                f"{_sizes(modelled)} in the pattern: it names the tensors' device type "
                f"(--tensor-device {tensor_device} here; --tensor-device {other}?), dtype "
                "and shape")
    return None


def _sizes(sizes: set[int]) -> str:
    return " or ".join(f"{n:,}" for n in sorted(sizes))
