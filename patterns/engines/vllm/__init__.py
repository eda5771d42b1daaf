"""vLLM V1: its profile, its rules (sequence parallelism, mxfp4 padding), its scheduler."""
