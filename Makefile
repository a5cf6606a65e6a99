# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs the package with its test extras when missing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: venv demo test test-fast serve bench clean browser-deps notebooks-html

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m alpaviz demo

# Chromium from Debian for the browser test (Playwright's own download is not used); quick when present.
browser-deps: $(STAMP)
	@test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
		|| echo "browser-deps: could not install chromium; tests/widgets/test_browser.py will fail and say so"
	@$(PY) -c "import playwright.sync_api" 2>/dev/null || $(PY) -m pip install -q playwright

# Two workers, one test file each at a time (module fixtures stay shared), slowest files first
# (tests/conftest.py): the machine has two cores.
# The Ray engine's tests run after them on their own: host actors beside another worker's load have died.
RAY_TESTS := tests/runtime/test_ray_engine.py
test: $(STAMP) browser-deps
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --ignore=$(RAY_TESTS) $(PYTEST_ARGS)
	$(PY) -m pytest $(RAY_TESTS) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not browser" $(PYTEST_ARGS)

serve: $(STAMP)
	$(PY) -m alpaviz serve

# Each notebook executed and exported to notebooks/html/ (figures as HTML, the editor as a static snapshot;
# widget state is cleared, which keeps the pages small and readable offline).
notebooks-html: $(STAMP)
	$(PY) -m jupyter nbconvert --to html --execute --ClearMetadataPreprocessor.enabled=True \
		--ExecutePreprocessor.timeout=600 --output-dir notebooks/html notebooks/*.ipynb

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) demo_report.html tests/artifacts .pytest_cache notebooks/html
