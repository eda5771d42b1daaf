"""A config.json is named after the model it describes, never after the folder holding it."""
import json
from pathlib import Path

from microbench.cli import main
from patterns import from_hf_config

BASE = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128, "num_attention_heads": 4}


def _write(folder: Path, raw: dict, file: str = "config.json") -> Path:
    folder.mkdir(parents=True)
    path = folder / file
    path.write_text(json.dumps(raw))
    return path


def test_names_come_from_the_config(tmp_path: Path):
    # a Hugging Face cache folder is a commit hash; its name must not become the model's
    snap = tmp_path / "snapshots" / "0123abcd"
    assert from_hf_config(_write(snap, {**BASE, "_name_or_path": "org/m-1b"})).name == "org/m-1b"
    local = _write(tmp_path / "nc", {**BASE, "_name_or_path": "/models/my-llama/"})
    assert from_hf_config(local).name == "my-llama"
    typed = _write(tmp_path / "x", {**BASE, "model_type": "llama"})
    assert from_hf_config(typed).name == "llama-h64-L2"  # hidden 64, 2 layers
    bare = _write(tmp_path / "y", BASE, "small.json")
    assert from_hf_config(bare).name == "small"


def test_name_flag_overrides(tmp_path: Path, capsys):
    path = _write(tmp_path / "nc", {**BASE, "model_type": "llama"})
    assert main(["pattern", "--model", str(path), "--name", "mine", "--prompt", "4",
                 "--decode", "2", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["model"]["name"] == "mine"
