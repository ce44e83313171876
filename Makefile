# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# the modules compiled by mypyc (setup.py, phaselens/native.py's GROUPS: the simulator's, and the
# driver's per-read path; docs/simulator.md, docs/driver.md) and the C twins (TWINS: the driver's
# counting scan): rebuilt when they change
NATIVE_STAMP := $(VENV)/.native-stamp
NATIVE_SOURCES := src/phaselens/native.py $(wildcard src/phaselens/sim/*.py) \
	$(addprefix src/phaselens/driver/,history.py http.py openai.py scan.py scan.c)

.PHONY: install native demo test lint typecheck unit e2e engines browser prometheus gateway bench clean fuzz

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP) $(NATIVE_STAMP)
	@$(VENV)/bin/phaselens --version  # says "pure" where the build fell back (no C compiler)

$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	$(PY) -m pip install -q --no-deps -e .
	touch $(NATIVE_STAMP)
	@$(VENV)/bin/phaselens --version

install: $(STAMP) $(NATIVE_STAMP)

# rebuild the compiled simulator now (PHASELENS_PURE_PYTHON=1 at run time: the pure-Python one)
native: $(STAMP)
	$(PY) -m pip install -q --no-deps -e .
	touch $(NATIVE_STAMP)
	@$(VENV)/bin/phaselens --version

demo: install
	$(VENV)/bin/phaselens demo

lint: install
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

unit: install prometheus
	$(PY) -m pytest -m "not e2e"

# Real engines (llama.cpp server, vLLM CPU build), built once and cached outside the clone.
engines: install
	bash scripts/engines/install.sh

# Debian's chromium for the HTML report tests (a real browser opens the report).
browser:
	bash scripts/install_browser.sh

# Debian's Prometheus (prometheus, promtool) for the watch tests: `promtool check/test rules` on
# the shipped alert rules, and a real server on loopback scraping `phaselens watch --listen`.
prometheus:
	bash scripts/install_prometheus.sh

# Debian's nginx as a real gateway with a queue cap (limit_conn answers 503) in front of vLLM, for
# the flow-control tests (tests/e2e/test_flowcontrol_vllm.py): every 503 must be a `shed` record.
gateway:
	bash benchmarks/install_peers.sh nginx

e2e: engines prometheus gateway
	$(PY) -m pytest -m e2e

test: lint typecheck engines browser prometheus gateway
	$(PY) -m pytest

# The fuzzing suite at length: bad specs, deployments, traces, calibrations, options and damaged
# run directories through every command (`make test` runs a short fixed sample of it).
# FUZZ_EXAMPLES per property; PHASELENS_FUZZ_COLLECT=FILE lists every failure instead of stopping.
FUZZ_EXAMPLES ?= 500
fuzz: install
	PHASELENS_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/fuzz -q -p no:cacheprovider

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache runs build
	rm -f src/*__mypyc*.so src/phaselens/sim/*.so src/phaselens/sim/_native_digest.txt
	rm -f src/phaselens/driver/*.so src/phaselens/driver/_native_digest.txt
