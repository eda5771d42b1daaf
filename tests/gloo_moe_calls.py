"""Two gloo ranks issue, under torch.profiler, the calls of a Megatron-Core MoE layer at TP2
(megatron-core 0.19.2's all-gather dispatcher, patterns/engines/megatron/moe.py) between
all-reduces of other dtypes: one Kineto JSON a rank, made by real PyTorch.

    python tests/gloo_moe_calls.py OUT --port P

Per rank, in order (T = 16 tokens, h = 128, 4 experts):
  all_reduce fp32 [8, 2, 128]                    (an attention's linear_proj)
  all_gather bool [16, 4] -> [32, 4]             (the routing map)
  all_gather fp32 [16, 4] -> [32, 4]             (the probabilities)
  all_gather fp32 [16, 128] -> [32, 128]         (the tokens)
  reduce_scatter fp32 [32, 128] -> [16, 128]     (the experts' output)
  all_reduce bf16 [8, 2, 128]
  all_reduce fp32 [1, 2, 128]
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _rank(rank: int, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(torch.ones(8, 2, 128))
        _ALL_GATHER(torch.empty(32, 4, dtype=torch.bool), torch.ones(16, 4, dtype=torch.bool))
        _ALL_GATHER(torch.empty(32, 4), torch.ones(16, 4))
        _ALL_GATHER(torch.empty(32, 128), torch.ones(16, 128))
        _REDUCE_SCATTER(torch.empty(16, 128), torch.ones(32, 128))
        dist.all_reduce(torch.ones(8, 2, 128, dtype=torch.bfloat16))
        dist.all_reduce(torch.ones(1, 2, 128))
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    mp.spawn(_rank, args=(args.out, args.port), nprocs=2)


if __name__ == "__main__":
    sys.exit(main())
