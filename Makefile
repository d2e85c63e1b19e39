# Everything a fresh machine needs is installed on first use: a virtualenv with bergstream and its Python
# dependencies, and the JVM jars pinned in bergstream/jvm/pom.xml (resolved once with Maven).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: setup demo test test-unit lint clean

$(INSTALLED): pyproject.toml
	sh deploy/install-system-packages.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,postgres]'
	@touch $@

setup: $(INSTALLED)
	$(BIN)/bergstream jars resolve
	$(BIN)/bergstream local install

demo: setup
	$(BIN)/bergstream demo

test: setup
	$(BIN)/pytest

test-unit: setup
	$(BIN)/pytest -m "not integration"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .bergstream .mypy_cache .ruff_cache .pytest_cache
