"""How 16-bit floats are summed over MPI.

MPI has no standard 16-bit float types. Each element keeps its 2 bytes on the wire, so the
bytes match the pattern's, and the reduction is a real floating-point sum:
- the library's own type with MPI_SUM wherever it has one: MPICH defines MPIX_BFLOAT16 and
  MPIX_C_FLOAT16 in its mpi.h. mpi4py's `MPI.BFLOAT16_T` is null with the mpich wheel, so the
  handle is read from the mpi.h installed with the library (the wheel ships it), only when
  the header's MPICH_VERSION is the loaded library's, and the type is used only after a local
  MPI_SUM on it matched a correctly rounded sum bit for bit. MPICH 5.0's bf16 sum rounds
  exact ties away from zero where a GPU rounds them to even: 1 ulp on about 2% of random
  sums, none on --check's data (small integers); meta.json records the rounding found.
- otherwise (Open MPI's wheel, an MPICH without the type) a user-defined sum over 2-byte
  elements: bf16 widens both operands to fp32, adds, and rounds back to bf16 (round to
  nearest even), as a GPU reduction kernel does; fp16 adds them as IEEE half floats.
User-defined operations run in Python on the host, so they cost more per element than a
built-in sum (measured in benchmarks/mpi_bf16_allreduce.py): which one a run used is in its
meta.json, versions.float16_reductions.
"""

import importlib.metadata
import re
import sys
from pathlib import Path
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


def mpich_header() -> Path | None:
    """The mpi.h installed with the mpich wheel (or beside this Python), if any."""
    candidates = []
    try:
        dist = importlib.metadata.distribution("mpich")
        candidates += [Path(str(dist.locate_file(f))) for f in dist.files or []
                       if f.name == "mpi.h"]
    except importlib.metadata.PackageNotFoundError:
        pass
    candidates += [Path(sys.prefix) / "include" / "mpi.h"]
    return next((p.resolve() for p in candidates if p.is_file()), None)


def header_handles(text: str) -> tuple[dict[str, int], str | None]:
    """The `#define NAME ((MPI_Datatype)0x...)` handles of an mpi.h, and its MPICH_VERSION."""
    handles = {name: int(value, 16) for name, value in re.findall(
        r"#define\s+(MPIX?_\w+)\s+\(\(MPI_Datatype\)\s*(0x[0-9a-fA-F]+)\)", text)}
    version = re.search(r'#define\s+MPICH_VERSION\s+"([^"]+)"', text)
    return handles, version.group(1) if version else None


def _library_mpich_version() -> str | None:
    found = re.match(r"MPICH Version:\s*(\S+)", MPI.Get_library_version())
    return found.group(1) if found else None


def _f32_to_bf16_ties_away(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x8000)) >> 16).astype(np.uint16)


def sum_rounding(datatype: MPI.Datatype, dtype: str) -> str | None:
    """How a local MPI_SUM on `datatype` rounds, checked bit for bit on 4096 sums: "ties to
    even" (the reference sum below, as CUDA's __float2bfloat16), "ties away from zero"
    (MPICH 5.0's bf16, measured: 74 of these 4096 sums are exact ties and go up in
    magnitude), or None when it is neither (then the library's type is not used)."""
    rng = np.random.default_rng(9)
    a32 = rng.standard_normal(4096).astype(np.float32) * 64
    b32 = rng.standard_normal(4096).astype(np.float32)
    if dtype == "bf16":
        a, b = f32_to_bf16(a32), f32_to_bf16(b32)
        wide = bf16_to_f32(a) + bf16_to_f32(b)  # the fp32 sum both roundings start from
        expected = {"ties to even": f32_to_bf16(wide),
                    "ties away from zero": _f32_to_bf16_ties_away(wide)}
    else:
        a, b = a32.astype(np.float16).view(np.uint16), b32.astype(np.float16).view(np.uint16)
        expected = {"ties to even": (a.view(np.float16) + b.view(np.float16)).view(np.uint16)}
    try:
        if datatype.Get_size() != 2:
            return None
        inout = b.copy()
        MPI.SUM.Reduce_local([a, datatype], [inout, datatype])
    except (MPI.Exception, ValueError):
        return None
    return next((name for name, want in expected.items() if np.array_equal(inout, want)), None)


def native_16bit_types() -> dict[str, tuple[MPI.Datatype, str]]:
    """{dtype: (datatype, how found)} of the library's own bf16 and fp16 with an exact SUM."""
    found: dict[str, tuple[MPI.Datatype, str]] = {}
    version = _library_mpich_version()
    header = mpich_header() if version else None
    if header is not None:
        handles, header_version = header_handles(header.read_text(errors="replace"))
        if header_version == version:  # the header of the loaded library, not another's
            for dtype, name in (("bf16", "MPIX_BFLOAT16"), ("fp16", "MPIX_C_FLOAT16")):
                if name in handles:
                    datatype = MPI.Datatype.fromhandle(handles[name])
                    rounding = sum_rounding(datatype, dtype)
                    if rounding is not None:
                        found[dtype] = (datatype, f"native ({name} = {handles[name]:#x} from "
                                                  f"MPICH {version} mpi.h; {rounding})")
    fp16 = getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL)
    if "fp16" not in found and fp16 != MPI.DATATYPE_NULL:
        rounding = sum_rounding(fp16, "fp16")
        if rounding is not None:
            found["fp16"] = (fp16, f"native (MPI.FLOAT16_T; {rounding})")
    return found


class MpiTypes:
    """MPI datatype, numpy storage dtype and sum operation for each pattern dtype."""

    def __init__(self, native: dict[str, tuple[MPI.Datatype, str]] | None = None) -> None:
        native = native_16bit_types() if native is None else native
        self._user_ops: list[MPI.Op] = []
        if "bf16" in native:
            bf16 = (native["bf16"][0], np.uint16, MPI.SUM, native["bf16"][1])
        else:
            bf16 = (MPI.UINT16_T, np.uint16, self._user_op(_sum_bf16),
                    "user-defined sum (fp32 accumulate)")
        if "fp16" in native:
            fp16 = (native["fp16"][0], np.uint16, MPI.SUM, native["fp16"][1])
        else:
            fp16 = (MPI.UINT16_T, np.uint16, self._user_op(_sum_fp16), "user-defined sum")
        self.table: dict[str, tuple[MPI.Datatype, type, MPI.Op, str]] = {
            "bf16": bf16,
            "fp16": fp16,
            "fp32": (MPI.FLOAT, np.float32, MPI.SUM, "native"),
            "int64": (MPI.INT64_T, np.int64, MPI.SUM, "native"),
            "int32": (MPI.INT32_T, np.int32, MPI.SUM, "native"),
            "uint8": (MPI.UINT8_T, np.uint8, MPI.SUM, "native"),
            # gathered, broadcast and sent only (a routing map); reduced, a logical or
            "bool": (MPI.C_BOOL, np.bool_, MPI.LOR, "native"),
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
