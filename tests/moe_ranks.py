"""One rank of a DP x EP replay with --check, launched several times by test_moe_replay.py.

argv: BACKEND DP TP BATCHES A2A OUT_DIR. Writes OUT_DIR/rank<R>.json: rank, wrong elements,
calls, the kinds of call bound (one file per rank: mpiexec may interleave ranks' stdout).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from microbench.backends import open_backend
from microbench.ranks import dist
from microbench.ranks.watchdog import Watchdog
from microbench.replay.plan import build_plan
from microbench.replay.replayer import Replayer
from patterns import Layout, ModelConfig, Workload
from tests.moe_standin import MoeDims, pattern

# A tiny MoE model: 8 experts, top-2, 3 layers of which the first is dense.
TINY = ModelConfig(name="tiny-moe", hidden_size=16, num_hidden_layers=3, vocab_size=64,
                   num_attention_heads=4, num_key_value_heads=4, intermediate_size=32,
                   torch_dtype="bf16", num_local_experts=8, num_experts_per_tok=2)
DIMS = MoeDims(hidden=16, layers=3, moe_layers=(1, 2), experts=8, top_k=2)


def main() -> int:
    backend_name, dp, tp, batches, a2a, out_dir = sys.argv[1:7]
    layout = Layout(tp=int(tp), dp=int(dp), ep=True)
    dp_batches = tuple(int(b) for b in batches.split(","))
    workload = Workload(prompt=3, decode=3, dp_batches=dp_batches)
    pat = pattern(TINY, DIMS, layout, workload, a2a)
    env = dist.detect()
    watchdog = Watchdog(60, env.rank).start()
    backend = open_backend(backend_name, env=env, device="cpu", timeout=60)
    plan = build_plan(pat, backend)
    replayer = Replayer(plan, backend, "step", watchdog)
    replayer.run(0, 1, progress=False)
    wrong = replayer.check()
    kinds = sorted({(op.op.kind.value, op.op.group, op.op.counts is not None)
                    for run in plan.runs for op in run.ops})
    result = {"rank": backend.rank, "wrong": wrong, "calls": plan.calls_per_inference,
              "kinds": kinds}
    Path(out_dir, f"rank{backend.rank}.json").write_text(json.dumps(result))
    backend.barrier()
    backend.close()
    watchdog.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
