"""How a rank that failed ends: without the destructors that can block on a GPU.

After a failure on a CUDA device, the frame's communicators would be freed on the way out:
CuPy's NcclCommunicator.__dealloc__ calls ncclCommDestroy (cupy_backends/cuda/libs/nccl.pyx
@ v14.2.0), and torch's ProcessGroupNCCL destructor finalizes its communicators; both wait
for every graph that captured them and for kernels still spinning on a dead peer
(commDestroySync / ncclCommPollEventCallbacks, NVIDIA/nccl src/init.cc @ 5067397c). With the
rank's own watchdog already stopped, nothing would end that wait. So once the failure is
reported, such a rank leaves through os._exit, with its output flushed.
"""

import os
import sys
from typing import NoReturn


def destructors_may_block(backend: str, device: str | None) -> bool:
    """NCCL communicators on a CUDA device: the nccl backend, or torch over NCCL."""
    return device == "cuda" and backend in ("nccl", "torch")


def exit_now(status: int) -> NoReturn:
    """Flush what the rank said, then end the process without running destructors."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)
