# The two set-up commands of the README: `make reproduce` and `make test`.
# Both create .venv when it is missing. torch is installed first so that pip does not
# resolve the bare `torch>=2.6` requirement to a multi-GB CUDA build; GPU users set
# TORCH_SPEC (e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124").
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PRESET ?= cpu
OUT ?= reports
PY := $(VENV)/bin/python

.PHONY: venv test reproduce clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest

reproduce: venv
	$(VENV)/bin/seamkit reproduce --preset $(PRESET) --out $(OUT)

clean:
	rm -rf $(VENV) .cache reports runs
