"""One rank of scripts/megatron_cpu_oracle.py: Megatron-Core's static inference engine serving
tiny random-weight GPTs (dense, or MoE with Megatron's default all-gather token dispatcher) on
gloo, one layout after another, each `generate` under torch's profiler (CPU activities,
record_shapes=True): OUT/LAYOUT-WORKLOAD/rankR.pt.trace.json.gz.

Started by the oracle with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; not run by hand.

Megatron-Core assumes a CUDA device where it places tensors. The stand-ins below only put
those tensors on the CPU; none touches a collective or a point-to-point call, which run as
Megatron issues them, through torch.distributed on gloo:
- `torch.cuda.current_device` (the device of tensors it allocates), `synchronize`, `Event`
  (its timing events) and `Tensor.cuda`;
- `inference/communication_utils._is_cuda` (asserts the PP broadcast tensor is on CUDA);
- `transformer/utils.get_default_causal_mask`, made with device="cuda" (also bound by name in
  `fusions/fused_softmax`);
- `tensor_parallel/random.CudaRNGStatesTracker.fork` (forks CUDA's RNG; dropout is 0 here).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch

HIDDEN, HEADS, LAYERS, VOCAB, MAX_SEQ = 128, 4, 4, 256, 64
# the MoE model: experts, experts a token, an expert's (and the shared expert's) FFN size,
# and which layers are MoE (Megatron's moe_layer_freq: 1 a MoE layer, 0 a dense one)
EXPERTS, TOP_K, MOE_FFN, MOE_LAYERS = 4, 2, 128, [0, 1, 1, 1]


def place_on_cpu() -> None:
    """Stand-ins for the CUDA placement Megatron-Core assumes (module docstring)."""
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None

    class Event:
        def __init__(self, *a, **k) -> None:
            self.at = 0.0

        def record(self, *a, **k) -> None:
            self.at = time.perf_counter()

        def elapsed_time(self, other: Event) -> float:
            return (other.at - self.at) * 1e3

        def synchronize(self) -> None:
            pass

    torch.cuda.Event = Event
    torch.Tensor.cuda = lambda self, *a, **k: self


def place_megatron_on_cpu() -> None:
    """The stand-ins that live in Megatron's own modules (imported here, after torch's)."""
    from megatron.core.fusions import fused_softmax
    from megatron.core.inference import communication_utils
    from megatron.core.tensor_parallel import random
    from megatron.core.transformer import utils

    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq), diagonal=1).bool()

    utils.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask
    communication_utils._is_cuda = lambda tensor: None
    random.CudaRNGStatesTracker.fork = lambda self, *a, **k: contextlib.nullcontext()


class Tokenizer:
    """Prompts are the token ids, space-separated; token 0 pads (Megatron pads with `eod`)."""

    eod, bos = 0, None
    vocab_size = VOCAB

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def detokenize(self, tokens: list[int], **_: object) -> str:
        return " ".join(map(str, tokens))

    def offsets(self, tokens: list[int], text: str) -> list[int]:
        return list(range(len(tokens)))


def build(tp: int, pp: int, ep: int = 1, moe: bool = False):
    """The inference controller of a tiny GPT at this layout (random weights, fp32). `moe`:
    4 experts (top 2) and a shared expert in layers 1-3, layer 0 dense (moe_layer_freq), the
    experts split over `ep` ranks (expert_model_parallel_size) and, by Megatron's default,
    over TP too (expert_tensor_parallel_size = tp)."""
    from megatron.core import parallel_state
    from megatron.core.inference.contexts import StaticInferenceContext
    from megatron.core.inference.engines import StaticInferenceEngine
    from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import (
        GPTInferenceWrapper,
    )
    from megatron.core.inference.text_generation_controllers.text_generation_controller import (
        TextGenerationController,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
    )
    from megatron.core.transformer import TransformerConfig

    torch.manual_seed(0)
    experts = dict(num_moe_experts=EXPERTS, moe_router_topk=TOP_K, moe_ffn_hidden_size=MOE_FFN,
                   moe_shared_expert_intermediate_size=MOE_FFN, moe_layer_freq=MOE_LAYERS,
                   expert_model_parallel_size=ep) if moe else {}
    config = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=256,
        normalization="RMSNorm", add_bias_linear=False, gated_linear_unit=True,
        use_cpu_initialization=True, params_dtype=torch.float32, pipeline_dtype=torch.float32,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        hidden_dropout=0.0, attention_dropout=0.0, **experts)
    spec = (get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                       normalization="RMSNorm") if moe else
            get_gpt_layer_local_spec(normalization="RMSNorm"))
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB,
                     max_sequence_length=MAX_SEQ,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
    model.eval()
    context = StaticInferenceContext(max_batch_size=8, max_sequence_length=MAX_SEQ)
    wrapped = GPTInferenceWrapper(model, context)
    controller = TextGenerationController(wrapped, Tokenizer())
    return StaticInferenceEngine(controller, max_batch_size=8, legacy=True)


def serve(engine, out: Path, rank: int, batch: int, prompt: int, decode: int,
          log_probs: bool) -> None:
    """One static batch generated under the profiler; its trace written for this rank."""
    from megatron.core.inference.sampling_params import SamplingParams
    params = SamplingParams(top_k=1, num_tokens_to_generate=decode,
                            return_log_probs=log_probs)
    params.add_attributes({"no_early_termination": True})  # every request runs `decode`
    prompts = [" ".join(str((7 * i + j) % (VOCAB - 1) + 1) for j in range(prompt))
               for i in range(batch)]
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        engine.generate(prompts=prompts, sampling_params=params)
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.pt.trace.json.gz"))


def main() -> int:
    out = Path(sys.argv[1])
    # [{"name", "tp", "pp", "ep", "moe", "order", "workloads": [...]}, ...]
    plan = json.loads(sys.argv[2])
    place_on_cpu()
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    place_megatron_on_cpu()
    from megatron.core import parallel_state
    for layout in plan:
        start = time.monotonic()
        # "tp-cp-ep-pp-dp" places ranks as infercomm's layout does (dp outermost; at dp 1 the
        # same as Megatron's default, "tp-cp-ep-dp-pp", which a layout may ask for instead)
        parallel_state.initialize_model_parallel(
            layout["tp"], layout["pp"], expert_model_parallel_size=layout["ep"],
            order=layout["order"])
        engine = build(layout["tp"], layout["pp"], layout["ep"], layout["moe"])
        for work in layout["workloads"]:
            serve(engine, out / f"{layout['name']}-{work['name']}", rank, work["batch"],
                  work["prompt"], work["decode"], work["log_probs"])
        del engine
        parallel_state.destroy_model_parallel()
        dist.barrier()
        if rank == 0:
            print(f"{layout['name']}: served in {time.monotonic() - start:.1f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
