# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs the package with its test extras when missing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: venv demo test test-fast serve bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m alpaviz demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not browser" $(PYTEST_ARGS)

serve: $(STAMP)
	$(PY) -m alpaviz serve

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) demo_report.html tests/artifacts .pytest_cache
