# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

# torch is pinned to the CPU wheel (2.13.0); an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/asyncrl demo --out runs/demo

test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: setup
	$(BIN)/ruff check asyncrl tests examples
	$(BIN)/ruff format --check asyncrl tests examples

clean:
	rm -rf $(VENV) runs
