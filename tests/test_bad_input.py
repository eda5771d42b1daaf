"""Absurd values are refused up front, one line and exit 2, nothing started (issue 9, item 10)."""

import json
import socket
import subprocess

import pytest

from patterns import PRESETS
from tests.replay_helpers import TINY_CONFIG, infercomm, last_json


def write_config(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **fields}))
    return str(path)


def one_line_refusal(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_an_absurd_layer_count_is_refused_at_once(tmp_path):
    model = write_config(tmp_path, num_hidden_layers=10**12)
    # Before, generation built a list of 2*10**12 calls: the timeout below would fire.
    proc, _ = infercomm("pattern", "--model", model, "--prompt", "4", "--decode", "4",
                              timeout=30)
    one_line_refusal(proc, "num_hidden_layers is 1000000000000", "at most 10000")


def test_a_sequence_beyond_the_models_positions_is_refused_naming_both(tmp_path):
    # llama-2-7b's config.json: max_position_embeddings 4096; 4000 + 97 = 4097 > 4096.
    assert PRESETS["llama-2-7b"].max_position_embeddings == 4096
    proc, _ = infercomm("pattern", "--model", "llama-2-7b", "--prompt", "4000", "--decode", "97")
    one_line_refusal(proc, "prompt(4000) + decode(97) = 4097 tokens",
                     "max_position_embeddings(4096)")
    proc, _ = infercomm("pattern", "--model", "llama-2-7b", "--prompt", "4000", "--decode", "96")
    assert proc.returncode == 0, proc.stderr  # 4096 tokens fit exactly
    model = write_config(tmp_path, max_position_embeddings=64)
    proc, _ = infercomm("replay", "--model", model, "--tp", "2", "--prompt", "16", "--decode",
                        "200000", "--out", str(tmp_path / "o"))
    one_line_refusal(proc, "prompt(16) + decode(200000)", "max_position_embeddings(64)")
    assert not (tmp_path / "o").exists()


def test_buffers_beyond_memory_are_refused_before_any_rank_starts(tmp_path):
    # llama-3.1-8b TP2, batch 10**9, prompt 1: the prefill all-reduce alone is
    # 10**9 x 4096 x 2 bytes = 8 TB per rank, beyond any host.
    # vllm-v0: the default engine (vllm) refuses a batch above max_num_seqs first.
    proc, _ = infercomm("replay", "--engine", "vllm-v0", "--model", "llama-3.1-8b", "--tp", "2",
                        "--prompt", "1", "--decode", "2", "--batch", str(10**9),
                        "--device", "cpu", "--out", str(tmp_path / "o"), timeout=60)
    one_line_refusal(proc, "host memory for 2 ranks", "lower --batch")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option, words", [
    (["--timeout", "0"], ["--timeout", "positive"]),
    (["--timeout", "-3"], ["--timeout", "positive"]),
    (["--out", ""], ["--out", "empty"]),
    (["--mpi-staging", "--backend", "mpi"], ["--mpi-staging", "CPU"]),
    (["--mpi-staging", "--backend", "torch"], ["--mpi-staging", "--backend mpi"]),
])
def test_meaningless_run_options_are_refused(tmp_path, option, words):
    proc, _ = infercomm("replay", "--model", write_config(tmp_path), "--tp", "2", "--prompt",
                        "4", "--decode", "4", "--device", "cpu", "--out", str(tmp_path / "o"),
                        *option)  # an --out in `option` comes last and wins
    assert not (tmp_path / "o").exists()
    one_line_refusal(proc, *words)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_users_master_port_is_kept_under_nproc(tmp_path):
    port = str(_free_port())
    proc, _ = infercomm("replay", "--model", write_config(tmp_path), "--tp", "2", "--prompt",
                        "4", "--decode", "4", "-n", "1", "-w", "0", "--device", "cpu", "--out",
                        str(tmp_path / "o"), env={"MASTER_PORT": port})
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "o" / last_json(proc.stdout)["results_dir"].split("/")[-1]
                       / "meta.json").read_text())
    assert meta["environment"]["MASTER_PORT"] == port  # what the ranks saw
    proc, _ = infercomm("replay", "--model", write_config(tmp_path), "--tp", "2", "--prompt",
                        "4", "--decode", "4", "--device", "cpu", "--out", str(tmp_path / "x"),
                        env={"MASTER_PORT": "http"})
    one_line_refusal(proc, "MASTER_PORT='http'")

