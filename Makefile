# Two commands: `make demo` and `make test`.  Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SAMPLE := sample_traces/job_2ranks
SAMPLE_GPU := sample_traces/h100_bert_small

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
demo: $(VENV)/.installed
	@if [ -t 0 ] && [ -t 1 ]; then \
		$(VENV)/bin/tracelens open $(SAMPLE); \
	else \
		$(VENV)/bin/tracelens info $(SAMPLE) && \
		$(VENV)/bin/tracelens report $(SAMPLE) && \
		$(VENV)/bin/tracelens report $(SAMPLE_GPU); \
	fi

test: $(VENV)/.test-installed
	$(PY) -m pytest -q

bench: $(VENV)/.test-installed
	$(PY) benchmarks/parse.py

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
