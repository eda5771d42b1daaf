"""One rank of Hugging Face transformers' tensor-parallel generation on CPU, under torchrun.

    torchrun --standalone --nproc-per-node N tests/hf_tp_ranks.py MODEL_DIR OUT_DIR PROMPT NEW

Loads MODEL_DIR with `tp_plan="auto"` (transformers starts the gloo process group itself on
CPU), generates NEW tokens greedily from a PROMPT-token prompt under torch.profiler with
record_shapes=True, and writes OUT_DIR/rank{R}.json. Nothing here issues a collective: every
call in the trace is transformers' own (its TP plan's hooks).
"""

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM


def main() -> None:
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    prompt, new = int(sys.argv[3]), int(sys.argv[4])
    model = AutoModelForCausalLM.from_pretrained(model_dir, tp_plan="auto",
                                                 dtype=torch.float32)
    rank = torch.distributed.get_rank()
    ids = torch.arange(1, prompt + 1).reshape(1, prompt)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        # min_new_tokens: random weights may sample EOS early; every run takes NEW steps.
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    prof.export_chrome_trace(str(out_dir / f"rank{rank}.json"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
