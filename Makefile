# One command runs the main job, one runs the tests; both set up .venv first.
#   make run      h3bench run --op norm_modulate: full plan on CUDA, a quick CPU run otherwise
#   make run-all  the same for all seven ops (one evidence file each, and an index page)
#   make test     the test suite (CPU; Triton kernels under the interpreter), over TEST_WORKERS processes
PY ?= python3
VENV ?= .venv
# pytest-xdist workers for `make test`: one a core of a 2-core CI machine (each imports torch: a few hundred MB)
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
STAMP := $(VENV)/.h3bench-installed
TEST_STAMP := $(VENV)/.h3bench-test-installed

.PHONY: run run-all test full-cpu nightly clean

# `run` needs the package only: a GPU machine without a package index (its own torch and triton) can run
# it; `test` adds the test extra (pytest, diffusers for the parity tests, transformers for the model examples) and, where the index is
# reached, the ray extra (the fan-out tests run Ray in local mode), all pinned by constraints-ci.txt.
$(STAMP): pyproject.toml constraints-ci.txt
	@if $(PY) -c "import torch, triton" 2>/dev/null; then \
	  echo "using the torch and triton this python already has"; \
	  $(PY) -m venv --system-site-packages $(VENV) && touch $(VENV)/.system-torch && \
	  $(BIN)/python -m pip install -q --no-build-isolation -e .; \
	else \
	  $(PY) -m venv $(VENV) && \
	  $(BIN)/python -m pip install -q -c constraints-ci.txt torch==2.13.0 && \
	  $(BIN)/python -m pip install -q -c constraints-ci.txt -e .; \
	fi
	@touch $@

$(TEST_STAMP): $(STAMP)
	@if [ -f $(VENV)/.system-torch ]; then \
	  $(BIN)/python -m pip install -q --no-build-isolation -e '.[test]'; \
	else \
	  $(BIN)/python -m pip install -q -c constraints-ci.txt -e '.[test,ray]'; \
	fi
	@touch $@

run: $(STAMP)
	$(BIN)/h3bench run --op norm_modulate

run-all: $(STAMP)
	$(BIN)/h3bench run --op all

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# The full probe plan on a CPU at a tiny hidden size (counts equal the GPU plan's): ~15 s for the torch
# rows. The Triton row is left out: under the interpreter the full plan's ~11,500 calls take about an hour.
full-cpu: $(STAMP)
	$(BIN)/h3bench run --op norm_modulate --device cpu --full --set hidden=8 --adapters diffusers,torch_rms_norm \
	  --out runs/norm_modulate_cpu_full_h8.json --force

clean:
	rm -rf $(VENV) runs

# The nightly GPU job (.ci/gpu-nightly: GPU tests, every op's full run, each compared with its committed
# baseline; exit 1 on a failure or regression). NIGHTLY_OUT: where its files go.
nightly: $(TEST_STAMP)
	.ci/gpu-nightly $(NIGHTLY_OUT)
