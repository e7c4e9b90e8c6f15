# flax_xalign developer targets.
#
#   make demo    create .venv (python3.11) if missing, install '.[test,interop,aot]', run the demo
#   make bench   install '.[bench]' if needed, run bench/train_throughput.py
#   make lint    shellcheck tpu_launch.sh, .ci/run and tools/*.sh
#   make test    install if needed, run the unit tier (pytest.ini's default selection) with xdist
#   make test-contract    the entry points' contracts (in-process smoke runs, one-error-line refusals)
#   make test-subprocess  the tests that start a fresh Python (multi-process, SIGKILL, quiet start, ...)
#   make test-slow        full kernel grids, exact-resume and fault integration runs, real-size runs
#   make test-aot   the ahead-of-time TPU pod compile checks (pytest -m aot on AOT_TESTS; minutes)
#   make test-t5x   the t5x adapter against real t5x (.venv-t5x over .venv, from ../shared/vendor)
#   make install-t5x  only make .venv-t5x (test-t5x does it too; up to date = a no-op)
#   make test-beam  create .venv-beam, install '.[beam]' + pytest, run tests/data/test_cooc_beam.py + test_cache_beam.py
#   make test-all   every tier above, one after the other
#   make debian-data  download + unpack the Debian packages of the multilingual data (no root)
#
# Variables: PYTHON (interpreter for a new venv, default python3.11), VENV, INSTALLER (pip: install
# with pip only; by default uv does, tools/pip_install.sh),
# EXTRAS (what `make install` installs, default test,interop,aot; EXTRAS=test
# leaves out torch + transformers, and the HF interop tests then skip),
# PYTEST_WORKERS (xdist workers, 0 or 1 = no xdist), PYTEST_ARGS (extra pytest
# args, e.g. PYTEST_ARGS='-m slow' or PYTEST_ARGS='tests/ops -k sinkhorn'),
# DEMO_ARGS, BENCH_ARGS, PYTEST_RC_FILE (if set, `make test` writes pytest's
# own exit status there; make itself only ever exits 2 on failure).
#
# Installs are skipped while a stamp inside the venv matches the current
# contents of setup.py + pyproject.toml; editing either reinstalls.

SHELL := /bin/bash

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# `pip install`, done by uv (installed into the venv) where it can be: the same resolution, faster on a
# clean install (tools/pip_install.sh says how much); INSTALLER=pip uses pip only.
INSTALL := bash tools/pip_install.sh

PACKAGING_HASH := $(shell cat setup.py pyproject.toml 2>/dev/null | sha1sum | cut -c1-12)
# test: pytest & co.; interop: torch (CPU wheel via find-links) + transformers,
# the reference forward of tests/interop/test_hf*.py (+~45 s, +1 GB measured);
# aot: libtpu, for compiling train steps for TPU topologies on this machine.
EXTRAS ?= test,interop,aot
comma := ,
EXTRAS_TAG := $(subst $(comma),+,$(EXTRAS))
STAMP_TEST := $(VENV)/.installed-$(EXTRAS_TAG)-$(PACKAGING_HASH)
STAMP_BENCH := $(VENV)/.installed-bench-$(PACKAGING_HASH)

PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=
PYTEST_RC_FILE ?=
DEMO_ARGS ?=
BENCH_ARGS ?=
# --dist loadfile keeps a test file on one worker, so module-scoped fixtures
# (trained vocabularies, compiled steps) are built once per file; the files are
# handed out longest first (tests/scheduling.py orders them; xdist's own
# reordering by number of tests is off).
XDIST := $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: help demo test test-contract test-subprocess test-slow install-t5x test-t5x test-all test-aot debian-data bench lint install install-bench clean distclean install-beam test-beam

help:
	@sed -n '2,/^$$/{/^#/s/^# \{0,1\}//p}' Makefile

$(PY):
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install CPython 3.11 or pass PYTHON=/path/to/python3.11" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "error: $(PYTHON) is not CPython 3.11 (setup.py requires >=3.11,<3.12)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP_TEST): | $(PY)
	$(INSTALL) $(PY) -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.installed-$(EXTRAS_TAG)-*
	@touch $@

$(STAMP_BENCH): | $(PY)
	$(INSTALL) $(PY) -e '.[bench]'
	@rm -f $(VENV)/.installed-bench-*
	@touch $@

install: $(STAMP_TEST)

install-bench: $(STAMP_BENCH)

demo: $(STAMP_TEST)
	$(PY) -m flax_xalign.cli.demo $(DEMO_ARGS)

# One pytest run of interpreter $(1) on selection $(2); PYTEST_RC_FILE receives pytest's own exit status.
define run_pytest
	@echo "$(1) -m pytest -q $(2) $(PYTEST_ARGS)"
	@rc=0; $(1) -m pytest -q $(2) $(PYTEST_ARGS) || rc=$$?; \
	if [ -n "$(PYTEST_RC_FILE)" ]; then echo "$$rc" > "$(PYTEST_RC_FILE)"; fi; \
	exit "$$rc"
endef

# The tiers (pytest.ini, tests/tiers.py). Each test runs in exactly one of these selections:
# slow > subprocess > contract, and aot / t5x only in their own targets.
MARK_CONTRACT := contract and not slow and not subprocess and not aot and not t5x
MARK_SUBPROCESS := subprocess and not slow and not aot and not t5x
MARK_SLOW := slow and not aot and not t5x

test: $(STAMP_TEST)
	$(call run_pytest,$(PY),$(XDIST))

test-contract: $(STAMP_TEST)
	$(call run_pytest,$(PY),$(XDIST) -m '$(MARK_CONTRACT)')

test-subprocess: $(STAMP_TEST)
	$(call run_pytest,$(PY),$(XDIST) -m '$(MARK_SUBPROCESS)')

test-slow: $(STAMP_TEST)
	$(call run_pytest,$(PY),$(XDIST) -m '$(MARK_SLOW)')

# The AOT compile checks of XLM-R base/large for TPU v4 slices (README "Scale"):
# three compiles of 4-8 min each and a tiny one, one per xdist worker; all but the large
# compile run niced, so that it keeps a core (tests/training/test_aot.py). Only AOT_TESTS is collected:
# collecting every test file costs each worker ~19 s of CPU more (measured), and the aot
# mark is used nowhere else (tests/test_tiers.py checks that).
AOT_TESTS ?= tests/training/test_aot.py
AOT_XDIST ?= -n 4 --dist load
test-aot: $(STAMP_TEST)
	$(call run_pytest,$(PY),-m aot $(AOT_TESTS) $(AOT_XDIST))

# Real t5x, airio and jestimator are not on PyPI: their source snapshots live in ../shared/vendor
# (VENDOR). .venv-t5x layers them over .venv without touching it (tools/make_t5x_venv.sh); without
# the snapshots the target says so and exits 0. Users install t5x from its repository instead.
VENDOR ?= ../shared/vendor
VENV_T5X ?= .venv-t5x
install-t5x: $(STAMP_TEST)
	@if [ ! -f "$(VENDOR)/install_t5x.sh" ]; then \
	  echo "NOTICE: $(VENDOR)/install_t5x.sh not found: $(VENV_T5X) is not made"; exit 0; fi
	bash tools/make_t5x_venv.sh $(VENV) $(VENV_T5X) $(VENDOR)

test-t5x: $(STAMP_TEST)
	@if [ ! -f "$(VENDOR)/install_t5x.sh" ]; then \
	  echo "NOTICE: $(VENDOR)/install_t5x.sh not found: the real-t5x tests are skipped (users install t5x from its repository, then run pytest -m t5x)"; \
	  if [ -n "$(PYTEST_RC_FILE)" ]; then echo skipped > "$(PYTEST_RC_FILE)"; fi; exit 0; fi
	bash tools/make_t5x_venv.sh $(VENV) $(VENV_T5X) $(VENDOR)
	$(call run_pytest,$(VENV_T5X)/bin/python,-m t5x tests/interop/test_t5x_real.py)

test-all: test test-contract test-subprocess test-slow test-aot test-t5x test-beam

bench: $(STAMP_BENCH)
	$(PY) bench/train_throughput.py $(BENCH_ARGS)

# Apache Beam (flax_xalign.data.cooc.beam) in an environment of its own: the
# `beam` extra needs protobuf < 7 and sentencepiece < 0.2.3, the main .venv
# has protobuf 7 (setup.py says why). Measured here: ~3 min to install.
VENV_BEAM ?= .venv-beam
PY_BEAM := $(VENV_BEAM)/bin/python
STAMP_BEAM := $(VENV_BEAM)/.installed-beam-$(PACKAGING_HASH)

$(PY_BEAM):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "error: $(PYTHON) is not CPython 3.11 (setup.py requires >=3.11,<3.12)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV_BEAM)

$(STAMP_BEAM): | $(PY_BEAM)
	$(INSTALL) $(PY_BEAM) -e '.[beam]' 'pytest>=8'
	@rm -f $(VENV_BEAM)/.installed-beam-*
	@touch $@

install-beam: $(STAMP_BEAM)

# Its unit and subprocess tests (the cache writer's parallel run starts Beam workers); the contract tests
# of both files need no Beam and run in the main environment's test-contract.
test-beam: $(STAMP_BEAM)
	$(call run_pytest,$(PY_BEAM),tests/data/test_cooc_beam.py tests/data/test_cache_beam.py \
	  -m 'not contract and not slow and not aot and not t5x')

# The Debian packages `xalign debian_data` reads (LibreOffice help and UI
# catalogues, dictionaries), fetched with `apt-get download` and unpacked with
# `dpkg-deb -x`: no root and none of LibreOffice's 300 dependencies (58 MB of
# .deb, ~10 s). Then: xalign debian_data --root=$(DEBIAN_ROOT) --output=DIR
DEBIAN_ROOT ?= $(HOME)/.cache/flax_xalign/debroot
DEBIAN_PACKAGES = libreoffice-help-en-us libreoffice-help-de libreoffice-help-fr libreoffice-help-es \
  libreoffice-help-ru libreoffice-help-zh-cn libreoffice-help-ja libreoffice-help-hi \
  libreoffice-l10n-de libreoffice-l10n-fr libreoffice-l10n-es libreoffice-l10n-ru libreoffice-l10n-zh-cn \
  libreoffice-l10n-ja libreoffice-l10n-hi libreoffice-l10n-ar trans-de-en \
  dict-freedict-eng-fra dict-freedict-eng-deu dict-freedict-eng-hin dict-freedict-eng-ara \
  libreoffice-help-el libreoffice-l10n-el dict-freedict-eng-ell dict-freedict-eng-rus mueller7-dict \
  dict-freedict-ell-eng dict-freedict-fra-eng dict-freedict-deu-eng dict-freedict-ara-eng

debian-data:
	@command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || { echo "error: debian-data needs apt-get and dpkg-deb (a Debian/Ubuntu machine)" >&2; exit 1; }
	mkdir -p $(DEBIAN_ROOT).debs $(DEBIAN_ROOT)
	cd $(DEBIAN_ROOT).debs && apt-get download -q $(DEBIAN_PACKAGES)
	for f in $(DEBIAN_ROOT).debs/*.deb; do dpkg-deb -x "$$f" $(DEBIAN_ROOT) || exit 1; done
	@echo "unpacked into $(DEBIAN_ROOT): export FLAX_XALIGN_DEBIAN_ROOT=$(DEBIAN_ROOT)"

lint:
	shellcheck tpu_launch.sh .ci/run $(wildcard tools/*.sh)

clean:
	rm -rf build dist *.egg-info .pytest_cache

distclean: clean
	rm -rf $(VENV) $(VENV_BEAM) $(VENV_T5X)
