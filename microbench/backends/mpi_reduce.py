"""How 16-bit floats are summed over MPI.

MPI has no standard 16-bit float types. Each element keeps its 2 bytes on the wire, so the
bytes match the pattern's, and the reduction is a real floating-point sum:
- fp16: the library's own type (MPICH's MPIX_C_FLOAT16, `MPI.FLOAT16_T`) where it has one;
  otherwise a user-defined sum over 2-byte elements that adds them as IEEE half floats.
- bf16: a user-defined sum over 2-byte elements that widens both operands to fp32, adds,
  and rounds back to bf16 (round to nearest even), as a GPU reduction kernel does.
User-defined operations run in Python on the host, so they cost more per element than a
built-in sum: compare MPI bf16 with NCCL bf16 knowing this.
"""

from typing import Any

import numpy as np
from mpi4py import MPI


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    return (rounded >> 16).astype(np.uint16)


def _sum_bf16(inmem: Any, inoutmem: Any, datatype: MPI.Datatype) -> None:
    a = np.frombuffer(inmem, dtype=np.uint16)
    b = np.frombuffer(inoutmem, dtype=np.uint16)
    b[:] = f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b))


def _sum_fp16(inmem: Any, inoutmem: Any, datatype: MPI.Datatype) -> None:
    a = np.frombuffer(inmem, dtype=np.float16)
    b = np.frombuffer(inoutmem, dtype=np.float16)
    np.add(a, b, out=b)


class MpiTypes:
    """MPI datatype, numpy storage dtype and sum operation for each pattern dtype."""

    def __init__(self) -> None:
        native_fp16 = getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL)
        self._user_ops: list[MPI.Op] = []
        bf16_sum = self._user_op(_sum_bf16)
        if native_fp16 != MPI.DATATYPE_NULL:
            fp16 = (native_fp16, np.uint16, MPI.SUM, "native (MPI.FLOAT16_T)")
        else:
            fp16 = (MPI.UINT16_T, np.uint16, self._user_op(_sum_fp16), "user-defined sum")
        self.table: dict[str, tuple[MPI.Datatype, type, MPI.Op, str]] = {
            "bf16": (MPI.UINT16_T, np.uint16, bf16_sum, "user-defined sum (fp32 accumulate)"),
            "fp16": fp16,
            "fp32": (MPI.FLOAT, np.float32, MPI.SUM, "native"),
            "int64": (MPI.INT64_T, np.int64, MPI.SUM, "native"),
            "int32": (MPI.INT32_T, np.int32, MPI.SUM, "native"),
            "uint8": (MPI.UINT8_T, np.uint8, MPI.SUM, "native"),
        }

    def _user_op(self, fn: Any) -> MPI.Op:
        op = MPI.Op.Create(fn, commute=True)
        self._user_ops.append(op)
        return op

    def mpi_type(self, dtype: str) -> MPI.Datatype:
        return self.table[dtype][0]

    def storage(self, dtype: str) -> type:
        return self.table[dtype][1]

    def sum_op(self, dtype: str) -> MPI.Op:
        return self.table[dtype][2]

    def reductions(self) -> dict[str, str]:
        return {dtype: entry[3] for dtype, entry in self.table.items()
                if dtype in ("bf16", "fp16")}

    def to_storage(self, dtype: str, values: np.ndarray) -> np.ndarray:
        if dtype == "bf16":
            return f32_to_bf16(values.astype(np.float32))
        if dtype == "fp16":
            return values.astype(np.float16).view(np.uint16)
        return values.astype(self.storage(dtype))

    def from_storage(self, dtype: str, stored: np.ndarray) -> np.ndarray:
        if dtype == "bf16":
            return bf16_to_f32(stored).astype(np.float64)
        if dtype == "fp16":
            return stored.view(np.float16).astype(np.float64)
        return stored.astype(np.float64)
