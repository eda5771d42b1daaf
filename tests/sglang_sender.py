"""SGLang's own Mooncake sender, loaded from SGLang's wheel at test time (not a test file).

The wheel (`pip download --no-deps sglang==0.5.15`, 12 MiB) is unpacked into a cache folder
(INFERCOMM_TEST_CACHE, else ~/.cache/infercomm-tests), three files only; nothing of it is
kept in the project. Importing `sglang.srt.disaggregation.mooncake.conn` would pull in the
whole server (torch, zmq, the scheduler), so the methods the sender runs are compiled from
the wheel's own source text, with its file name and line numbers, into one class:
`MooncakeKVManager`'s `_transfer_data`, `_send_kvcache_generic`, `send_kvcache`,
`send_kvcache_slice` (mooncake/conn.py), `CommonKVManager`'s `get_mha_kv_ptrs_with_pp`,
`get_mla_kv_ptrs_with_pp` (common/conn.py) and `group_concurrent_contiguous`
(common/utils.py). The caller gives the instance what SGLang's manager holds: `kv_args`,
`attn_tp_size`, `is_mla_backend`, `enable_custom_mem_pool`, and `engine`, a stand-in for
SGLang's MooncakeTransferEngine whose `batch_transfer_sync` records each batch.

Where the wheel cannot be had (no network, no pip), `sender_class()` skips the test with one
line saying so.

The patterns follow SGLang @ 8905cbd4 (modal-projects/sglang); the 0.5.15 wheel's sender is
the same code but for the source head where the decode side replicates heads (decode tp >
KV heads): 8905cbd4 takes `dst_tp_rank // dst_replication` (mooncake/conn.py:764-774), 0.5.15
the decode rank itself. The cases run here keep decode tp within the KV heads.
"""

import ast
import concurrent.futures
import logging
import os
import subprocess
import sys
import tempfile
import typing
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

VERSION = "0.5.15"
FILES = {"mooncake": "sglang/srt/disaggregation/mooncake/conn.py",
         "common": "sglang/srt/disaggregation/common/conn.py",
         "utils": "sglang/srt/disaggregation/common/utils.py"}
METHODS = {"mooncake": ("_transfer_data", "_send_kvcache_generic", "send_kvcache",
                        "send_kvcache_slice"),
           "common": ("get_mha_kv_ptrs_with_pp", "get_mla_kv_ptrs_with_pp")}


def _cache() -> Path:
    root = os.environ.get("INFERCOMM_TEST_CACHE") or Path.home() / ".cache" / "infercomm-tests"
    return Path(root) / f"sglang-{VERSION}"


def wheel_files() -> Path:
    """The folder holding the three source files, downloaded and unpacked once."""
    folder = _cache()
    if all((folder / name).is_file() for name in FILES.values()):
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                 "--disable-pip-version-check", f"sglang=={VERSION}", "-d", tmp],
                capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            pytest.skip(f"SGLang's wheel (sglang=={VERSION}) could not be downloaded: {err}")
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if got.returncode != 0 or not wheels:
            said = [line for line in got.stderr.splitlines() if "ERROR" in line]
            pytest.skip(f"SGLang's wheel (sglang=={VERSION}) could not be downloaded: "
                        f"{(said or got.stderr.splitlines() or ['pip said nothing'])[-1]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in FILES.values():
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                part = target.with_suffix(".part")
                part.write_bytes(wheel.read(name))
                part.replace(target)  # whole or absent: a second session may read it
    return folder


def _functions(path: Path, owner: str | None, names: tuple[str, ...]) -> list[ast.stmt]:
    """The named functions of `path` (methods of class `owner`, or module functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    body = tree.body
    if owner is not None:
        body = next(node.body for node in tree.body
                    if isinstance(node, ast.ClassDef) and node.name == owner)
    found = [node for node in body if isinstance(node, ast.FunctionDef) and node.name in names]
    missing = set(names) - {node.name for node in found}
    assert not missing, f"{path} has no {sorted(missing)} (another SGLang version?)"
    return found


def _compiled(path: Path, nodes: list[ast.stmt], namespace: dict[str, Any]) -> dict[str, Any]:
    """Run the functions' own source, as a module of the wheel's file name (tracebacks and
    coverage point at SGLang's lines); annotations stay unevaluated, as in the wheel."""
    module = ast.Module(body=[ast.ImportFrom("__future__", [ast.alias("annotations")], 0),
                              *nodes], type_ignores=[])
    ast.fix_missing_locations(module)
    local: dict[str, Any] = {}
    exec(compile(module, str(path), "exec"), namespace, local)
    return local


def sender_class() -> type:
    """A class whose methods are SGLang's sender code, on an instance the caller fills."""
    folder = wheel_files()
    namespace: dict[str, Any] = {
        "np": np, "npt": np.typing, "concurrent": concurrent, "logging": logging,
        "logger": logging.getLogger("sglang-mooncake-sender"), **vars(typing),
        "StateType": None, "KVTransferError": RuntimeError}
    utils = folder / FILES["utils"]
    namespace.update(_compiled(utils, _functions(utils, None,
                                                 ("group_concurrent_contiguous",)), namespace))
    methods: dict[str, Any] = {}
    for key, owner in (("common", "CommonKVManager"), ("mooncake", "MooncakeKVManager")):
        path = folder / FILES[key]
        methods.update(_compiled(path, _functions(path, owner, METHODS[key]), namespace))
    return type("SGLangMooncakeSender", (), methods)


class RecordingEngine:
    """SGLang's MooncakeTransferEngine as the sender sees it: `batch_transfer_sync(session,
    src, dst, lengths)` (mooncake_transfer_engine.py:236 @ 8905cbd4), each call recorded."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[tuple[int, int, int]]]] = []

    def batch_transfer_sync(self, session: str, src: list[int], dst: list[int],
                            lengths: list[int]) -> int:
        self.batches.append((session, list(zip(src, dst, lengths, strict=True))))
        return 0
