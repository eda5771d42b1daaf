"""`plan` at any scale and under a battery (issues 40 and 42): node spanning counted, not
enumerated; bounds on --gpus-per-node and --gpus refused at once in one line; a stdout that
cannot take the plan; progress on stderr while a large --requests is priced, and Ctrl-C to it
ending at once with 130. Speed itself is measured in benchmarks/plan_layouts.py and
plan_workload.py."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from microbench.analysis.costs import groups_at, spans_at
from patterns import Layout
from patterns.groups import rank_of
from tests.replay_helpers import infercomm

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "results" / "examples" / "plan-sweeps"
INTRA, INTER = next(SWEEPS.glob("*-intra-shm")), next(SWEEPS.glob("*-inter-veth-1gbit"))
PLAN = ("plan", "--sweep", str(INTRA), "--sweep-inter", str(INTER), "--model",
        "llama-3.1-8b", "--prompt", "128", "--decode", "16")


def _spans(groups, rpn):
    return any(len({r // rpn for r in g}) > 1 for g in groups)


def test_spanning_is_counted_as_the_groups_enumerate_it():
    # Every layout of up to 3 x 5 x 8 ranks, every node size up to 16, every group kind and
    # (DP rank, stage), and every stage pair's transfers: the count agrees with the groups.
    checked = 0
    for rpn in (1, 2, 3, 4, 6, 8, 16):
        for tp in (1, 2, 3, 4, 8):
            for pp in (1, 2, 3, 5):
                for dp in (1, 2, 3, 7):
                    layout = Layout(tp=tp, pp=pp, dp=dp)
                    for d in range(dp):
                        for s in range(pp):
                            for kind in ("tp", "dp", "ep", "pp", "pp_broadcast"):
                                assert spans_at(layout, kind, d, s, rpn) == _spans(
                                    groups_at(layout, kind, d, s), rpn), (rpn, layout, kind)
                                checked += 1
                            for peer in range(pp):
                                pairs = [[rank_of(layout, d, s, t), rank_of(layout, d, peer, t)]
                                         for t in range(tp)]
                                assert spans_at(layout, "pp", d, s, rpn, peer) == _spans(
                                    pairs, rpn)
                                checked += 1
    assert checked > 10_000


@pytest.mark.parametrize("argv, message", [
    (("--gpus", "1", "--gpus-per-node", "8"),
     "--gpus 1 is less than one node of --gpus-per-node 8; give --gpus-per-node 1"),
    (("--gpus", "65536", "--gpus-per-node", "65536"),
     "--gpus-per-node 65,536 is beyond any node"),
])
def test_counts_no_deployment_has_are_refused_at_once(argv, message):
    proc, _ = infercomm(*PLAN, *argv, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_a_stdout_that_cannot_take_the_plan_is_one_line():
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "microbench", *PLAN, "--gpus", "8",
                               "--gpus-per-node", "8"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("infercomm plan: error: cannot write the plan to stdout: No "
                                   "space left on device; free some space or send it "
                                   "elsewhere")


def test_a_large_workload_says_how_far_it_is_and_ends_at_ctrl_c():
    # 100,000 requests over 64 GPUs: priced for tens of seconds; a line on stderr every 2 s
    # says how far it is; SIGINT (Ctrl-C) ends it within 2 s, one line, status 130.
    requests = "poisson:rate=50,count=100000,prompt=100..2000,output=10..500,seed=1"
    proc = subprocess.Popen([sys.executable, "-m", "microbench", *PLAN, "--gpus", "64",
                             "--gpus-per-node", "8", "--requests", requests, "--step-time-ms",
                             "30", "--format", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stderr.readline()  # the first progress line (blocks until it comes)
        assert "layouts priced" in line and "s so far" in line, line
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - start < 2.0
    finally:
        proc.kill()
    assert proc.returncode == 130 and out == "" and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "infercomm plan: interrupted"


def test_a_workload_too_costly_to_price_is_refused_before_it_is_read():
    # 1,000,000 requests over 1,024 GPUs (405B's layouts: 8 arrangements of tp and dp x pp,
    # tp 1, 2, 4, ..., 128, the heads' divisors, each with dp x pp = 1,024 / tp): 8,000,000
    # request-arrangements x 40 us = 320 s of CPU, over the 300 s plan prices.
    proc, _ = infercomm("plan", "--sweep", str(INTRA), "--sweep-inter", str(INTER),
                        "--model", "llama-3.1-405b", "--gpus", "1024", "--gpus-per-node", "8",
                        "--requests",
                        "poisson:rate=50,count=1000000,prompt=100..2000,output=10..500,seed=1",
                        "--step-time-ms", "30", timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "would take about 320 s of CPU" in proc.stderr
