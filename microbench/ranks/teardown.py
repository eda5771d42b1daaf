"""How a rank that failed ends: without the destructors that can block on a GPU.

After a failure on a CUDA device, the frame's communicators would be freed on the way out:
CuPy's NcclCommunicator.__dealloc__ calls ncclCommDestroy (cupy_backends/cuda/libs/nccl.pyx
@ v14.2.0), and torch's ProcessGroupNCCL destructor finalizes its communicators; both wait
for every graph that captured them and for kernels still spinning on a dead peer
(commDestroySync / ncclCommPollEventCallbacks, NVIDIA/nccl src/init.cc @ 5067397c). With the
rank's own watchdog already stopped, nothing would end that wait. So once the failure is
reported, such a rank leaves through os._exit, with its output flushed.
"""

import contextlib
import os
import sys
from typing import NoReturn


def destructors_may_block(backend: str, device: str | None) -> bool:
    """NCCL communicators on a CUDA device: the nccl backend, or torch over NCCL."""
    return device == "cuda" and backend in ("nccl", "torch")


def exit_now(status: int) -> NoReturn:
    """Flush what the rank said, then end the process without running destructors."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()  # a closed, full or absent stream: nothing more can be said
    os._exit(status)


def exit_past_library_destructors(status: int) -> NoReturn:
    """End a rank whose work is done and written without the shared libraries' ELF
    destructors, MPI finalized first where this rank initialized it.

    Why: with Debian's ibverbs-providers (rdma-core) installed, UCX's InfiniBand module in
    nixl-cu12 1.5.1 loads the system's verbs providers, which link the system's
    libnl-route-3.so.200 beside the copy bundled in the wheel; at exit `_dl_fini` runs
    libnl-route's destructor (`rtnl_tc_unregister`) and the process dies of SIGSEGV after
    the results were written (gdb: rtnl_tc_unregister <- _dl_call_fini <- _dl_fini <- exit;
    exit 139 in 3 of 3 replays with the providers installed, 0 of 3 without). Nothing after
    the rank's last flush needs those destructors: the transport and the process group are
    closed explicitly before this is called."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()  # mpi4py's atexit would; the launcher waits for every rank's
    exit_now(status)
