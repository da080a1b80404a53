# Two commands: `make demo` and `make test`.  Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test venv test-venv bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed
test-venv: $(VENV)/.test-installed

# the terminal UI where a terminal is attached, else the text reports
# (tracelens demo: the TUI where a terminal is attached, else the text report and an HTML page)
demo: $(VENV)/.installed
	$(VENV)/bin/tracelens demo

# the layers of DESIGN.md 8 first (.importlinter: each imports only the layers below it), then the suite:
# the tests on timed multi-process recordings alone (tests/conftest.py: RECORDING_FIXTURES), then
# every other test on both cores
test: $(VENV)/.test-installed
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -m recording --durations=10
	$(PY) -m pytest -q -m "not recording" -n 2 --dist worksteal --durations=25

bench: $(VENV)/.test-installed
	$(PY) benchmarks/parse.py

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
