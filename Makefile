# Everything the project needs is installed by these targets; nothing by hand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install system-deps test lint typecheck pytest sim torture bench bench-restate demo docs docs-serve clean

# pip's output goes to a log, shown only when an install fails.
LOG := $(VENV)/install.log
quietly = { $(1); } > $(LOG) 2>&1 || { cat $(LOG); \
	echo "make: installing into $(VENV) failed; pip's output is above and in $(LOG)" >&2; exit 1; }

$(BIN)/pytest: pyproject.toml
	@echo "installing fusee and its development tools into $(VENV) (about a minute; log: $(LOG))"
	@$(PY) -m venv $(VENV)
	@$(call quietly,$(BIN)/pip install --upgrade pip && $(BIN)/pip install -e '.[dev]')
	@touch $(BIN)/pytest

install: $(BIN)/pytest

# PostgreSQL and Chromium, for the Postgres store's and the UI's tests.
system-deps:
	@scripts/system-deps.sh

lint: install
	$(BIN)/ruff check fusee tests bench examples
	$(BIN)/ruff format --check fusee tests bench examples
	$(BIN)/python scripts/check_layers.py

typecheck: install
	$(BIN)/mypy

# Test processes (pytest-xdist); 0 runs the suite in this one.
PYTEST_WORKERS ?= 2
pytest: install system-deps
	$(BIN)/pytest -q -n $(PYTEST_WORKERS)

test: lint typecheck pytest

# The seeded simulator (tests/sim): SEEDS seeds from 1 (or the one SEED) on
# STORE (memory, sqlite or both); LATE_READS=1 answers the engine's reads of
# a run's row a few loop turns late. A failing seed prints the command that
# reproduces it. `make test` runs a fixed list of seeds (tests/sim/test_sim.py).
MACHINE_CASES ?= 10000
SEEDS ?= 20
STORE ?= both
sim: install
	$(BIN)/python -m tests.sim --seeds $(SEEDS) --store $(STORE) $(if $(SEED),--seed $(SEED)) \
		$(if $(LATE_READS),--late-reads)
	FUSEE_MACHINE_CASES=$(MACHINE_CASES) $(BIN)/pytest -q -o timeout=0 tests/test_machine_model.py

# Not in CI: SIGKILLs of real worker processes on SQLite (or TORTURE_STORE: a
# postgresql:// URL, or "postgres" for a throwaway server; TORTURE_WORKERS=N
# workers at once on it), for MINUTES minutes; appends its figures to bench/RESULTS.md.
MINUTES ?= 10
torture: install
	$(BIN)/python -m tests.sim.torture --minutes $(MINUTES) \
		$(if $(filter postgres,$(TORTURE_STORE)),--postgres,$(if $(TORTURE_STORE),--store $(TORTURE_STORE))) \
		$(if $(TORTURE_WORKERS),--workers $(TORTURE_WORKERS))

bench: install
	$(BIN)/python bench/run.py

# Optional, not in `make bench`: fusee and Restate side by side. Installs
# Restate's server (npm) and Python SDK (PyPI) under bench/ on first use.
bench-restate: install
	$(BIN)/python bench/run.py restate_compare

# The checkout demo on ./data: kill it during its cool-off (Ctrl-C or kill -9)
# and run `make demo` again: it resumes the same run.
demo: install
	$(BIN)/python examples/checkout.py

# The docs' tools are installed on demand, not by `make install`.
$(BIN)/mkdocs: pyproject.toml | $(BIN)/pytest
	@echo "installing the docs' tools (mkdocs) into $(VENV) (log: $(LOG))"
	@$(call quietly,$(BIN)/pip install -e '.[docs]')
	@touch $(BIN)/mkdocs

docs: $(BIN)/mkdocs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(BIN)/mkdocs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache site
