"""TensorRT-LLM: its profile."""
