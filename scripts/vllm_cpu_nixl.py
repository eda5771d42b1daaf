"""vLLM's disaggregated prefill and decode on this machine: two engines of vLLM's CPU build,
a prefill instance and a decode instance, move one request's KV cache through vLLM's
NixlConnector on host memory (kv_buffer_device "cpu", NIXL's UCX backend), and every
descriptor NIXL was asked to read is recorded.

    .venv-vllm/bin/python scripts/vllm_cpu_oracle.py nixl-tp1-tp2 --out vllm-oracle-nixl

The flow is vLLM's toy proxy's (examples/.../disagg_proxy): the prefill engine generates one
token with kv_transfer_params {"do_remote_decode": true} and returns the parameters the
decode side needs (its engine id, block ids, side-channel host and port); the decode engine
generates with those, and its NixlConnector READs the prefill engine's blocks.

What NIXL saw is recorded by a `nixl` package written into OUT/nixl-shim: vLLM imports
`nixl._api` (vllm/distributed/nixl_utils.py), the shim re-exports `nixl_cu12._api` (the
wheel infercomm's `.[nixl]` extra installs) with a nixl_agent that writes, a line each, the
regions registered (get_reg_descs), the descriptor lists prepared (prep_xfer_dlist) and each
transfer made from them (make_prepped_xfer: descriptor count, bytes, sizes) to OUT/nixl.jsonl.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SHIM_API = '''"""nixl -> nixl_cu12, recording what vLLM asks NIXL to move (NIXL_RECORD: a file)."""
import json
import os

from nixl_cu12._api import *  # noqa: F401,F403
from nixl_cu12._api import nixl_agent as _agent

_LOG = os.environ.get("NIXL_RECORD")


def _record(**fields):
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **fields}) + "\\n")


def _lengths(descs):
    """Each descriptor's length from the (addr, len, dev) rows vLLM passes; None for NIXL's
    own list types (indexing those past their end aborts the process)."""
    if isinstance(descs, (list, tuple)) or hasattr(descs, "shape"):  # rows, or an N x 3 array
        return [int(row[1]) for row in descs]
    return None


class nixl_agent(_agent):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lengths = {}
        self._handles = {}

    def get_reg_descs(self, descs, mem_type=None, *args, **kwargs):
        out = super().get_reg_descs(descs, mem_type, *args, **kwargs)
        lengths = _lengths(descs)
        if lengths is not None:
            _record(call="get_reg_descs", mem_type=str(mem_type), bytes=lengths)
        return out

    def get_xfer_descs(self, descs, mem_type=None, *args, **kwargs):
        out = super().get_xfer_descs(descs, mem_type, *args, **kwargs)
        lengths = _lengths(descs)
        if lengths is not None:  # nixl_cu12 calls this again on its own list: keep the rows'
            self._lengths[id(out)] = lengths
        return out

    def prep_xfer_dlist(self, agent_name, xfer_list, *args, **kwargs):
        handle = super().prep_xfer_dlist(agent_name, xfer_list, *args, **kwargs)
        lengths = self._handles[handle] = self._lengths.get(id(xfer_list), [])
        remote = agent_name not in ("NIXL_INIT_AGENT", b"NIXL_INIT_AGENT")
        _record(call="prep_xfer_dlist", remote=remote, descriptors=len(lengths),
                sizes=sorted(set(lengths)))
        return handle

    def make_prepped_xfer(self, operation, local_side, local_indices, remote_side,
                          remote_indices, *args, **kwargs):
        lengths = self._handles.get(remote_side, [])
        picked = [lengths[i] for i in remote_indices] if lengths else []
        _record(call="make_prepped_xfer", op=str(operation), descriptors=len(remote_indices),
                bytes=sum(picked), sizes=sorted(set(picked)))
        return super().make_prepped_xfer(operation, local_side, local_indices, remote_side,
                                         remote_indices, *args, **kwargs)
'''


def nixl_package() -> Path | None:
    """The folder holding the nixl_cu12 wheel's package: this Python's, else the checkout's
    .venv (the `.[nixl]` extra); None where neither has it."""
    import importlib.util
    spec = importlib.util.find_spec("nixl_cu12")
    if spec and spec.origin:
        return Path(spec.origin).parent
    repo = Path(__file__).resolve().parents[1]
    for found in sorted((repo / ".venv").glob("lib/python*/site-packages/nixl_cu12")):
        return found
    return None


def write_shim(folder: Path, package: Path) -> None:
    """OUT/nixl-shim: the recording `nixl` package and links to nixl_cu12 and its libraries
    (only those: the .venv's other packages are not the engine's)."""
    (folder / "nixl").mkdir(parents=True)
    (folder / "nixl" / "__init__.py").write_text("")
    (folder / "nixl" / "_api.py").write_text(SHIM_API)
    (folder / "nixl" / "_bindings.py").write_text("from nixl_cu12._bindings import *  # noqa\n")
    for name in (package.name, package.name + ".libs"):
        if (package.parent / name).exists():
            (folder / name).symlink_to(package.parent / name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(model: Path, out: Path, prefill_tp: int, decode_tp: int, prompt: int,
             decode: int, timeout_s: float = 360) -> list[dict]:
    """Serve one request disaggregated; the records of OUT/nixl.jsonl.

    Served again, once, where the decode engine's NIXL handshake with the prefill engine
    timed out: vLLM waits 5 s for the prefill side's reply (`zmq.RCVTIMEO` 5000 in
    nixl/base_worker.py `_nixl_handshake`, vllm-cpu 0.32.0), and three workers on two
    cores sometimes miss it (a fresh-clone test run: "NIXL transfer failure:
    handshake_setup_failed", the request failed, no READ made). The first try's logs are
    kept as prefill.1.log and decode.1.log."""
    package = nixl_package()
    if package is None:
        raise SystemExit("nixl_cu12 is not installed (pip install nixl-cu12, or make setup)")
    write_shim(out / "nixl-shim", package)
    for attempt in (1, 2):
        _serve_pair(out, [str(model), str(out), str(prompt), str(decode)], prefill_tp,
                    decode_tp, timeout_s)
        if attempt == 2 or "handshake_setup_failed" not in (out / "decode.log").read_text():
            break
        print("the NIXL handshake timed out (vLLM waits 5 s); serving the pair again",
              file=sys.stderr)
        for role in ("prefill", "decode"):
            (out / f"{role}.log").rename(out / f"{role}.{attempt}.log")
        for name in ("nixl.jsonl", "kv_transfer_params.json", "decode-done"):
            (out / name).unlink(missing_ok=True)
    return [json.loads(line) for line in (out / "nixl.jsonl").read_text().splitlines()]


def _serve_pair(out: Path, args: list[str], prefill_tp: int, decode_tp: int,
                timeout_s: float) -> None:
    """Both engines once: the prefill engine, then the decode engine reading from it."""
    env = {**os.environ, "PYTHONPATH": str(out / "nixl-shim"),
           "NIXL_RECORD": str(out / "nixl.jsonl")}
    base = [sys.executable, __file__, *args]
    # each engine its own side-channel port (a TP rank listens on port + rank)
    ports = free_port(), free_port() + 16
    procs = []
    try:
        for role, tp, port in (("prefill", prefill_tp, ports[0]), ("decode", decode_tp, ports[1])):
            bind = "|".join(str(rank % 2) for rank in range(tp))  # a worker a core, 2 cores
            with (out / f"{role}.log").open("w") as log:  # the engine keeps its own descriptor
                procs.append(subprocess.Popen(
                    [*base, role, str(tp)], stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, env={**env, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port),
                                                 "VLLM_CPU_OMP_THREADS_BIND": bind}))
        status = procs[1].wait(timeout=timeout_s)
        (out / "decode-done").touch()
        status = max(status, procs[0].wait(timeout=60))
    finally:
        for proc in procs:  # on a timeout or Ctrl-C, each engine and its workers end
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if status:
        tail = (out / "decode.log").read_text()[-1500:] + (out / "prefill.log").read_text()[-1500:]
        raise SystemExit(f"the disaggregated request failed (exit {status}):\n{tail}")


def pattern_args(config: Path, prefill_tp: int, decode_tp: int, prompt: int,
                 decode: int) -> list[str]:
    """`infercomm pattern` of the same request: vLLM's CPU build keeps blocks of 128 tokens
    (vllm/platforms/cpu.py:293 in vllm-cpu 0.32.0) and the model ran in fp32."""
    return ["pattern", "--model", str(config), "--disagg",
            f"prefill=tp{prefill_tp},decode=tp{decode_tp}", "--prompt", str(prompt),
            "--decode", str(decode), "--dtype", "fp32", "--kv-block-size", "128", "--eager",
            "--format", "json"]


def reads(records: list[dict]) -> list[dict]:
    """The READs NIXL was asked for, one a decode rank: descriptors, bytes, sizes."""
    return sorted(({k: r[k] for k in ("descriptors", "bytes", "sizes")} for r in records
                   if r["call"] == "make_prepped_xfer"), key=json.dumps)


def pattern_reads(pattern: dict) -> list[dict]:
    """The pattern's rank pairs in the same form."""
    return sorted(({"descriptors": p["descriptors"], "bytes": p["bytes"],
                    "sizes": sorted({g["bytes"] for g in p["descriptor_groups"]})}
                   for p in pattern["kv_transfer"]["pairs"]), key=json.dumps)


def engine(model: str, role: str, tp: int, prompt: int, decode: int, out: Path) -> None:
    """One engine of the pair (this file run as a script by run_pair)."""
    from vllm import LLM, SamplingParams
    llm = LLM(model=model, dtype="float32", skip_tokenizer_init=True, enforce_eager=True,
              distributed_executor_backend="mp", max_model_len=256, seed=0,
              compilation_config={"mode": 0}, tensor_parallel_size=tp,
              kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                  "kv_buffer_device": "cpu"})
    request = {"prompt_token_ids": [j % 255 + 1 for j in range(prompt)]}
    params = out / "kv_transfer_params.json"
    if role == "prefill":
        sampling = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, extra_args={
            "kv_transfer_params": {"do_remote_decode": True}})
        done = llm.generate([request], sampling, use_tqdm=False)[0]
        params.write_text(json.dumps(done.kv_transfer_params))
        end = time.monotonic() + 360  # the decode engine reads the blocks from this one
        while not (out / "decode-done").exists() and time.monotonic() < end:
            time.sleep(0.2)
    else:
        while not params.exists():
            time.sleep(0.2)
        sampling = SamplingParams(max_tokens=decode, min_tokens=decode, ignore_eos=True,
                                  temperature=0.0, detokenize=False,
                                  extra_args={"kv_transfer_params": json.loads(params.read_text())})
        llm.generate([request], sampling, use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()


def engine_main() -> int:
    """This file as a script: one engine of the pair, as run_pair starts it."""
    import argparse
    parser = argparse.ArgumentParser(description="one engine of the disaggregated pair "
                                     "(started by run_pair; see vllm_cpu_oracle.py nixl-*)")
    parser.add_argument("model", help="the model's folder")
    parser.add_argument("out", type=Path, help="the pair's folder (it exists)")
    parser.add_argument("prompt", type=int)
    parser.add_argument("decode", type=int)
    parser.add_argument("role", choices=("prefill", "decode"))
    parser.add_argument("tp", type=int)
    args = parser.parse_args()
    if not args.out.is_dir():
        parser.error(f"{args.out} is not a folder; the pair's folder exists before its engines")
    if min(args.prompt, args.decode, args.tp) < 1:
        parser.error("prompt, decode and tp are positive integers")
    engine(args.model, args.role, args.tp, args.prompt, args.decode, args.out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import script_guard  # beside this script: one-line errors
    sys.exit(script_guard.run(engine_main, "vllm_cpu_nixl", needs=("vllm",), out_flag=None))
