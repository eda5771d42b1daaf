"""The host memory a sweep's largest case takes, checked before any rank starts: `--sizes 64G`
on a 24 GiB machine used to start ranks that then died of MemoryError."""

from math import prod

from microbench.argtypes import UsageError
from microbench.views.textfmt import format_bytes
from patterns.dtypes import dtype_bytes


def case_bytes(op: str, count: int, dtype: str, group_size: int) -> int:
    """Bytes one rank allocates for a case: its input and its output (sweep/cases.py bind:
    allgather and gather outputs, reduce-scatter and all-to-all inputs hold n chunks)."""
    n, shape, out = group_size, (count,), (count,)
    if op in ("allgather", "gather"):
        out = (count * n,)
    elif op == "reducescatter":
        shape = (count * n,)
    elif op == "alltoall":
        shape = out = (count * n,)
    return (prod(shape) + prod(out)) * dtype_bytes(dtype)


def check_sweep_fits(cases: list, ranks_here: int, available: int | None) -> None:
    """Refuse when the largest case's buffers, on every rank of this host, exceed memory."""
    if available is None or not cases:
        return
    largest = max(cases, key=lambda c: case_bytes(str(c.op), c.count, c.dtype, c.group_size))
    one = case_bytes(str(largest.op), largest.count, largest.dtype, largest.group_size)
    need = one * ranks_here
    if need > available:
        raise UsageError(f"the sweep's largest case ({largest.op} of "
                         f"{format_bytes(largest.size_bytes)}) needs about "
                         f"{format_bytes(need)} of host memory for {ranks_here} rank(s) on "
                         f"this host ({format_bytes(one)} each) but {format_bytes(available)} "
                         "are available; lower -e or --sizes")
