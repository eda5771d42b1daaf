"""bf16 on MPI: widening and round-to-nearest-even narrowing, checked bit by bit."""

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from microbench.backends.mpi_reduce import bf16_to_f32, f32_to_bf16


def test_round_to_nearest_even():
    # bf16 keeps 7 mantissa bits. 1.0 = 0x3F80. 1 + 2^-8 lies halfway between 0x3F80 and
    # 0x3F81: ties go to the even one, 0x3F80. 1 + 3*2^-8 lies halfway between 0x3F81 and
    # 0x3F82: ties to even, 0x3F82. 1 + 2^-8 + 2^-16 is above halfway: 0x3F81.
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-16, -2.0],
                      dtype=np.float32)
    assert f32_to_bf16(values).tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC000]


def test_small_integers_round_trip_exactly():
    ints = np.arange(0, 257, dtype=np.float32)
    assert np.array_equal(bf16_to_f32(f32_to_bf16(ints)), ints)


# --- the library's own 16-bit types (issue 9, item 11) ---

def _mpich() -> bool:
    from mpi4py import MPI
    return MPI.Get_library_version().startswith("MPICH")


def test_handles_are_read_from_an_mpi_header():
    from microbench.backends.mpi_reduce import header_handles
    text = ('#define MPICH_VERSION "9.9.9"\n'
            "#define MPIX_C_FLOAT16    ((MPI_Datatype)0x4c000246)\n"
            "#define MPIX_BFLOAT16     ((MPI_Datatype)0x4c00024c)\n")
    handles, version = header_handles(text)
    assert version == "9.9.9"
    assert handles["MPIX_BFLOAT16"] == 0x4C00024C and handles["MPIX_C_FLOAT16"] == 0x4C000246


@pytest.mark.skipif(not _mpich(), reason="the loaded MPI is not MPICH")
def test_bf16_and_fp16_sum_with_mpichs_own_types():
    from mpi4py import MPI

    from microbench.backends.mpi_reduce import MpiTypes, mpich_header
    assert mpich_header() is not None  # the mpich wheel installs include/mpi.h
    types = MpiTypes()
    reductions = types.reductions()
    assert reductions["bf16"].startswith("native (MPIX_BFLOAT16"), reductions
    assert reductions["fp16"].startswith("native"), reductions
    assert types.sum_op("bf16") == MPI.SUM and types.mpi_type("bf16") != MPI.UINT16_T
    # 5.4375 (0x40AE) + 1.640625 (0x3FD2) = 7.078125 = 0x40E28000 in fp32: an exact tie
    # between bf16 0x40E2 and 0x40E3, which MPICH 5.0 rounds away from zero (0x40E3) and a
    # GPU to even (0x40E2): recorded, since the two differ by 1 ulp on such sums.
    a, b = np.array([0x40AE], dtype=np.uint16), np.array([0x3FD2], dtype=np.uint16)
    MPI.SUM.Reduce_local([a, types.mpi_type("bf16")], [b, types.mpi_type("bf16")])
    assert int(b[0]) in (0x40E2, 0x40E3)
    assert ("ties away from zero" in reductions["bf16"]) == (int(b[0]) == 0x40E3)
    # small integers, as --check writes them, sum exactly: 3 + 4 = 7
    x, y = types.to_storage("bf16", np.array([3.0])), types.to_storage("bf16", np.array([4.0]))
    MPI.SUM.Reduce_local([x, types.mpi_type("bf16")], [y, types.mpi_type("bf16")])
    assert types.from_storage("bf16", y).tolist() == [7.0]


def test_without_a_native_type_the_user_defined_sum_is_the_fallback():
    from mpi4py import MPI

    from microbench.backends.mpi_reduce import MpiTypes
    types = MpiTypes(native={})  # as with Open MPI's wheel, which ships no bf16 type
    assert types.reductions() == {"bf16": "user-defined sum (fp32 accumulate)",
                                  "fp16": "user-defined sum"}
    assert types.sum_op("bf16") != MPI.SUM
