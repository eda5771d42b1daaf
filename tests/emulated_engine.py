"""An emulated vLLM V0 engine on gloo: the calls of one inference as vLLM 0.8.5 issues them,
under torch.profiler, one Kineto JSON per rank. Written from the engine code (engine spec
section 2.1), not from `patterns`, so a test that compares the two can fail.

    python tests/emulated_engine.py OUT --tp 2 --pp 2 --prompt 4 --decode 3 --port P
        [--gz] [--also-drop STEP:N]

The model is the tests' tiny one (h=64, 4 layers, vocab 1000 padded to 1024, bf16).
`--also-drop STEP:N` runs the inference a second time, profiled into OUT/drop, leaving out
the N-th all-reduce of step STEP on every rank (a call hidden from the trace, to be found).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

H, LAYERS, VOCAB_PADDED = 64, 4, 1024  # pad_vocab_size(1000, 64) = 1024
DTYPE = torch.bfloat16


def _step(tokens: int, rows: int, stage: int, tp_rank: int, args: argparse.Namespace,
          tp_group: object, pp_group: object, drop: int | None) -> None:
    tp, pp = args.tp, args.pp
    layers = LAYERS // pp  # get_pp_indices: 4 layers split evenly
    allreduces = 0

    def all_reduce(x: torch.Tensor) -> None:
        nonlocal allreduces
        allreduces += 1
        if drop != allreduces:
            dist.all_reduce(x, group=tp_group)

    if stage > 0:  # recv_tensor_dict(all_gather_group=tp): recv a slice, all-gather it
        for _ in ("hidden_states", "residual"):
            part = torch.empty(tokens * H // tp, dtype=DTYPE)
            dist.recv(part, group=pp_group, group_src=stage - 1)
            if tp > 1:
                full = torch.empty(tokens * H, dtype=DTYPE)
                dist.all_gather_into_tensor(full, part, group=tp_group)
    if tp > 1:
        hidden = torch.ones(tokens, H, dtype=DTYPE)
        if stage == 0:
            all_reduce(hidden)  # VocabParallelEmbedding
        for _ in range(layers):
            all_reduce(hidden)  # self_attn.o_proj (RowParallelLinear)
            all_reduce(hidden)  # mlp.down_proj (RowParallelLinear)
    if stage < pp - 1:  # send_tensor_dict: each tensor's TP slice, flattened
        for _ in ("hidden_states", "residual"):
            dist.send(torch.ones(tokens * H // tp, dtype=DTYPE), group=pp_group,
                      group_dst=stage + 1)
    elif tp > 1:  # LogitsProcessor._gather_logits: gather to TP rank 0
        logits = torch.ones(rows, VOCAB_PADDED // tp, dtype=DTYPE)
        out = [torch.empty_like(logits) for _ in range(tp)] if tp_rank == 0 else None
        dist.gather(logits, out, group=tp_group, group_dst=0)


def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    world = args.tp * args.pp
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # initialize_model_parallel: TP groups of consecutive ranks, PP groups strided by tp;
    # every rank creates every group in the same order.
    tp_groups = [dist.new_group([s * args.tp + t for t in range(args.tp)])
                 for s in range(args.pp)]
    pp_groups = [dist.new_group([s * args.tp + t for s in range(args.pp)])
                 for t in range(args.tp)]
    stage, tp_rank = divmod(rank, args.tp)
    tp_group, pp_group = tp_groups[stage], pp_groups[tp_rank]
    runs = [(args.out, None)]
    if args.also_drop:
        runs.append((os.path.join(args.out, "drop"), args.also_drop))
    for out, drop in runs:
        steps = args.decode  # 1 prefill step + (decode - 1) decode steps
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=schedule(wait=0, warmup=0, active=steps + 1)) as prof:
            for step in range(steps):
                tokens = args.prompt if step == 0 else 1  # batch of one request
                dropped = drop[1] if drop and drop[0] == step else None
                _step(tokens, 1, stage, tp_rank, args, tp_group, pp_group, dropped)
                prof.step()
        os.makedirs(out, exist_ok=True)
        suffix = ".json.gz" if args.gz else ".json"
        prof.export_chrome_trace(os.path.join(out, f"rank{rank}{suffix}"))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=4)
    parser.add_argument("--decode", type=int, default=3)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gz", action="store_true")
    parser.add_argument("--also-drop", default=None,
                        type=lambda s: tuple(int(x) for x in s.split(":")))
    args = parser.parse_args()
    mp.spawn(_rank, args=(args, args.port), nprocs=args.tp * args.pp)


if __name__ == "__main__":
    sys.exit(main())
