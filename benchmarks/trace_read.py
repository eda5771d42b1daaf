"""Reading a large NCCL COLL log: rate in lines/s and peak memory, against a bare read loop.

    python benchmarks/trace_read.py [--gib 1.0] [--stamps]

Writes a log of about `--gib` GiB into a temporary file, streaming (NCCL v2.27 format,
src/enqueue.cc:2419: 8 processes of a TP8 vLLM-like run, 65 all-reduces and a gather a step,
with a TUNING and a channel line every 66 calls), reads it with the bare loop and with the
reader (`patterns.traces.read_traces`, then the summary rows and the steps found, as
`infercomm trace` does), deletes it, and prints the figures; the last line is one JSON object.
Peak RSS is the process's maximum resident set (resource.getrusage): the reader keeps 4 bytes
a call, never the lines.
"""

import argparse
import json
import os
import platform
import resource
import tempfile
import time

from patterns.traces import read_traces
from patterns.traces.summary import steps_found, trace_rows

COLL = ("%s:%d:%d [%d] NCCL INFO %s: opCount %x sendbuff 0x7f3a4c000000 recvbuff "
        "0x7f3a4c000000 count %d datatype 9 op 0 root %d comm 0x55d0c0a0%02x [nranks=8] "
        "stream 0x55d0c1b2c3d0\n")
OTHER = ("%s:%d:%d [%d] NCCL INFO AllReduce: 8192 Bytes -> Algo RING proto LL "
         "channel{Lo..Hi}={0..1}\n%s:%d:%d [%d] NCCL INFO Channel 00/24 :    0   1   2   3\n")


def write_log(path: str, target_bytes: int, stamps: bool = False) -> int:
    """Write steps of 8 ranks until the file reaches `target_bytes`; return its lines.
    With `stamps`, every line starts with its own microsecond timestamp (as a launcher that
    stamps lines writes it), so that no two call lines share their prefix."""
    lines = written = 0
    opcount = 0
    with open(path, "w", buffering=1 << 20) as f:
        while written < target_bytes:
            chunk = []
            for rank in range(8):
                pid = 4000 + rank
                for _ in range(65):
                    chunk.append(COLL % ("gpu-node", pid, pid + 3, rank, "AllReduce", opcount,
                                         4096, 0, rank))
                op = "Recv" if rank == 0 else "Send"
                chunk.append(COLL % ("gpu-node", pid, pid + 3, rank, op, opcount, 16032, 0,
                                     rank))
                chunk.append(OTHER % ("gpu-node", pid, pid + 3, rank, "gpu-node", pid,
                                      pid + 3, rank))
                lines += 66 + 2
            opcount += 1
            if stamps:
                chunk = [f"[{lines:012d}.{i:06d}] " + text for i, text in enumerate(chunk)]
            text = "".join(chunk)
            f.write(text)
            written += len(text)
    return lines


def bare_read(path: str) -> int:
    lines = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for _ in f:
            lines += 1
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--stamps", action="store_true",
                        help="a timestamp of its own before every line (the reader's slower "
                             "path: no two call lines share a prefix)")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    fd, path = tempfile.mkstemp(suffix=".log", prefix="infercomm-nccl-")
    os.close(fd)
    try:
        start = time.perf_counter()
        lines = write_log(path, int(args.gib * (1 << 30)), args.stamps)
        size = os.path.getsize(path)
        print(f"wrote {size / (1 << 30):.2f} GiB, {lines:,} lines in "
              f"{time.perf_counter() - start:.1f} s")
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        assert bare_read(path) == lines
        bare_s = time.perf_counter() - start
        start = time.perf_counter()
        trace = read_traces([path])
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        rows = trace_rows(trace)
        steps = steps_found(trace)
        summary_s = time.perf_counter() - start
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    finally:
        os.unlink(path)
    figures = {
        "benchmark": "trace_read", "stamps": args.stamps,
        "file_gib": round(size / (1 << 30), 3), "lines": lines,
        "calls": trace.calls, "unparsed": trace.unparsed,
        "bare_lines_per_s": round(lines / bare_s), "reader_lines_per_s": round(lines / read_s),
        "reader_vs_bare": round(read_s / bare_s, 2), "summary_s": round(summary_s, 2),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "rss_before_read_mib": round(rss_before / 1024, 1),
        "rows": len(rows), "steps_rank0": steps[0].steps,
    }
    print(f"bare loop: {figures['bare_lines_per_s']:,} lines/s; reader: "
          f"{figures['reader_lines_per_s']:,} lines/s ({figures['reader_vs_bare']}x the bare "
          f"loop's time); summary and steps {summary_s:.1f} s; peak RSS "
          f"{figures['peak_rss_mib']} MiB")
    print(json.dumps(figures, separators=(",", ":")))


if __name__ == "__main__":
    main()
