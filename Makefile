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

test: $(VENV)/.test-installed
	$(PY) -m pytest -q

bench: $(VENV)/.test-installed
	$(PY) benchmarks/parse.py

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
