"""Host buffers for the backends that communicate from numpy memory (MPI, the KV transports)."""

from typing import Any

import numpy as np


def written_zeros(numel: int, dtype: Any = np.uint8) -> np.ndarray:
    """Zeros written into every page, not only allocated.

    numpy's zeros of a large array is calloc, whose fresh pages all map the kernel's one zero
    page until written: a send from a buffer nobody wrote reads 4 KiB of always-cached memory
    whatever its size, and whether a buffer got such pages depended on what the process had
    freed before (glibc serves calloc from fresh memory or reused and cleared memory, by its
    own thresholds). On one host a 1 MiB MPI stream message took 33 us from untouched pages
    and 62 us from written ones: a sweep and a replay of the same sizes measured different
    memory. An engine's buffers hold data; OSU's osu_latency and osu_bw "touch the data"
    (set_buffer_pt2pt of each buffer) before each size.
    """
    host = np.empty(numel, dtype=dtype)
    host.fill(0)
    return host
