"""`replay --disagg ... --kv-transport mooncake` and `sweep --op kvtransfer --kv-transport
mooncake`: real bytes through Mooncake's transfer engine over TCP on loopback, between ranks
started as a user starts them, checked at the receiver; a dead peer ends the run; bad input
refused in one line before any rank starts.

Where Mooncake cannot run here (the wheel, or the RDMA libraries its engine.so links even for
TCP, is missing), each test skips with the one line `infercomm` itself would print.
"""

import builtins
import json
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.argtypes import UsageError
from microbench.backends import mooncake_transport
from microbench.backends.mooncake_transport import engine_address, import_mooncake, rdma_devices
from tests.replay_helpers import infercomm, last_json, tiny_model


def _missing() -> str:
    """What `infercomm` would say is missing, asked of a child process: Mooncake's engine.so
    (and its libraries) stay out of pytest's own process."""
    probe = subprocess.run(
        [sys.executable, "-c", "from microbench.backends.mooncake_transport import "
         "import_mooncake\ntry:\n    import_mooncake()\nexcept Exception as err:\n"
         "    print(err)"], capture_output=True, text=True, timeout=60, check=False)
    said = (probe.stdout.strip() or probe.stderr.strip()).splitlines()
    if not said:
        return ""
    return (f"{said[-1]} (make test installs the libraries where INFERCOMM_INSTALL_RDMA_LIBS=1, "
            "as .ci/run does)")


MISSING = _missing()
needs_mooncake = pytest.mark.skipif(bool(MISSING), reason=MISSING)

# tiny (tests/replay_helpers): 4 layers, 4 KV heads of 16 dims, bf16; SGLang's pages of 1.
# Prompt 20, tp1 -> tp2: each decode rank takes 2 heads, 2 x 32 = 64 bytes a token slice, a
# slice a token, layer and K or V: 20 x 4 x 2 = 160 descriptors a pair, 320 in all, 20,480
# bytes (20 tokens x 4 layers x 2 x 4 heads x 32 bytes), in 8 batches a pair.
DISAGG = ["--disagg", "prefill=tp1,decode=tp2", "--engine", "sglang"]


def replay(tmp_path, *argv, env=None, timeout=120):
    return infercomm("replay", "--model", tiny_model(tmp_path), "--prompt", "20", "--decode",
                     "4", "-w", "1", "--out", str(tmp_path / "runs"), *argv, env=env,
                     timeout=timeout)


@needs_mooncake
def test_sglang_tp1_to_tp2_over_mooncake_tcp_checked(tmp_path, cli):
    # Control calls over gloo, the default: beside MPICH's ranks Mooncake's larger transfers
    # failed now and then (docs/disaggregated.md).
    proc, _ = replay(tmp_path, *DISAGG, "--kv-transport", "mooncake", "--check", "-n", "3")
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert (last["kv_transport"], last["kv_transfer_bytes"], last["wrong"]) == \
        ("mooncake", 20_480, 0)
    run = Path(last["results_dir"])
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["descriptors"], summary["pairs"], summary["world_size"]) == (320, 2, 3)
    versions = json.loads((run / "meta.json").read_text())["versions"]
    assert versions["mooncake"].startswith("mooncake-transfer-engine")
    assert versions["mooncake_protocol"] == "tcp"
    # Mooncake's own log (glog: "Logging before InitGoogleLogging", its INFO and start-up
    # lines) stays out of the output
    assert "InitGoogleLogging" not in proc.stderr and "transfer_engine" not in proc.stderr
    assert "segment descriptor" not in proc.stderr, proc.stderr
    # report names the library that moved the bytes
    status, _, err = cli("report", str(run), "-o", str(tmp_path / "r.html"))
    assert status == 0, err
    assert f"{versions['mooncake']} (tcp)" in (tmp_path / "r.html").read_text()


@needs_mooncake
def test_kvtransfer_sweep_over_mooncake(tmp_path):
    # One size, 8 descriptors of 1 KiB written by rank 0 (SGLang's direction), one batch,
    # checked byte by byte at rank 1; control over gloo.
    proc, _ = infercomm("sweep", "--op", "kvtransfer", "--backend", "torch", "--kv-transport",
                        "mooncake", "--kv-direction", "write", "--sizes", "1K",
                        "--kv-descriptors", "8", "-n", "3", "-w", "1", "-c", "--out",
                        str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    assert (last["cases"], last["wrong"], last["transport"]) == (1, 0, "mooncake")
    rows = (Path(last["results_dir"]) / "sweep.csv").read_text().splitlines()
    assert rows[1].startswith("kvtransfer,1024,8,uint8,2,")


@needs_mooncake
def test_a_dead_decode_rank_ends_every_rank(tmp_path):
    # tp1 -> tp1 (two ranks, the cheaper launch): the decode rank is killed (SIGKILL) at the
    # second transfer, after its barrier; the prefill rank's next batch to it (its 8 runs: 4
    # layers, K and V) fails (Mooncake returns -1: connection refused) or the launcher sees
    # the death first; either way every rank ends within seconds, not at --timeout 60.
    proc, seconds = replay(tmp_path, "--disagg", "prefill=tp1,decode=tp1", "--engine",
                           "sglang", "--kv-transport", "mooncake", "-n", "50", "--timeout",
                           "60", env={"INFERCOMM_FAULT": "kill:1:2"})
    assert proc.returncode not in (0, 2), proc.stderr
    assert seconds < 45, seconds
    assert "rank 1 ended with signal SIGKILL" in proc.stderr or \
        "batch_transfer_sync_write of 8 blocks to rank 1" in proc.stderr, proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["--mooncake-host", "192.0.2.1"], "--mooncake-host 192.0.2.1 is not an address of this "
                                       "host"),
    (["--mooncake-host", "no-such-host.invalid"], "--mooncake-host no-such-host.invalid does "
                                                  "not resolve"),
    (["--mooncake-protocol", "efa"], "argument --mooncake-protocol: invalid choice: 'efa'"),
])
def test_bad_mooncake_input_one_line(tmp_path, cli, argv, words):
    status, out, err = cli("replay", "--model", tiny_model(tmp_path), "--prompt", "20",
                           "--decode", "4", *DISAGG, "--kv-transport", "mooncake", *argv,
                           "--out", str(tmp_path / "runs"))
    assert (status, out) == (2, "")
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(bool(rdma_devices()), reason="this host has RDMA devices")
def test_rdma_without_a_device_is_refused(tmp_path, cli):
    # Mooncake's engine would fall back to TCP without a word; the run would be TCP's.
    status, out, err = cli("replay", "--model", tiny_model(tmp_path), "--prompt", "20",
                           "--decode", "4", *DISAGG, "--kv-transport", "mooncake",
                           "--mooncake-protocol", "rdma", "--out", str(tmp_path / "runs"))
    assert (status, out) == (2, "")
    assert "--mooncake-protocol rdma: this host has no RDMA device" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, words", [
    (["--kv-transport", "torch", "--mooncake-protocol", "tcp"],
     "--mooncake-protocol act(s) with --kv-transport mooncake"),
    (["--kv-transport", "torch", "--mooncake-host", "127.0.0.1"],
     "--mooncake-host act(s) with --kv-transport mooncake"),
])
def test_mooncake_options_without_mooncake_refused(tmp_path, cli, argv, words):
    status, out, err = cli("replay", "--model", tiny_model(tmp_path), "--prompt", "20",
                           "--decode", "4", *DISAGG, *argv, "--out", str(tmp_path / "runs"))
    assert (status, out) == (2, "")
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_mooncake_options_refused_without_disagg(cli):
    status, _, err = cli("replay", "--model", "llama-3.1-8b", "--tp", "2", "--prompt", "8",
                         "--decode", "2", "--mooncake-protocol", "tcp")
    assert status == 2 and "--mooncake-protocol" in err and "add --disagg" in err


def test_where_each_engine_listens(monkeypatch):
    # one host: loopback, or the address given; several: each host's own address, refused
    # where the name resolves to loopback (Debian's 127.0.1.1) or one address is given for all
    assert engine_address(["a", "a", "a"], None) == "127.0.0.1"
    assert engine_address(["a", "a"], "10.1.2.3") == "10.1.2.3"
    monkeypatch.setattr(mooncake_transport.socket, "gethostname", lambda: "node7")
    monkeypatch.setattr(mooncake_transport.socket, "gethostbyname",
                        lambda name: {"node7": "10.0.0.7"}[name])
    assert engine_address(["node7", "node8"], None) == "10.0.0.7"
    with pytest.raises(UsageError, match="ranks run on 2 hosts; drop it"):
        engine_address(["node7", "node8"], "10.0.0.7")
    monkeypatch.setattr(mooncake_transport.socket, "gethostbyname", lambda name: "127.0.1.1")
    with pytest.raises(UsageError, match=r"node7 resolves to 127\.0\.1\.1, which the others"):
        engine_address(["node7", "node8"], None)


@pytest.mark.parametrize("error, words", [
    # what the dynamic loader says where Debian's libibverbs1 is not installed (seen here
    # with it removed: `apt-get remove libibverbs1`)
    ("libibverbs.so.1: cannot open shared object file: No such file or directory",
     "Mooncake's engine.so needs libibverbs.so.1, which this host lacks (it links the RDMA "
     "libraries even for TCP): apt-get install libibverbs1 librdmacm1 libnuma1"),
    ("No module named 'mooncake'", "pip install 'infercomm[mooncake]'"),
])
def test_what_is_missing_said_in_one_line(monkeypatch, error, words):
    real = builtins.__import__

    def without_mooncake(name, *args, **kwargs):
        if name.startswith("mooncake"):
            raise ImportError(error)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_mooncake)
    with pytest.raises(UsageError) as err:
        import_mooncake()
    assert words in str(err.value) and "\n" not in str(err.value)
