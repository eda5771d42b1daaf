"""vLLM V0: its profile."""
