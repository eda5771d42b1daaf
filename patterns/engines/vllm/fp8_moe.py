"""Which kernel runs a block-fp8 checkpoint's experts in vLLM, and whether the MoE dispatch
then carries fp8 hidden states with their scales or bf16 ones.

Code read: vLLM upstream main of 2026-08-03 = modal-projects/vllm @ c8109375, `vllm/`:
- `model_executor/layers/fused_moe/oracle/fp8.py:69-133` (`_get_priority_backends`): "On
  Hopper for Block Fp8, prefer Triton for TP and FI CUTLASS for EP": on SM90 (H100, H200)
  with 128-block fp8 weights and dynamic 128-group activations (DeepSeek-V3's checkpoint),
  FLASHINFER_CUTLASS moves to the front when moe ep_size > 1 (--ep), TRITON otherwise;
  `select_fp8_moe_backend` (271-425) takes the first whose `is_supported_config` holds, or
  the one `--moe-backend` names (`map_fp8_backend`, 250-268: triton, deep_gemm,
  flashinfer_cutlass, ...).
- `fused_moe/experts/flashinfer_cutlass_moe.py:127-142`: FlashInferExperts supports SM90
  when FlashInfer's CUTLASS fused MoE imports (`has_flashinfer_cutlass_fused_moe`; vLLM's
  CUDA wheels depend on flashinfer-python, so a standard install has it), and
  `expects_unquantized_inputs` is True for block-quantised fp8 w8a8: the kernel applies the
  block scales itself.
- `fused_moe/modular_kernel.py:1229, 1242, 1562` pass `defer_input_quant=
  expects_unquantized_inputs` to the prepare step, and `prepare_finalize/naive_dp_ep.py:
  16-52, 112-185` then dispatches the bf16 hidden states as they are, with no scale tensor
  ("Skip gathering scales if ... quantization is deferred"); otherwise (Triton, DeepGEMM)
  it quantises first and gathers fp8 values and fp32 scales, one per 128 channels.
- DeepEP: `prepare_finalize/deepep_ht.py:288-312` quantises block-fp8 inputs before the
  dispatch only `if quant_config.is_block_quantized and not defer_input_quant`, so under
  FlashInfer CUTLASS its messages carry bf16 rows; DeepEP low latency dispatches the batched
  activation format (`deepep_ll.py:238-243, 353-358` refuse defer_input_quant), which
  FlashInferExperts does not take (`activation_format` Standard, flashinfer_cutlass_moe.py:
  202-203), so the oracle moves on to a batched kernel (BATCHED_DEEPGEMM) that quantises.
So DeepSeek-V3 at --dp N --ep on an H100 dispatches bf16 by default (all-gather or DeepEP
high throughput). Other GPUs keep the quantised dispatch here (their priority lists were not
re-read for this rule).
"""

from patterns.errors import ConfigError

# --moe-backend values for block-fp8 experts (vLLM's names, hyphenated as the mxfp4 ones).
FP8_BACKENDS = ("flashinfer-cutlass", "deep-gemm", "triton")
SM90 = frozenset({"h100", "h200"})


def fp8_moe_backend(gpu: str, ep: bool, chosen: str | None,
                    a2a: str = "allgather_reducescatter") -> str:
    """The kernel of block-fp8 experts: the one given, else vLLM's first choice."""
    batched = a2a == "deepep_ll"  # the batched activation format
    if chosen is not None:
        if chosen not in FP8_BACKENDS:
            raise ConfigError(f"moe-backend {chosen!r} does not run block-fp8 experts; use one "
                              f"of {', '.join(FP8_BACKENDS)}")
        if chosen == "flashinfer-cutlass" and gpu not in SM90:
            raise ConfigError(f"moe-backend flashinfer-cutlass runs block-fp8 experts on SM90 "
                              f"only (h100, h200), not {gpu}; use deep-gemm or triton")
        if chosen == "flashinfer-cutlass" and batched:
            raise ConfigError("moe-backend flashinfer-cutlass takes the standard activation "
                              "format, not DeepEP low latency's batched one; use deep-gemm or "
                              "triton, or --a2a deepep_ht")
        return chosen
    if gpu in SM90 and not batched:
        return "flashinfer-cutlass" if ep else "triton"
    return "deep-gemm"


def defers_input_quant(weight_format: str, gpu: str, ep: bool, chosen: str | None,
                       a2a: str = "allgather_reducescatter") -> bool:
    """True when a block-fp8 checkpoint's dispatch carries bf16 hidden states and no scales
    (FlashInfer CUTLASS quantises inside the kernel)."""
    return (weight_format == "fp8"
            and fp8_moe_backend(gpu, ep, chosen, a2a) == "flashinfer-cutlass")
