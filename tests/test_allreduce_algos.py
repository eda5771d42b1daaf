"""--allreduce-algo: the schedules, and every algorithm run for real over MPI and gloo.

The multi-rank cases are one launch per (backend, world): tests/allreduce_algo_ranks.py
loops over the algorithms (hierarchical on every placement), the group sizes, sizes from
1 element to 8 MiB (odd counts, fewer elements than ranks) and bf16/fp32 inside.
"""

import json
import os
import subprocess
import sys
import threading
import types
from collections import defaultdict
from pathlib import Path
from queue import Queue

import numpy as np
import pytest

from microbench.algorithms.execute import _live, nccl_call
from microbench.algorithms.schedules import Step, node_layout, schedule, split
from microbench.ranks.launch import free_port

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
ALGOS = ("ring", "recursive-doubling", "rabenseifner", "hierarchical")


def simulate(algo: str, n: int, numel: int, nodes: list[int] | None = None) -> list[np.ndarray]:
    """Run every rank's schedule on numpy vectors; messages queue per (sender, receiver) and
    must arrive with the count the receiver expects."""
    bufs = [(np.arange(numel) % 7) + g + 1.0 for g in range(n)]
    steps = [_live(schedule(algo, n, r, numel, nodes)) for r in range(n)]
    boxes: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    at, sent = [0] * n, [False] * n
    moved = True
    while moved:
        moved = False
        for r in range(n):
            while at[r] < len(steps[r]):
                st = steps[r][at[r]]
                if st.send_to is not None and not sent[r]:
                    s0, sc = st.send
                    boxes[(r, st.send_to)].append(bufs[r][s0:s0 + sc].copy())
                    sent[r] = True
                if st.recv_from is not None:
                    box = boxes[(st.recv_from, r)]
                    if not box:
                        break
                    data = box.pop(0)
                    r0, rc = st.recv
                    assert data.size == rc, (algo, n, numel, r, st)
                    bufs[r][r0:r0 + rc] = bufs[r][r0:r0 + rc] + data if st.reduce else data
                at[r] += 1
                sent[r] = False
                moved = True
    assert at == [len(s) for s in steps], f"{algo} on {n} ranks stalls"
    assert not any(boxes.values()), "messages nobody received"
    return bufs


@pytest.mark.parametrize("algo", ALGOS)
def test_every_schedule_sums_on_1_to_16_ranks(algo):
    for n in range(1, 17):
        for numel in (1, 2, 3, 5, 8, 13, 101):
            want = n * (np.arange(numel) % 7) + n * (n + 1) / 2  # sum of (i%7)+g+1, g<n
            for got in simulate(algo, n, numel):
                assert np.array_equal(got, want), (algo, n, numel)


def test_hierarchical_on_several_nodes_and_interleaved_placements():
    for nodes in ([0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2],
                  [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]):
        n = len(nodes)
        for numel in (1, 5, 17, 100):
            want = n * (np.arange(numel) % 7) + n * (n + 1) / 2
            for got in simulate("hierarchical", n, numel, nodes):
                assert np.array_equal(got, want), (nodes, numel)
    with pytest.raises(ValueError, match="same number"):
        node_layout([0, 0, 1])


def test_step_counts_and_chunks_hand_computed():
    # ring on 4 ranks, 10 elements: chunks 3,3,2,2; 3 reduce-scatter + 3 all-gather steps
    assert split((0, 10), 4) == [(0, 3), (3, 3), (6, 2), (8, 2)]
    steps = schedule("ring", 4, 0, 10)
    assert len(steps) == 6 and [s.reduce for s in steps] == [True] * 3 + [False] * 3
    assert steps[0] == Step(1, (0, 3), 3, (8, 2), True)  # send chunk 0, receive chunk 3
    # recursive doubling on 5 ranks (p'=4, r=1): rank 0 sends its vector to 1 and waits;
    # rank 1 receives, runs log2(4) = 2 exchanges, sends the result back: 4 steps
    assert [(s.send_to, s.recv_from) for s in schedule("recursive-doubling", 5, 0, 8)] == [
        (1, None), (None, 1)]
    assert [(s.send_to, s.recv_from) for s in schedule("recursive-doubling", 5, 1, 8)] == [
        (None, 0), (2, 2), (3, 3), (0, None)]
    # rabenseifner on 4 ranks, 8 elements (2 a chunk): halving to distance 2 then 1, keeping
    # 4 then 2 elements; doubling back: rank 0 gets chunk 1 from rank 1, then 2-3 from 2
    steps = schedule("rabenseifner", 4, 0, 8)
    assert [(s.send_to, s.send, s.recv) for s in steps] == [
        (2, (4, 4), (0, 4)), (1, (2, 2), (0, 2)), (1, (0, 2), (2, 2)), (2, (0, 4), (4, 4))]
    # hierarchical, 2 nodes of 2: ring RS (1 step), RD of the shard across (1), ring AG (1)
    steps = schedule("hierarchical", 4, 0, 8, [0, 0, 1, 1])
    assert [(s.send_to, s.recv_from, s.local) for s in steps] == [
        (1, 1, True), (2, 2, False), (1, 1, True)]
    assert steps[1].send == (4, 4)  # rank 0 holds chunk (0 + 1) % 2 after the ring RS


def _launch(backend: str, world: int, groups: str, out_dir: Path) -> None:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(MPIEXEC), "-n", str(world), sys.executable, "-m",
                          "tests.allreduce_algo_ranks", backend, groups, str(out_dir)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
                         check=False)
    lines = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]
    assert out.returncode == 0 and len(lines) == world, out.stderr[-3000:]
    failures = [f for line in lines for f in line["failures"]]
    assert not failures, failures[:10]


@pytest.mark.mpi
@pytest.mark.parametrize(("world", "groups"), [(2, "2"), (3, "3"), (5, "5"), (8, "4,8")])
def test_every_algorithm_over_mpi(world, groups, tmp_path):
    _launch("mpi", world, groups, tmp_path)


@pytest.mark.mpi  # mpiexec starts the gloo ranks too (one start for every group size)
def test_every_algorithm_over_gloo_on_groups_of_2_3_4_5_8(tmp_path):
    _launch("torch", 8, "2,3,4,5,8", tmp_path)


# --- NCCL through CuPy: the executor against a stand-in of ncclSend/ncclRecv ---

class _FakeNccl:
    """ncclGroupStart/End and a communicator per rank over thread queues: sends are queued
    at groupEnd (bytes copied from the pointer), receives block for theirs and must match
    its size, as NCCL's pairing of a group's sends and receives does."""

    def __init__(self, n: int) -> None:
        self.queues = {(a, b): Queue() for a in range(n) for b in range(n)}
        self.local = threading.local()

    def groupStart(self) -> None:
        self.local.parts = []

    def groupEnd(self) -> None:
        parts, self.local.parts = self.local.parts, None
        for kind, me, peer, ptr, nbytes in parts:
            if kind == "send":
                self.queues[(me, peer)].put(bytes(np.ctypeslib.as_array(
                    (np.ctypeslib.ctypes.c_uint8 * nbytes).from_address(ptr))))
        for kind, me, peer, ptr, nbytes in parts:
            if kind == "recv":
                data = self.queues[(peer, me)].get(timeout=10)
                assert len(data) == nbytes
                np.ctypeslib.ctypes.memmove(ptr, data, nbytes)

    def comm(self, rank: int, itemsize: int) -> object:
        nccl = self

        class Comm:
            def send(self, ptr, count, dt, peer, stream):
                nccl.local.parts.append(("send", rank, peer, ptr, count * itemsize))

            def recv(self, ptr, count, dt, peer, stream):
                nccl.local.parts.append(("recv", rank, peer, ptr, count * itemsize))
        return Comm()


class _Buf:
    def __init__(self, array: np.ndarray, dtype: str) -> None:
        self.array, self.dtype = array, dtype
        self.ptr, self.numel = array.ctypes.data, array.size


@pytest.mark.parametrize("algo", ALGOS)
def test_nccl_executor_pointers_counts_and_groups(algo):
    n, numel = 5, 23
    nccl = _FakeNccl(n)
    results: list[np.ndarray | None] = [None] * n

    def add(dst, start, src, count, dtype):  # the stand-in of the CuPy kernel
        dst[start:start + count] += src[:count]

    def rank(r: int) -> None:
        backend = types.SimpleNamespace(
            _nccl=nccl, stream=types.SimpleNamespace(ptr=1), _types={"fp32": 7},
            empty=lambda k, d: _Buf(np.zeros(k, np.float32), d))
        group = types.SimpleNamespace(handle=nccl.comm(r, 4))
        buf = _Buf((np.arange(numel) % 7 + r + 1).astype(np.float32), "fp32")
        nodes = [0, 1, 2, 3, 4]  # hierarchical: five nodes of one rank
        nccl_call(backend, group, buf, schedule(algo, n, r, numel, nodes), add=add)()
        results[r] = buf.array

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    want = n * (np.arange(numel) % 7) + 15  # 5 (i % 7) + (1 + 2 + 3 + 4 + 5)
    for got in results:
        assert got is not None and np.array_equal(got, want)


def test_hierarchical_on_uneven_nodes_is_refused_before_any_rank(tmp_path):
    from tests.replay_helpers import infercomm

    proc, _ = infercomm("sweep", "--backend", "mpi", "--nproc", "4", "--sizes", "8K",
                        "--allreduce-algo", "hierarchical", "--ranks-per-node", "3",
                        "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "infercomm sweep: error: --allreduce-algo hierarchical needs the same number of ranks "
        "on every node; 4 ranks at --ranks-per-node 3 leave 1 on the last; use a divisor of 4"]
    # replay without --nproc: the pattern's world (TP4) is the one split
    proc, _ = infercomm("replay", "--backend", "mpi", "--model", "llama-3.2-1b", "--tp", "4",
                        "--prompt", "8", "--decode", "2", "--allreduce-algo", "hierarchical",
                        "--ranks-per-node", "3", "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "4 ranks at --ranks-per-node 3 leave 1 on the last" in proc.stderr


def test_hierarchical_within_one_node_is_not_refused():
    import argparse

    from microbench.algorithms.args import check_algo_options
    # 2 ranks at 3 a node: one node holding both, nothing uneven
    check_algo_options(argparse.Namespace(allreduce_algo="hierarchical", ranks_per_node=3,
                                          nproc=None), world=2)


@pytest.mark.mpi
def test_sweep_check_and_meta_name_the_algorithm(tmp_path):
    from tests.conftest import last_json
    from tests.replay_helpers import infercomm

    proc, _ = infercomm("sweep", "--backend", "mpi", "--nproc", "2", "--sizes", "6,8K",
                        "--allreduce-algo", "rabenseifner", "-c", "-n", "2", "-w", "1",
                        "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = last_json(proc.stdout)
    assert summary["wrong"] == 0
    meta = json.loads((Path(summary["results_dir"]) / "meta.json").read_text())
    assert meta["versions"]["allreduce_algo"] == "rabenseifner"
    assert meta["versions"]["allreduce_algo_nodes"] == [0, 0]  # both ranks on this host
    # issue 34: named in the header, the last line and the folder's name as well
    assert summary["allreduce_algo"] == "rabenseifner"
    assert summary["results_dir"].endswith("-w2-rabenseifner")
    assert "all-reduce: rabenseifner" in proc.stdout.splitlines()[0]


def test_compare_names_the_algorithm_that_differs():
    from microbench.analysis.differences import facts

    def run(versions):
        return types.SimpleNamespace(meta={"versions": versions, "hosts": ["h"]})
    # a run made with the library's own all-reduce records no algorithm
    assert facts(run({}))["all-reduce algorithm"] == "library"
    assert facts(run({"allreduce_algo": "ring"}))["all-reduce algorithm"] == "ring"


def test_compare_names_the_gather_path_of_the_two_nccl_backends():
    # GPU review R13: torch's ProcessGroupNCCL and the nccl backend's grouped send/recv may
    # run different gather/all-to-all algorithms; a comparison of the two says so.
    from microbench.analysis.differences import differences

    def run(versions):
        return types.SimpleNamespace(meta={"versions": versions, "hosts": ["h"]})
    torch_run = run({"nccl": "2.28.3", "gather_alltoall": "ProcessGroupNCCL"})
    nccl_run = run({"nccl": "2.28.3", "gather_alltoall": "grouped send/recv"})
    assert differences([torch_run], [nccl_run]) == [
        {"what": "gather/all-to-all", "a": "ProcessGroupNCCL", "b": "grouped send/recv"}]
    assert differences([torch_run], [torch_run]) == []
