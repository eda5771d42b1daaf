"""Bind one call of any kind straight through a backend's API, as build_plan does."""

from math import prod

from microbench.backends import Backend, Group
from microbench.replay.plan import BoundOp
from patterns import Op, OpKind

KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "gather")


def bound_op(backend: Backend, group: Group, kind: str, numel: int, dtype: str,
             root: int = 0) -> BoundOp:
    """A call of `kind` on `group` with `numel` input elements, buffers from the backend."""
    n = group.size
    out = {"allgather": numel * n, "gather": numel * n, "reducescatter": numel // n}.get(
        kind, numel)
    op = Op(kind=OpKind(kind), group=group.name, group_size=n, shape=(numel,),
            out_shape=(out,), dtype=dtype, tag=f"test.{kind}",
            root=root if kind in ("gather", "broadcast") else None)
    send = backend.empty(numel, dtype)
    recv = None
    if kind not in ("allreduce", "broadcast") and (kind != "gather" or group.index == root):
        recv = backend.empty(prod(op.out_shape), dtype)
    call = backend.bind(kind, group, send, recv, op.root)
    return BoundOp(op, group, send, recv, call)
