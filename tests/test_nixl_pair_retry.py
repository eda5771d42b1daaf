"""scripts/vllm_cpu_nixl.py serves the disaggregated pair again, once, where vLLM's 5 s NIXL
handshake timed out (three workers on two cores sometimes miss it), keeping the first try's
logs; any other outcome is taken as it is. The engines are stood in for: what is checked is
the script's own decision."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import vllm_cpu_nixl  # a script beside the others, not a package

READ = {"pid": 1, "call": "make_prepped_xfer", "op": "READ", "descriptors": 4,
        "bytes": 262144, "sizes": [65536]}


@pytest.fixture
def serve(monkeypatch, tmp_path):
    """run_pair with stand-in engines: each try writes the decode log it is given, and a
    READ record only where the handshake did not fail."""
    logs: list[str] = []
    monkeypatch.setattr(vllm_cpu_nixl, "nixl_package", lambda: tmp_path / "nixl_cu12")
    monkeypatch.setattr(vllm_cpu_nixl, "write_shim", lambda folder, package: None)

    def one_try(out, args, prefill_tp, decode_tp, timeout_s):
        text = logs.pop(0)
        (out / "prefill.log").write_text("prefill\n")
        (out / "decode.log").write_text(text)
        records = [] if "handshake_setup_failed" in text else [READ]
        (out / "nixl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    monkeypatch.setattr(vllm_cpu_nixl, "_serve_pair", one_try)

    def run(*decode_logs: str) -> tuple[list[dict], Path, int]:
        logs.extend(decode_logs)
        records = vllm_cpu_nixl.run_pair(tmp_path / "model", tmp_path, 1, 2, 200, 3)
        return records, tmp_path, len(logs)

    return run


FAILED = "ERROR NIXL transfer failure: handshake_setup_failed | Context: ...\n"


def test_a_timed_out_handshake_is_served_again_once(serve):
    records, out, left = serve(FAILED, "decode ok\n")
    assert records == [READ] and left == 0
    assert (out / "decode.1.log").read_text() == FAILED
    assert (out / "decode.log").read_text() == "decode ok\n"


def test_a_second_timeout_is_not_retried(serve):
    records, out, left = serve(FAILED, FAILED, "never served\n")
    assert records == [] and left == 1  # the third log was never asked for
    assert (out / "decode.log").read_text() == FAILED


def test_a_served_pair_is_served_once(serve):
    records, out, left = serve("decode ok\n", "never served\n")
    assert records == [READ] and left == 1
    assert not (out / "decode.1.log").exists()
