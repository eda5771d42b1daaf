"""`infercomm models` and `infercomm pattern`: output formats and one-line errors."""

import csv
import io
import json
import subprocess
import sys

import pytest

from tests.conftest import last_json

BASE = ["pattern", "--model", "llama-3.1-8b", "--prompt", "128", "--decode", "128"]
# The published-table profile: these tests pin V0's exact rows (gather, not all-gather).
BASE_V0 = [*BASE, "--engine", "vllm-v0"]


def test_models_lists_every_preset_with_source(cli):
    status, out, _ = cli("models")
    assert status == 0
    names = last_json(out)["models"]  # the table's short last line: the names
    status, out, _ = cli("models", "--format", "json")
    assert status == 0 and len(out.strip().splitlines()) == 1
    models = {m["name"]: m for m in last_json(out)["models"]}
    assert names == list(models)
    assert set(models) == {"llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-2-7b",
                           "llama-2-13b", "llama-3.1-70b", "llama-3.1-405b", "mixtral-8x7b",
                           "qwen2.5-7b", "qwen3-8b", "qwen3-30b-a3b", "deepseek-v3",
                           "gpt-oss-120b"}
    assert models["llama-3.1-405b"]["num_key_value_heads"] == 8
    assert all(m["source"].startswith("https://huggingface.co/") for m in models.values())


def test_json_document(cli):
    status, out, _ = cli(*BASE_V0, "--tp", "2", "--pp", "2", "--format", "json")
    assert status == 0 and len(out.strip().splitlines()) == 1
    doc = json.loads(out)
    assert set(doc) >= {"model", "layout", "workload", "engine", "rows", "volume_bytes"}
    assert doc["layout"] == {"tp": 2, "pp": 2, "dp": 1, "ep": False, "world_size": 4}
    row = doc["rows"][0]
    assert row == {"phase": "prefill", "stage": 0, "op": "allreduce", "group": "tp",
                   "group_size": 2, "shape": [128, 4096], "out_shape": [128, 4096],
                   "dtype": "bf16", "count": 33, "bytes": 128 * 4096 * 2, "transport": "nccl"}
    assert set(doc["volume_bytes"]) == {"allreduce", "allgather", "reducescatter", "gather",
                                        "broadcast", "send", "recv", "alltoall", "p2p", "total"}
    assert doc["volume_bytes"]["total"] == 158_466_048  # hand-computed in test_volume.py


def test_csv_rows(cli):
    status, out, _ = cli(*BASE_V0, "--tp", "4", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert status == 0 and len(rows) == 4
    assert rows[-1] == {"phase": "decode", "stage": "0", "op": "gather", "group": "tp",
                        "group_size": "4", "shape": "1x32064", "out_shape": "1x128256",
                        "dtype": "bf16", "count": "127", "bytes": str(32064 * 2),
                        "transport": "nccl"}


def test_table_and_summary_line(cli):
    status, out, _ = cli(*BASE, "--tp", "2")
    assert status == 0
    assert "allreduce" in out and "8,255" in out
    summary = last_json(out)
    # vllm (V1): 65 allreduces + 1 logits all-gather per step, 128 steps
    assert summary["calls_per_inference"] == 66 * 128
    assert summary["volume_bytes"] == 152_199_168


def test_steps_lists_ordered_calls(cli):
    status, out, _ = cli(*BASE_V0, "--tp", "2", "--pp", "2", "--steps", "--format", "json")
    steps = json.loads(out)["steps"]
    assert [(s["stage"], s["phase"], len(s["ops"])) for s in steps] == [
        (0, "prefill", 35), (0, "decode", 35), (1, "prefill", 37), (1, "decode", 37)]
    assert steps[2]["ops"][0] == {"op": "recv", "group": "pp", "group_size": 2,
                                  "shape": [262144], "out_shape": [262144], "dtype": "bf16",
                                  "tag": "pp.hidden_states", "peer": 0, "root": None,
                                  "transport": "nccl"}
    status, text, _ = cli(*BASE, "--tp", "2", "--steps")
    assert status == 0 and "layers.31.mlp.down_proj" in text


BAD_INPUT = [
    (["--model", "gpt-9"], "unknown model 'gpt-9'; use a preset (llama-3.2-1b"),
    (["--engine", "trtllm-v9"],
     "unknown engine 'trtllm-v9'; use one of megatron, sglang, trtllm, vllm, vllm-v0"),
    (["--tp", "3"], "tp(3) does not divide num_attention_heads(32) of llama-3.1-8b"),
    (["--pp", "33"], "pp(33) exceeds num_hidden_layers(32)"),
    (["--prompt", "0"], "argument --prompt: 0 must be a positive integer"),
    (["--decode", "-5"], "argument --decode: -5 must be a positive integer"),
    (["--batch", "x"], "argument --batch: 'x' is not an integer"),
    (["--dtype", "fp8"], "dtype 'fp8' is not a model dtype; use one of bf16, fp16, fp32"),
    (["--model", "/nonexistent/config.json"], "does not exist; pass a preset"),
]


@pytest.mark.parametrize("extra, message", BAD_INPUT)
def test_bad_input_is_one_line_exit_2(cli, extra, message):
    argv = list(BASE)
    for i in range(0, len(extra), 2):  # later flags override the base ones
        if extra[i] in argv:
            argv[argv.index(extra[i]) + 1] = extra[i + 1]
        else:
            argv += extra[i:i + 2]
    status, out, err = cli(*argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.parametrize("content, message", [
    ('{"hidden_size": 64, "num_hidden_', "not valid JSON"),
    ('{"hidden_size": 64, "num_hidden_layers": 2}', "lacks vocab_size, num_attention_heads"),
    ('[1, 2]', "holds a JSON list"),
    ('{"hidden_size": 64, "num_hidden_layers": 0, "vocab_size": 10, "num_attention_heads": 2}',
     "num_hidden_layers is 0; it must be a positive integer"),
])
def test_bad_config_json(cli, tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    status, out, err = cli("pattern", "--model", str(path), "--prompt", "8", "--decode", "2")
    assert status == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1


def test_config_folder_and_real_process(tmp_path):
    cfg = {"hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 1000,
           "num_attention_heads": 8, "torch_dtype": "float16", "_name_or_path": "org/tiny"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ok = subprocess.run([sys.executable, "-m", "microbench", "pattern", "--model",
                         str(tmp_path), "--tp", "2", "--prompt", "8", "--decode", "2"],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert last_json(ok.stdout)["model"] == "org/tiny"
    bad = subprocess.run([sys.executable, "-m", "microbench", "pattern", "--model",
                          str(tmp_path), "--tp", "3", "--prompt", "8", "--decode", "2"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == ("infercomm pattern: error: tp(3) does not divide "
                                  "num_attention_heads(8) of org/tiny; use tp in 1, 2, 4, 8")
