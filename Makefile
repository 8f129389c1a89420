# spotctl — set-up, demo, tests, docs and benchmarks.
#   make demo   create .venv, install spotctl, show the demo region's plan and run a pass
#   make test   start the test services, run every test, stop the services
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# a venv that lost its python or pip is reinstalled even when its stamp is there
ifneq ($(shell $(PY) -c 'import pip' >/dev/null 2>&1 && echo ok),ok)
.PHONY: $(STAMP)
endif

.PHONY: demo test install bootstrap lint unit docs docs-check bench bench-planner bench-services testenv-up testenv-down clean

bootstrap:
	@scripts/bootstrap.sh

$(STAMP): pyproject.toml
	@scripts/bootstrap.sh
	@# a venv whose pip does not run (an interrupted or failed creation) is rebuilt, never reused
	@if ! $(PY) -m pip --version >/dev/null 2>&1; then \
	  rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && $(PY) -m pip --version >/dev/null \
	  || { rm -rf $(VENV); echo "make: could not create a working virtual environment in $(VENV)" >&2; exit 1; }; \
	fi
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

demo: install
	@echo "== spotctl plan (demo region: a simulated cloud, provider, Kubernetes and Slurm) =="
	@$(BIN)/spotctl -o table plan
	@echo
	@echo "== spotctl reconcile (one pass, as the timer runs it) =="
	@$(BIN)/spotctl -o table reconcile
	@echo
	@echo "== spotctl status =="
	@$(BIN)/spotctl -o table status
	@echo
	@echo "Next: $(BIN)/spotctl plan --explain | $(BIN)/spotctl simulate --hours 24 | $(BIN)/spotctl --help"

lint: install
	@$(BIN)/lint-imports --no-cache
	@$(BIN)/mypy

docs: install
	@$(PY) -m spotctl.cli.docgen

docs-check: install
	@$(PY) -m spotctl.cli.docgen --check

testenv-up:
	@scripts/testenv/all up

testenv-down:
	@scripts/testenv/all down

# The whole suite: import contracts and the type check, then every test, with the real services up.
test: install
	@$(BIN)/lint-imports --no-cache
	@$(BIN)/mypy || { echo "make test: the type check failed (see above; run \`make lint\`)" >&2; exit 1; }
	@# a service that fails to start fails the run, and what did start is stopped again
	@scripts/testenv/all up || { rc=$$?; scripts/testenv/all down || true; echo "make test: a test service did not start" >&2; exit $$rc; }
	@set -o pipefail; rc=0; SPOTCTL_REQUIRE_SERVICES=1 $(BIN)/pytest -q -p no:cacheprovider || rc=$$?; \
	  scripts/testenv/all down || true; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; fi; exit $$rc

bench: install
	@$(PY) benchmarks/run.py

# Planner quality (issue 18): spotctl's planner vs a price-greedy baseline and a per-decision MILP bound (HiGHS,
# the `bench` extra, installed here) over benchmarks/scenarios; BENCH_ARGS=--quick for a small subset.
bench-planner: install
	@$(PY) -c 'import highspy' >/dev/null 2>&1 || $(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	@$(PY) benchmarks/planner_quality.py $(BENCH_ARGS)

# Benchmarks against the real test services (brought up and stopped here), and `bundle serve` under
# 1,000 mutual-TLS agents on loopback (benchmarks/bundle_serve.py, which starts its own server).
bench-services: install
	@scripts/testenv/all up || { rc=$$?; scripts/testenv/all down || true; exit $$rc; }
	@rc=0; for b in relay schedulers storm demand os_cloud bundle_serve; do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py || rc=1; done; \
	  scripts/testenv/all down || true; exit $$rc

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
