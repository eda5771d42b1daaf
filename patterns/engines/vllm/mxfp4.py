"""The MoE hidden-size padding of mxfp4 checkpoints (gpt-oss) in vLLM: which backend runs the
experts on which GPU, how far it pads the hidden size, and whether the MoE layer's TP
all-reduce carries the padded width.

Code read: vLLM upstream main of 2026-08-03 = modal-projects/vllm @ c8109375, `vllm/`:
- backend choice for gpt-oss, `model_executor/layers/fused_moe/oracle/mxfp4.py:311-331`
  (`_get_priority_backends_for_gpt_oss`): FlashInfer TRT-LLM MXFP4xBF16 first, which needs
  SM100 and FlashInfer (`fused_moe/experts/trtllm_mxfp4_moe.py:119-121`); then the OAI Triton
  kernels, SM90 up to SM100 (`experts/gpt_oss_triton_kernels_moe.py:36-47`); FlashInfer
  CUTLASS (opt-in through --moe-backend); Marlin from SM75 (`experts/marlin_moe.py:624-626`).
  So B200 runs TRT-LLM, H100/H200 Triton, A100 Marlin.
- padding, `oracle/mxfp4.py:637-685` (`mxfp4_round_up_hidden_size_and_intermediate_size`):
  Marlin and TRT-LLM round the hidden size up to a multiple of 256, FlashInfer CUTLASS to
  128, Triton not at all (only the intermediate size, to 64). `fused_moe/routed_experts.py:
  125-135` stores it as `moe_config.hidden_dim`.
- where the padded width travels, `fused_moe/runner/moe_runner.py`: `_maybe_pad_hidden_states`
  (509-535) pads the activations to `hidden_dim` before the experts; `_maybe_reduce_final_
  output` (462-496) all-reduces the experts' output over TP and only then truncates it
  (`states[..., :trunc_size]`). So the MoE all-reduce is [T, padded h] whenever the kernel
  writes the padded width. The TRT-LLM kernel writes [T, h] unpadded since vLLM #40960
  (`b4806c8e`, 2026-04-30; `experts/trtllm_mxfp4_moe.py:226-230, 316`: output of
  `hidden_dim_unpadded`), so on a current vLLM B200 the all-reduce is [T, h]; before it
  (vLLM 0.10-0.19, 2025) it wrote [T, padded h], as the gpt-oss-120b TP8 B200 trace in
  docs/real-engine.md shows: [888, 3072] for h = 2880.
"""

from patterns.pattern import MOE_BACKENDS

# backend -> (hidden-size multiple, all-reduce carries the padded width)
MXFP4_BACKENDS: dict[str, tuple[int, bool]] = {
    "triton": (1, False),
    "marlin": (256, True),
    "flashinfer-cutlass": (128, True),
    "flashinfer-trtllm": (256, False),  # output unpadded since b4806c8e
    "flashinfer-trtllm-padded": (256, True),  # vLLM before b4806c8e (2026-04-30)
}
# vLLM's choice for gpt-oss on each modelled GPU (the priority list above).
DEFAULT_BACKEND = {"b200": "flashinfer-trtllm", "h100": "triton", "h200": "triton",
                   "a100": "marlin"}
# EngineOptions checks --moe-backend against MOE_BACKENDS (patterns/pattern.py), these and
# the block-fp8 ones (fp8_moe.py).
assert set(MXFP4_BACKENDS) <= set(MOE_BACKENDS)


def moe_backend(gpu: str, chosen: str | None) -> str:
    """The mxfp4 MoE backend: the one given, else vLLM's for `gpu`."""
    return chosen or DEFAULT_BACKEND[gpu]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def moe_widths(hidden: int, weight_format: str, gpu: str,
               chosen: str | None) -> tuple[int, int]:
    """(the width the experts take, the width they return): the input is padded whenever
    the backend pads (`_maybe_pad_hidden_states`, so a DP dispatch gathers the padded
    width), the output as `moe_allreduce_width` says."""
    if weight_format != "mxfp4":
        return hidden, hidden
    multiple, _ = MXFP4_BACKENDS[moe_backend(gpu, chosen)]
    return (round_up(hidden, multiple),
            moe_allreduce_width(hidden, weight_format, gpu, chosen))


def moe_allreduce_width(hidden: int, weight_format: str, gpu: str,
                        chosen: str | None) -> int:
    """The hidden width of a MoE layer's TP all-reduce: `hidden`, or the padded size when an
    mxfp4 backend pads it and its kernel writes the padded width."""
    if weight_format != "mxfp4":
        return hidden
    multiple, padded_out = MXFP4_BACKENDS[moe_backend(gpu, chosen)]
    return round_up(hidden, multiple) if padded_out else hidden
