# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo lint typecheck unit install clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,plot]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check monitor adapters tests bench
	$(BIN)/ruff format --check monitor adapters tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/relmon simulate coverage
	$(BIN)/relmon simulate stopping --dist 1.0 --dist 0.6,0.4 --weights 0.9,0.1 --trials 2000 --seed 1

bench: $(STAMP)
	$(BIN)/python bench/core_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
