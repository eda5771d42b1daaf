"""The host buffers MPI and the KV transports send from are written memory: a send from a
buffer nobody wrote reads the kernel's zero page (backends/host_memory.written_zeros)."""

import os

import numpy as np
import pytest

from microbench.backends.host_memory import written_zeros

SIZE = 64 << 20  # above glibc's largest mmap threshold (32 MiB): always fresh pages


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="no /proc (Linux only)")
def test_every_page_of_a_buffer_is_resident():
    # The premise: numpy's zeros of 64 MiB maps pages it never touches (calloc from mmap),
    # so the process's resident memory grows by far less than 64 MiB.
    before = _resident_bytes()
    untouched = np.zeros(SIZE, dtype=np.uint8)
    assert _resident_bytes() - before < SIZE // 4
    # written_zeros writes each page: resident memory grows by the whole 64 MiB.
    before = _resident_bytes()
    buffer = written_zeros(SIZE // 4, np.float32)  # 16 Mi fp32 = 64 MiB
    assert _resident_bytes() - before >= SIZE * 0.95
    assert buffer.nbytes == SIZE and not buffer.any() and not untouched.any()
