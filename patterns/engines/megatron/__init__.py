"""Megatron-LM inference: its profile."""
