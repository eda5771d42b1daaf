"""Several single-engine cases of scripts/vllm_cpu_oracle.py served one after another in one
process (test machinery for tests/real_engine_serving.py; never on the product's path).

    .venv-vllm/bin/python tests/vllm_oracle_batch.py OUT CASE [OUT CASE ...]

Each case runs as `vllm_cpu_oracle.py CASE --out OUT --no-validate` runs it (the same main(),
under the same script_guard), and OUT's parent then holds served.json ({"rc"}). What the
cases share is this process's import of vLLM: some 10 CPU seconds a case, where each engine
still starts its own workers. Between cases vLLM's environment cache is dropped (an engine
core caches the VLLM_* variables when it starts: vllm/envs.py enable_envs_cache), so each
case reads its own VLLM_CPU_OMP_THREADS_BIND, as it would in a process of its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
NEEDS = ("vllm", "torch", "transformers", "safetensors")


def main(argv: list[str]) -> int:
    if not argv or len(argv) % 2:
        sys.stderr.write("vllm_oracle_batch: give OUT CASE pairs\n")
        return 2
    sys.path.insert(0, str(SCRIPTS))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import script_guard
    import vllm_cpu_oracle as oracle
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    worst = 0
    for out, case in zip(argv[::2], argv[1::2], strict=True):
        if "vllm.envs" in sys.modules:
            sys.modules["vllm.envs"].disable_envs_cache()
        if bind is None:  # the oracle sets each case's own binding where none is given
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        sys.argv = ["vllm_cpu_oracle.py", case, "--out", out, "--no-validate"]
        print(f"== vllm_oracle_batch: {case}", flush=True)
        try:
            rc = script_guard.run(oracle.main, "vllm_cpu_oracle", needs=NEEDS)
        except SystemExit as end:
            rc = end.code if isinstance(end.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        marker = Path(out).parent / "served.json"
        marker.with_suffix(".part").write_text(json.dumps({"rc": rc}))
        marker.with_suffix(".part").rename(marker)
        worst = max(worst, rc)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
