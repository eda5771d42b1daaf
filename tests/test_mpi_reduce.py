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
