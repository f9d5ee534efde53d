# rayladder: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench gpu-check lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/python workflows/ladder.py

test: setup
	$(BIN)/python -m pytest -q

# No Ray, no spawned ranks, no long training: a few minutes on 2 cores.
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/python benchmarks/train_step.py --size 1M
	$(BIN)/python benchmarks/train_step.py --size 5M
	$(BIN)/python benchmarks/data.py
	$(BIN)/python benchmarks/checkpoint.py
	$(BIN)/python benchmarks/ray_overhead.py
	$(BIN)/python benchmarks/fit_coverage.py
	$(BIN)/python benchmarks/memory.py
	$(BIN)/python benchmarks/object_storage.py

# On a CUDA machine: the tests marked cuda, the 1B train-step benchmark (bf16, float8) against
# OLMo-core's throughput, a tiny GPU ladder on Ray. Without CUDA it says so and fails.
gpu-check: setup
	$(BIN)/python benchmarks/gpu_check.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
