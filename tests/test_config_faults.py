"""A config.json that cannot describe a model is refused in one line, exit 2, whatever is wrong
with it: types, ranges, relations between fields, nesting, the kind of file (fault battery
items 13, 14 and 15)."""

import json
import os

import pytest

from microbench.cli import main
from tests.replay_helpers import TINY_CONFIG


def refused(capsys, argv: list[str], *words: str) -> str:
    """Run the CLI in-process: exit 2, one stderr line holding every word, nothing on stdout."""
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def pattern_of(path) -> list[str]:
    return ["pattern", "--model", str(path), "--prompt", "4", "--decode", "2"]


def write(tmp_path, **fields) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **fields}))
    return str(path)


# Item 13: wrong types used to end in int() or set() tracebacks.
@pytest.mark.parametrize(("field", "value", "words"), [
    ("num_experts", "many", ("num_experts is 'many'", "integer")),
    ("num_key_value_heads", "abc", ("num_key_value_heads is 'abc'", "integer")),
    ("mlp_only_layers", 5, ("mlp_only_layers is 5", "list of layer indices")),
    ("tie_word_embeddings", "yes", ("tie_word_embeddings is 'yes'", "true or false")),
    ("quantization_config", [1], ("quantization_config is [1]", "JSON object")),
])
def test_fields_of_the_wrong_type_are_named(tmp_path, capsys, field, value, words):
    extra = {"num_experts": 8, "num_experts_per_tok": 2} if field == "mlp_only_layers" else {}
    refused(capsys, pattern_of(write(tmp_path, **extra, **{field: value})), *words)


# Item 14: values no model can have used to be accepted (and -1 positions switched the
# sequence-length check off).
@pytest.mark.parametrize(("fields", "words"), [
    ({"num_experts": -4}, ("num_experts is -4", ">= 0")),
    ({"num_experts": 128, "num_experts_per_tok": 1000}, ("1000 experts a token", "of 128")),
    ({"num_experts": 8}, ("8 experts but no num_experts_per_tok",)),
    ({"num_key_value_heads": 8}, ("num_key_value_heads(8) exceeds num_attention_heads(4)",)),
    ({"num_key_value_heads": 3}, ("num_key_value_heads(3) does not divide",)),
    ({"intermediate_size": -5}, ("intermediate_size is -5", "a positive integer")),
    ({"max_position_embeddings": -1}, ("max_position_embeddings is -1", "a positive integer")),
    ({"model_type": "mamba"}, ("model_type 'mamba' has no attention + MLP layers",)),
])
def test_values_no_model_can_have_are_refused(tmp_path, capsys, fields, words):
    refused(capsys, pattern_of(write(tmp_path, **fields)), *words)


def test_an_unknown_family_is_priced_with_a_note_saying_so(tmp_path, capsys):
    assert main(pattern_of(write(tmp_path, model_type="brand_new_lm"))) == 0
    out = capsys.readouterr().out
    assert "note: model_type 'brand_new_lm' is not one the engine profiles were written for" \
        in out
    assert main(pattern_of(write(tmp_path, model_type="qwen3"))) == 0
    assert "is not one the engine profiles" not in capsys.readouterr().out


def test_json_nested_100000_deep_is_refused_without_a_recursion_error(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    refused(capsys, pattern_of(path), "nested too deeply")


def test_a_fifo_a_device_and_a_folder_are_named_for_what_they_are(tmp_path, capsys):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    refused(capsys, pattern_of(fifo), "is a named pipe (FIFO), not a file")
    refused(capsys, pattern_of("/dev/zero"), "is a device, not a file")
    (tmp_path / "empty").mkdir()
    refused(capsys, pattern_of(tmp_path / "empty"), "empty' holds no config.json")


def test_a_file_far_larger_than_a_config_is_not_read(tmp_path, capsys):
    path = tmp_path / "config.json"
    with path.open("wb") as f:  # sparse: 2 GB of holes, nothing to read
        f.truncate(2 << 30)
    refused(capsys, pattern_of(path), "2,147,483,648 bytes")


def test_the_real_configs_still_read(capsys):
    for name in ("deepseek-r1", "gemma-3-4b", "gpt-oss-20b", "llama-4-maverick-2layer",
                 "phi-3-mini-4k", "qwen3-30b-a3b", "qwen3-8b"):
        assert main(pattern_of(f"tests/data/configs/{name}/config.json")) == 0, name
    assert "Traceback" not in capsys.readouterr().err
