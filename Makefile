# Two commands on a fresh machine with Python 3.11: `make demo` and `make test`.
# Both create .venv, install torch first (pinned to a local CPU wheel where pip has one,
# see tools/torch_spec.py), then mmcore and the packs with torch held at that version.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
TORCH_SPEC ?= $(shell $(PYTHON) tools/torch_spec.py)
PACKS := $(wildcard packs/*/*/pyproject.toml)
PACK_DIRS := $(patsubst %/pyproject.toml,%,$(PACKS))
EDITABLE_PACKS := $(foreach d,$(PACK_DIRS),-e $(d))

.PHONY: demo test test-matrix test-other-isa crash-matrix bench bench-quick install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first, then freeze its version as a constraint for every later install.
$(VENV)/.torch: | $(BIN)/python
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -c "import importlib.metadata as m; print('torch==' + m.version('torch').split('+')[0])" > $(VENV)/constraints.txt
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml $(PACKS)
	$(PIP) install --quiet -c $(VENV)/constraints.txt -e '.[test]' $(EDITABLE_PACKS)
	touch $@

install: $(VENV)/.installed

# Machines of this kind differ in their CPU's instruction set, and torch's CPU math with them:
# a test on a knife edge should fail here, not on the next machine. `make test` runs the whole
# suite, then a representative sample of the tests that compare runs (marker isa_sample: cache
# vs live, packed vs padded, resumed vs straight, the `make demo` demo) with ATen, oneDNN and
# MKL on another instruction set (tools/other_isa.py); `make test-other-isa` reruns every
# compares_runs test that way (distributed runs, kill points, every demo: ~6 min more).
OTHER_ISA = env $$($(BIN)/python tools/other_isa.py)

# Tests run on TEST_WORKERS processes (pytest-xdist), whole files to a worker so module fixtures
# are built once, each with one torch thread: most of a test is Python (imports, mmcore
# subprocesses, file work) that one thread runs anyway, so two workers on two cores finish the
# suite in ~0.63x the time of one process with two threads (measured: README, "Tests").
# Every demo's promise holds at 1 thread (tools/demo_matrix.py tries 1 and 2).
TEST_WORKERS ?= 2
WORKERS := -n $(TEST_WORKERS) --dist loadfile
PARALLEL := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# Expensive matrices keep one representative case in `make test`; `make test-matrix` runs the
# rest (marker matrix: FSDP2 on two processes for every pack, further kill points).
test: $(VENV)/.installed
	$(BIN)/ruff check --quiet .
	$(BIN)/ruff format --check --quiet .
	$(PARALLEL) $(BIN)/python -m pytest -q $(WORKERS) --durations=40 -m "not matrix"
	@echo "isa_sample tests again with: $$($(BIN)/python tools/other_isa.py)"
	$(PARALLEL) $(OTHER_ISA) $(BIN)/python -m pytest -q $(WORKERS) -m isa_sample

test-matrix: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m matrix

# Every pack x every crash point (mmcore.testing.crash): a tiny run killed there, rerun, and
# compared with an uninterrupted one (export bit-identical, every loss equal). `make test` runs
# every point once, in turn, on whisper.
crash-matrix: $(VENV)/.installed
	$(BIN)/python -m mmcore.testing.crash --work crash-matrix

test-other-isa: $(VENV)/.installed
	@echo "compares_runs tests again with: $$($(BIN)/python tools/other_isa.py)"
	$(OTHER_ISA) $(BIN)/python -m pytest -q -m compares_runs

# Benchmarks (bench/suite.py): every figure a ratio against a baseline run in the same session,
# written to BENCHMARKS.md and bench/results.json. Never part of `make test`.
bench: $(VENV)/.installed
	$(BIN)/python bench/suite.py

bench-quick: $(VENV)/.installed
	$(BIN)/python bench/suite.py --quick

demo: $(VENV)/.installed
	$(BIN)/mmcore run --pack qwen2vl --preset demo

clean:
	rm -rf $(VENV) runs crash-matrix .pytest_cache
