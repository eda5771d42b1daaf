"""The sentinel process that ends a rank whose interpreter is stuck (microbench/sentinel.py).

A `sleep` process stands in for the rank: the sentinel either kills it or leaves it alone.
"""

import subprocess
import sys
import time
from pathlib import Path

from microbench.ranks.watchdog import Watchdog


def start_sentinel(victim: subprocess.Popen, timeout: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "microbench.ranks.sentinel", str(victim.pid),
                             str(timeout), "7", "replay"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)


def test_silence_kills_the_rank_and_names_its_last_phase():
    victim = subprocess.Popen(["sleep", "60"])
    sentinel = start_sentinel(victim, 1.0)
    sentinel.stdin.write(b"start-up\ntimed inference 3\n")
    sentinel.stdin.flush()
    started = time.monotonic()
    assert victim.wait(timeout=20) == -9  # SIGKILL
    waited = time.monotonic() - started
    _, err = sentinel.communicate(timeout=10)
    assert sentinel.returncode == 0
    assert 1.0 <= waited < 10, waited
    assert err.decode() == ("infercomm replay: error: rank 7: no progress for 1 s during timed "
                            "inference 3 (the interpreter is stuck in a library call); a rank "
                            "failed or hung, ending the run\n")


def test_heartbeats_keep_the_rank_alive_and_end_of_file_ends_the_sentinel():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        sentinel = start_sentinel(victim, 1.0)
        for _ in range(6):  # 3 s of heartbeats, three times the timeout
            sentinel.stdin.write(b"decode\n")
            sentinel.stdin.flush()
            time.sleep(0.5)
        sentinel.stdin.close()
        assert sentinel.wait(timeout=10) == 0
        assert sentinel.stderr.read() == b""
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


def test_watchdog_stop_ends_its_sentinel():
    watchdog = Watchdog(30, 0).start()
    sentinel = watchdog._sentinel
    assert sentinel is not None and sentinel.poll() is None
    watchdog.stop()
    assert sentinel.returncode == 0


def test_a_sentinel_told_so_writes_to_the_rank_s_stderr_and_holds_none_of_its_own():
    # SAY = "rank": the message goes through /proc/PID/fd/2 to the rank's stderr pipe, and the
    # sentinel's own stderr stays empty.
    victim = subprocess.Popen(["sleep", "60"], stderr=subprocess.PIPE)
    sentinel = subprocess.Popen([sys.executable, "-m", "microbench.ranks.sentinel",
                                 str(victim.pid), "1", "3", "replay", "rank"],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    sentinel.stdin.write(b"prefill\n")
    sentinel.stdin.flush()
    assert victim.wait(timeout=20) == -9
    _, own = sentinel.communicate(timeout=10)
    assert own == b""
    assert victim.stderr.read().decode() == (
        "infercomm replay: error: rank 3: no progress for 1 s during prefill (the interpreter "
        "is stuck in a library call); a rank failed or hung, ending the run\n")


HOLDS = """
import os, sys, time
from microbench.ranks.watchdog import Watchdog
watchdog = Watchdog(30, 0).start()
pid = watchdog._sentinel.pid
time.sleep(0.5)
mine = {os.readlink(f"/proc/self/fd/{n}") for n in (1, 2)}
held = {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
watchdog.stop()
print(sorted(mine & held), len(mine))
"""


def test_a_rank_s_sentinel_holds_neither_its_stdout_nor_its_stderr():
    # Hydra took a killed rank's output held open by its sentinel for a live rank and named
    # another rank as the one that failed (microbench/ranks/sentinel.py).
    proc = subprocess.run([sys.executable, "-c", HOLDS], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[] 2", proc.stdout  # two pipes, neither shared
