"""vLLM V1's scheduler defaults and CUDA-graph capture sizes (the shape rules it shares with
other engines: `patterns/shapes.py`)."""

# vLLM V1's API-server defaults (`engine/arg_utils.py:2529-2551` @ c8109375): max_num_seqs
# 1024 and max_num_batched_tokens 8192 on GPUs of >= 70 GiB other than A100s; A100s (PR
# #17885: larger budgets cost them throughput) take 256 and 2048.
V1_MAX_NUM_SEQS = 1024
V1_MAX_BATCHED_TOKENS = 8192
V1_A100_MAX_NUM_SEQS = 256
V1_A100_MAX_BATCHED_TOKENS = 2048
V1_MAX_CAPTURE = 512


def v1_defaults(gpu: str) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM's API server picks on `gpu`."""
    if gpu == "a100":
        return V1_A100_MAX_NUM_SEQS, V1_A100_MAX_BATCHED_TOKENS
    return V1_MAX_NUM_SEQS, V1_MAX_BATCHED_TOKENS


def v1_capture_sizes(max_num_seqs: int, max_batched_tokens: int) -> list[int]:
    """V1's CUDA-graph sizes (`config/vllm.py: _set_cudagraph_sizes`, no speculation).

    cap = min(2 * max_num_seqs, 512, max_num_batched_tokens); sizes [1, 2, 4] +
    range(8, 256, 8) + range(256, cap + 1, 16), kept up to cap, plus max_num_batched_tokens
    when it is not above cap.
    """
    cap = min(2 * max_num_seqs, V1_MAX_CAPTURE, max_batched_tokens)
    sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)] if s <= cap]
    if max_batched_tokens <= cap and max_batched_tokens not in sizes:
        sizes.append(max_batched_tokens)
    return sorted(sizes)
