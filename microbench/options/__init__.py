"""The pattern options (`--model`, `--tp`, ..., `--requests`, `--disagg`) and what they build:
read by the commands and by the readers of a run's recorded command line."""
