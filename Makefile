# Everything the project needs is installed by these targets; nothing by hand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test lint typecheck pytest bench demo clean

$(BIN)/pytest: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/pytest

install: $(BIN)/pytest

lint: install
	$(BIN)/ruff check fusee tests bench
	$(BIN)/ruff format --check fusee tests bench

typecheck: install
	$(BIN)/mypy

pytest: install
	$(BIN)/pytest -q

test: lint typecheck pytest

bench: install
	$(BIN)/python bench/run.py

demo: install
	@echo "The demo (examples/checkout.py) arrives with the engine (issue 4)."
	$(BIN)/python -c "import fusee; print('fusee', fusee.__version__, 'is installed')"

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
