"""A config.json that cannot describe a model is refused in one line, exit 2, whatever is wrong
with it: types, ranges, relations between fields, nesting, the kind of file (fault battery
items 13, 14 and 15)."""

import json
import os

import pytest

from microbench.cli import main
from patterns import from_hf_config
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
                 "nemotron-h-56b", "phi-3-mini-4k", "qwen3-30b-a3b", "qwen3-8b"):
        assert main(pattern_of(f"tests/data/configs/{name}/config.json")) == 0, name
    assert "Traceback" not in capsys.readouterr().err


# Issue 42: an integer of 5,000 digits ended in json's ValueError traceback (Python refuses
# int() of over 4,300 digits); 0 experts and an unknown layer_types entry were accepted, the
# first as a dense model, the second as full attention.
PLACEHOLDER = 123456789  # written as 5,000 digits once the config is JSON


def with_digits(tmp_path, digits: int, **fields) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **fields}).replace(str(PLACEHOLDER),
                                                                    "7" * digits))
    return str(path)


@pytest.mark.parametrize(("fields", "words"), [
    ({"hidden_size": PLACEHOLDER}, ("hidden_size is an integer of 5,000 digits",
                                    "at most 18 digits")),
    ({"text_config": {"vocab_size": -PLACEHOLDER}},
     ("text_config.vocab_size is an integer of 5,000 digits",)),
    ({"eos_token_id": [1, PLACEHOLDER]}, ("eos_token_id[1] is an integer of 5,000 digits",)),
])
def test_an_integer_of_5000_digits_is_named_by_its_field(tmp_path, capsys, fields, words):
    refused(capsys, pattern_of(with_digits(tmp_path, 5000, **fields)), *words)


def test_19_digit_integers_are_refused_and_18_are_read(tmp_path, capsys):
    # 18 digits fit in int64 (10**18 - 1 < 2**63, about 9.2 x 10**18): read as any number
    assert main(pattern_of(with_digits(tmp_path, 18, bos_token_id=PLACEHOLDER))) == 0
    capsys.readouterr()
    refused(capsys, pattern_of(with_digits(tmp_path, 19, bos_token_id=PLACEHOLDER)),
            "bos_token_id is an integer of 19 digits")


@pytest.mark.parametrize(("fields", "words"), [
    # Qwen3-30B-A3B's top 8 with its 128 experts written as 0
    ({"model_type": "qwen3_moe", "num_experts": 0, "num_experts_per_tok": 8},
     ("num_experts is 0 but num_experts_per_tok is 8", "at least 8 experts")),
    ({"num_local_experts": 0, "num_experts_per_tok": 2},
     ("num_local_experts is 0 but num_experts_per_tok is 2",)),
    ({"model_type": "mixtral", "num_local_experts": 0},
     ("num_local_experts is 0, but every mixtral model has experts", "more than 1")),
    ({"model_type": "deepseek_v3", "n_routed_experts": 0, "num_experts_per_tok": 0},
     ("n_routed_experts is 0, but every deepseek_v3 model has experts",)),
])
def test_zero_experts_are_refused(tmp_path, capsys, fields, words):
    refused(capsys, pattern_of(write(tmp_path, **fields)), *words)


def test_zero_experts_and_zero_a_token_is_a_dense_model(tmp_path, capsys):
    # granite-4.0-micro's config says both; it is dense (vLLM's granitemoehybrid.py:89 builds
    # no experts when num_local_experts is 0)
    path = write(tmp_path, num_local_experts=0, num_experts_per_tok=0)
    assert main(pattern_of(path)) == 0
    assert not from_hf_config(path).is_moe


@pytest.mark.parametrize(("field", "kinds", "words"), [
    ("layer_types", ["full_attention", "sliding_attention", "ful_attention", "full_attention"],
     ("layer_types[2] is 'ful_attention', a layer kind no model has",
      "must be one of full_attention, sliding_attention")),
    ("layer_types", ["full_attention"] * 3 + ["global"], ("layer_types[3] is 'global'",)),
    ("layers_block_type", ["mamba", "attention", "mlp", "convolution"],
     ("layers_block_type[3] is 'convolution'",)),
])
def test_an_unknown_layer_kind_is_refused(tmp_path, capsys, field, kinds, words):
    fields = {field: kinds, "sliding_window": 64}
    refused(capsys, pattern_of(write(tmp_path, **fields)), *words)


def test_known_layer_kinds_still_read(tmp_path, capsys):
    # the kinds transformers allows: chunked (Llama 4) and linear attention (Qwen3-Next) read
    kinds = ["full_attention", "sliding_attention", "chunked_attention", "linear_attention"]
    assert main(pattern_of(write(tmp_path, layer_types=kinds, sliding_window=64))) == 0
    assert capsys.readouterr().err == ""
