# The two set-up commands of the README, `make reproduce` and `make test`, and `make findings`: every
# headline figure rerun on this machine from a clean commit (bench/results/findings/, docs/findings.md).
# Each creates .venv when it is missing. torch is installed first, at the version the kit is
# tested with (pyproject.toml and environment.yml ask for the same), so that pip does not resolve
# `torch>=2.13` to another build; TORCH_SPEC names another wheel index (e.g. a CUDA version's).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PRESET ?= cpu
OUT ?= reports
# pytest-xdist workers of `make test` (tests/conftest.py says how the files are shared among them)
TEST_WORKERS ?= 2
PY := $(VENV)/bin/python

.PHONY: venv test reproduce findings clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

reproduce: venv
	$(VENV)/bin/seamkit reproduce --preset $(PRESET) --out $(OUT)

findings: venv
	$(VENV)/bin/seamkit findings --preset $(PRESET)

clean:
	rm -rf $(VENV) .cache reports runs
