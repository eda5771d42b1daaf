"""In-place MPI allreduce of bf16: the library's MPIX_BFLOAT16 with MPI_SUM against the
user-defined Python sum (the fallback), 2 ranks, 8 KiB and 1 MiB (issue 9, item 11).

    python benchmarks/mpi_bf16_allreduce.py          (starts itself under mpiexec -n 2)
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SIZES = (8 << 10, 1 << 20)


def main() -> None:
    import numpy as np
    from mpi4py import MPI

    from microbench.backends.mpi_reduce import MpiTypes

    comm = MPI.COMM_WORLD
    native, fallback = MpiTypes(), MpiTypes(native={})
    results = {}
    for size in SIZES:
        count = size // 2
        iters = 2000 if size < (1 << 16) else 100
        for name, types in (("native", native), ("user-defined", fallback)):
            buf = np.zeros(count, dtype=np.uint16)  # 0 + 0 stays 0: no overflow to inf
            spec = [buf, types.mpi_type("bf16")]
            op = types.sum_op("bf16")
            for _ in range(iters // 10):  # warm-up
                comm.Allreduce(MPI.IN_PLACE, spec, op)
            samples = []
            for _ in range(5):
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    comm.Allreduce(MPI.IN_PLACE, spec, op)
                samples.append((time.perf_counter() - start) / iters * 1e6)
            worst = comm.allreduce(sorted(samples)[len(samples) // 2], op=MPI.MAX)
            results[f"{name} {size // 1024} KiB"] = round(worst, 2)
    if comm.Get_rank() == 0:
        print(f"MPI: {MPI.Get_library_version().splitlines()[0]}; bf16 native = "
              f"{native.reductions()['bf16']}")
        for key, us in results.items():
            print(f"  in-place allreduce bf16, 2 ranks, {key:>20}: {us:10.2f} us")
        print(json.dumps(results))


if __name__ == "__main__":
    if "PMI_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        sys.exit(subprocess.call([str(mpiexec), "-n", "2", sys.executable, *sys.argv],
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}))
    main()
