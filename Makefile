# Two commands: `make demo` and `make test`. Everything else installs itself.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
comma  := ,
EXTRAS ?= dev,sim,fpga,torch
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install demo test bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: install
	$(VENV)/bin/optireduce demo

test: install
	$(PY) -m pytest -n 2 -q

bench: install
	$(VENV)/bin/optireduce bench all --json

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
