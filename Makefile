# Two commands from a fresh clone (both idempotent):
#   make demo   set up, then run the main job on local ranks (no cluster needed)
#   make test   set up, then lint and run the test suite
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# A CPU build of torch: plain `torch` would pull gigabytes of CUDA packages.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(TORCH_PIN)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[torch,mpi,plot,dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/infercomm pattern --model llama-3.1-8b --tp 2 --pp 2 --prompt 128 --decode 128

lint: setup
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python benchmarks/pattern_generation.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
