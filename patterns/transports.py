"""Which transport an engine sends a call through, under its defaults (engine spec 10.2).

The count and shapes of calls never depend on this; only what carries them does. Sizes are
per-rank input bytes. Tables are vLLM's and SGLang's own, keyed by GPU architecture (below),
and live beside each engine: `patterns/engines/vllm/transports.py`,
`patterns/engines/sglang/transports.py`.
"""

MiB = 1 << 20

# sm90 = H100/H200, sm100 = B200, sm80 = A100 (no fusion, no torch symm-mem table).
GPU_ARCH = {"h100": "sm90", "h200": "sm90", "b200": "sm100", "a100": "sm80"}
