# psrl developer entry points. Every target sets up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/python -m pytest
export OMP_NUM_THREADS ?= 1

.PHONY: install check lint imports types test test-slow test-multihost test-all demo docs bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

imports: install
	$(BIN)/lint-imports

types: install
	$(BIN)/mypy

check: lint imports types

test: check
	$(PYTEST) -m "not slow and not multihost"

test-slow: install
	$(PYTEST) -m slow

test-multihost: install
	$(PYTEST) -m multihost

test-all: check
	$(PYTEST)

docs: install
	$(BIN)/psrl config docs

demo: install
	$(BIN)/psrl launch

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
