"""The sentinel process that ends a rank whose interpreter is stuck (microbench/sentinel.py).

A `sleep` process stands in for the rank: the sentinel either kills it or leaves it alone.
"""

import subprocess
import sys
import time

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
