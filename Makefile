# Two commands: `make demo` and `make test`. Everything else installs itself.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
comma  := ,
EXTRAS ?= dev,sim,fpga,torch
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install tools demo test deep bench lint clean

install: $(STAMP)

# the native engine is compiled at install (scikit-build-core, CMake tree in build/): a change
# to its C++ sources reinstalls, which recompiles only what changed
NATIVE_SRC := host/native/CMakeLists.txt $(wildcard host/native/src/*.cpp host/native/src/*.hpp)

$(STAMP): pyproject.toml $(NATIVE_SRC)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@rm -f $(VENV)/.installed-*
	@touch $@

# Debian packages PyPI has none of, installed when we can: tshark checks the Wireshark
# dissectors; libusb and libftdi are what openFPGALoader (optireduce board program) loads.
tools:
	@missing=""; \
	command -v tshark >/dev/null 2>&1 || missing="$$missing tshark"; \
	ldconfig -p | grep -q 'libusb-1.0.so.0 ' || missing="$$missing libusb-1.0-0"; \
	ldconfig -p | grep -q 'libftdi1.so.2 ' || missing="$$missing libftdi1-2"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages:$$missing"; \
	    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing:$$missing; install them (apt-get install$$missing) or set OPTIREDUCE_NO_TSHARK=1 for the dissector tests"; \
	  fi; \
	fi

demo: install
	$(VENV)/bin/optireduce demo

test: install tools
	$(PY) -m pytest -n 2 -q --durations=25 -m "not deep"

# the checks too long for make test (tests marked deep: the aggregator's bounded model
# checks, two solvers at a time; the whole core in amaranth.sim; the native sources under
# AddressSanitizer and UBSan; the wheel, its engine compiled again); CI runs them after
# make test
deep: install tools
	$(PY) -m pytest -n 2 -q --durations=10 -m deep

# every `optireduce bench` group that is installed, one JSON file (also printed)
bench: install
	$(VENV)/bin/optireduce bench all --json -o bench.json

# board bitstreams (yowasp, no programmer): one board, or all of them (not in `make test`);
# the default is a board whose whole NIC fits and meets its clocks (docs/boards.md)
BOARD ?= ecpix5
.PHONY: bitstream bitstream-all
bitstream: install
	$(VENV)/bin/optireduce build bitstream --board $(BOARD)

bitstream-all: install
	$(VENV)/bin/optireduce bench fpga --json

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
