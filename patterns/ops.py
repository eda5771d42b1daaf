"""Communication calls: a table of kinds, one call (`Op`) and one forward pass (`Step`)."""

from dataclasses import dataclass
from enum import StrEnum
from math import prod

from patterns.dtypes import dtype_bytes


class OpKind(StrEnum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    GATHER = "gather"
    BROADCAST = "broadcast"
    SEND = "send"
    RECV = "recv"
    ALLTOALL = "alltoall"


P2P_KINDS = frozenset({OpKind.SEND, OpKind.RECV})


class Transport(StrEnum):
    """What carries a call in the engine (engine spec 10.2); replay sends every call through
    its own backend whatever this says."""

    NCCL = "nccl"
    CUSTOM_ALLREDUCE = "custom-allreduce"  # the engine's IPC all-reduce kernel
    FUSED_ALLREDUCE_RMSNORM = "fused-allreduce-rmsnorm"  # FlashInfer/TRT-LLM fused kernel
    SYMM_MEM = "symm-mem"  # torch symmetric-memory all-reduce
    MULTIMEM = "multimem"  # NVLS multicast (multimem) kernels
    GLOO = "gloo"  # a CPU group
    NVSHMEM = "nvshmem"  # DeepEP-style all-to-all kernels (NVSHMEM / IPC), not NCCL


DEVICE_TRANSPORTS = frozenset(Transport) - {Transport.GLOO}


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    # vLLM's data-parallel MoE ranks after their last real step: dummy forwards until the
    # wave ends at its 32-step sync (patterns/engines/vllm/dp_wave.py); shown, timed and
    # priced apart from the inference's own steps.
    WAVE_TAIL = "wave_tail"


@dataclass(frozen=True)
class Op:
    """One call as one rank issues it.

    `shape` is the rank's input (for recv: the buffer it receives into); `out_shape` is the
    result (the root's for gather; equal to `shape` for in-place calls). `peer` is the other
    side's rank in `group` for send/recv; `root` the root's rank in `group` for gather and
    broadcast. `tag` names the engine code that issues the call; `transport` what the
    engine sends it through under its defaults.

    `counts` makes an all-gather or reduce-scatter uneven (all-gatherv, reduce-scatterv):
    the elements of each group rank's part, in group order (its input for an all-gather, its
    output for a reduce-scatter). None: every part is equal, as for any other kind.
    """

    kind: OpKind
    group: str
    group_size: int
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    tag: str
    peer: int | None = None
    root: int | None = None
    transport: Transport = Transport.NCCL
    counts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.counts is None:
            return
        if self.kind not in (OpKind.ALLGATHER, OpKind.REDUCESCATTER):
            raise ValueError(f"counts are for allgather and reducescatter, not {self.kind}")
        if len(self.counts) != self.group_size:
            raise ValueError(f"{len(self.counts)} counts for a group of {self.group_size}")
        total = prod(self.out_shape if self.kind == OpKind.ALLGATHER else self.shape)
        if sum(self.counts) != total:
            raise ValueError(f"counts {self.counts} do not add up to the {total} elements of "
                             f"the gathered / reduced tensor of {self.tag}")

    @property
    def part_counts(self) -> tuple[int, ...]:
        """Elements of each group rank's part of an all-gather or reduce-scatter."""
        if self.counts is not None:
            return self.counts
        whole = prod(self.out_shape if self.kind == OpKind.ALLGATHER else self.shape)
        return (whole // self.group_size,) * self.group_size

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def bytes(self) -> int:
        """Input bytes of one call on one rank."""
        return self.numel * dtype_bytes(self.dtype)

    @property
    def out_bytes(self) -> int:
        return prod(self.out_shape) * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class Step:
    """The ordered calls of one forward pass on one rank; every rank of a stage issues them.

    `tokens` is T, the tokens of the forward pass after padding; `rows` is S, the sampled rows.
    """

    ops: tuple[Op, ...]
    tokens: int
    rows: int
