# rayladder: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-torch-floor test-fast bench bench-fits gpu-check gpu-wheels lint format clean

setup: $(STAMP)

# uv installs the same versions as pip in a fraction of its time. It does not read pip's config,
# so pip's find-links (where a machine keeps local wheels, such as torch's CPU build) is handed
# over. It compiles the bytecode up front as pip does: without .pyc files (and with
# PYTHONDONTWRITEBYTECODE set) every Ray worker process would compile torch anew at import.
# $(call install,VENV,CONSTRAINTS): the project and its dev extras into VENV.
define install
	test -x $(1)/bin/python || $(PY) -m venv $(1)
	$(1)/bin/python -m pip install --quiet -c constraints.txt uv
	links=$${PIP_FIND_LINKS:-$$($(1)/bin/python -m pip config get global.find-links 2>/dev/null)}; \
	$(1)/bin/uv pip install --quiet --compile-bytecode --python $(1)/bin/python \
		$$(for l in $$links; do printf -- '--find-links %s ' "$$l"; done) \
		-c $(2) -e '.[dev]'
endef

$(STAMP): pyproject.toml constraints.txt
	$(call install,$(VENV),constraints.txt)
	touch $(STAMP)

demo: setup
	$(BIN)/python workflows/ladder.py

# Two pytest workers: the tests that need a Ray run in order on one of them (RAY_TEST_FILES in
# tests/conftest.py), the rest on the other, so a 2-core machine's second core is not idle
# while a single-process test runs.
test: setup
	$(BIN)/python -m pytest -q -n 2 --durations=25

# The oldest torch the project accepts (pyproject: torch>=2.6), with the torchao release made
# for it, every other package at constraints.txt's: the whole suite in a venv of its own,
# .venv-floor (ignored; torch's wheel from PyPI brings its CUDA libraries, ~3 GB). On a CPU the
# tests of FSDP2 runs fail there (2.6 cannot run FSDP2 on a CPU; such a run is refused in one
# line): benchmarks/RESULTS.md, "Stop 54", lists those and the few others.
TORCH_FLOOR := 2.6.0
TORCHAO_FLOOR := 0.10.0
FLOOR_VENV := .venv-floor
test-torch-floor:
	mkdir -p $(FLOOR_VENV)
	sed -e 's/^torch==.*/torch==$(TORCH_FLOOR)/' -e 's/^torchao==.*/torchao==$(TORCHAO_FLOOR)/' \
		constraints.txt > $(FLOOR_VENV)/constraints.txt
	$(call install,$(FLOOR_VENV),$(FLOOR_VENV)/constraints.txt)
	$(FLOOR_VENV)/bin/python -m pytest -q -n 2 --durations=10

# No Ray, no spawned ranks, no long training: about a minute on 2 cores.
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

bench: setup
	$(BIN)/python benchmarks/train_step.py --size 1M
	$(BIN)/python benchmarks/train_step.py --size 5M
	$(BIN)/python benchmarks/data.py
	$(BIN)/python benchmarks/checkpoint.py
	$(BIN)/python benchmarks/ray_overhead.py
	$(BIN)/python benchmarks/fit_coverage.py
	$(BIN)/python benchmarks/chinchilla_refit.py
	$(BIN)/python benchmarks/memory.py
	$(BIN)/python benchmarks/object_storage.py

# The fits against published and known-answer data beyond `bench`'s Chinchilla refit: OLMo's
# ladder -> its 7B/13B task accuracies, and the coverage of the hyperparameter-law and task
# intervals (several minutes). Step Law's refit (benchmarks/hparam_refit.py) needs its table
# fetched first (benchmarks/data/steplaw/README.md).
bench-fits: setup
	$(BIN)/python benchmarks/olmo_task_refit.py
	$(BIN)/python benchmarks/hparam_coverage.py
	$(BIN)/python benchmarks/task_coverage.py

# On a CUDA machine: the tests marked cuda, the 1B train-step benchmark (bf16, float8) against
# OLMo-core's throughput, a tiny GPU ladder on Ray. Without CUDA it says so and fails.
gpu-check: setup
	$(BIN)/python benchmarks/gpu_check.py

# Here, for a bare GPU machine (no network; its python3 has CUDA torch but not these): the
# wheels gpu_check.py installs there, at this venv's versions, into .gpu-wheels/ (ignored, ~34
# MiB; carry it), with Ray trimmed and recompressed to fit the 64 MiB a GPU machine is sent
# (benchmarks/pack_ray.py, a few minutes) and Ray's requirements that machine lacks.
# GPU_PYTHON: that machine's Python. README's "GPU" section says how to run it.
GPU_PYTHON ?= 3.12
GPU_WHEELS := torchao zstandard draccus mergedeep toml pytest-timeout
GPU_RAY_WHEELS := jsonschema jsonschema-specifications referencing rpds-py pydantic \
	pydantic-core annotated-types typing-inspection tensorboardX
GPU_PIP_DOWNLOAD = $(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: \
	--python-version $(GPU_PYTHON) --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64
gpu-wheels: setup
	rm -rf .gpu-wheels
	$(GPU_PIP_DOWNLOAD) -d .gpu-wheels \
		$$(for p in $(GPU_WHEELS) $(GPU_RAY_WHEELS); do echo "$$p==$$($(BIN)/python -m pip show $$p | sed -n 's/^Version: //p')"; done)
	$(GPU_PIP_DOWNLOAD) -d .gpu-wheels/ray-wheel "ray==$$($(BIN)/python -m pip show ray | sed -n 's/^Version: //p')"
	$(BIN)/python benchmarks/pack_ray.py .gpu-wheels/ray-wheel/ray-*.whl --out .gpu-wheels
	rm -rf .gpu-wheels/ray-wheel
	du -sh .gpu-wheels

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) $(FLOOR_VENV) runs .pytest_cache .ruff_cache
