# DFlash Chat: two commands on a fresh machine.
#   make run   set up .venv if needed, then open the app (or, with no display,
#              say so and run the headless comparison on the bundled demo pair)
#   make test  set up .venv if needed, then run the whole suite
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UNAME := $(shell uname -s)
# First Python >= 3.11 on PATH (python3.13 ... python3).
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; break; }; done)
EXTRAS := test
# processes make test-fast runs its tests in (pytest-xdist); make test runs them in one
TEST_WORKERS ?= 2

# Linux: mlx-cpu links a reference BLAS; load Debian's OpenBLAS ahead of it
# when present (see README, "Performance"). macOS is untouched.
ifeq ($(UNAME),Linux)
BLAS_LIB = $(firstword $(wildcard /usr/lib/*/openblas-pthread/libblas.so.3))
# One OpenBLAS thread unless OPENBLAS_NUM_THREADS is set (app/engine/blas.py says why).
RUN_ENV = $(if $(BLAS_LIB),LD_PRELOAD=$(BLAS_LIB) DFLASH_BLAS_PRELOADED=$(BLAS_LIB) \
	OPENBLAS_NUM_THREADS=$(or $(OPENBLAS_NUM_THREADS),1))
else
RUN_ENV =
endif

.PHONY: help run test test-fast lint venv blas x11libs app bench clean

help:
	@echo "make run    set up and run DFlash Chat (headless comparison when there is no display)"
	@echo "make test   set up and run the whole test suite"
	@echo "make test-fast  a quicker tier in two processes: no tests marked slow, one block"
	@echo "            size in the block-size matrices (4 min 25 s on this project's 2-core CPU)"
	@echo "make lint   ruff"
	@echo "make bench  benchmark plain vs DFlash on the bundled pair"
	@echo "make app    build the desktop bundle for this platform (PyInstaller)"

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: need Python >= 3.11 on PATH" >&2; exit 2; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

venv: $(STAMP)

# Installs Debian's OpenBLAS when running as root with apt (as in CI); never fatal.
blas:
ifeq ($(UNAME),Linux)
	@if [ -z "$(BLAS_LIB)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing an optimized BLAS (libopenblas0-pthread) for MLX on CPU"; \
		(apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1)) \
		|| echo "warning: could not install libopenblas0-pthread; DFlash will be slow on this CPU"; \
	fi
endif

# Qt's X11 plugin needs a few xcb libraries that PySide6's wheel does not ship; installed
# when running as root with apt and an X11 display (never fatal; the app says what is missing).
x11libs:
ifeq ($(UNAME),Linux)
	@if [ -n "$$DISPLAY" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		! { ldconfig -p | grep -q libxcb-cursor.so.0 && ldconfig -p | grep -q libxcb-icccm.so.4 && \
		    ldconfig -p | grep -q libxcb-keysyms.so.1; }; then \
		echo "Installing the xcb libraries Qt needs for a window (libxcb-cursor0 ...)"; \
		apt-get install -y -qq libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 >/dev/null 2>&1 || \
		(apt-get update -qq >/dev/null 2>&1 && \
		 apt-get install -y -qq libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 >/dev/null 2>&1) || \
		echo "warning: could not install the xcb libraries; the app will say what is missing"; \
	fi
endif

run: $(STAMP) blas x11libs
	@$(MAKE) --no-print-directory _run

_run:
	@$(RUN_ENV) $(PY) -m app

test: $(STAMP) blas
	@$(MAKE) --no-print-directory _test

_test:
	@if [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] || [ "$(UNAME)" = Linux ]; then export QT_QPA_PLATFORM=$${QT_QPA_PLATFORM:-offscreen}; fi; \
	HF_HUB_OFFLINE=1 $(RUN_ENV) $(PY) -m app --version && \
	HF_HUB_OFFLINE=1 $(RUN_ENV) $(PY) -m pytest -q --durations=15 $(PYTEST_ARGS)

# The fast tier (not what CI runs: that is make test): tests marked slow left out
# (-m "not slow"), DFLASH_TEST_FAST=1 cuts the block-size matrices to one block size, both
# rollbacks kept (tests/engine_fixtures.py), and the exactness matrix's 8-bit and float16
# variants; the tests run in TEST_WORKERS pytest-xdist processes.
# Measured: 4 min 25 s on the 2-core Linux machine, idle (1398 passed, 52 skipped,
# 2026-12-07; runs took 3 min 58 s to 5 min 37 s over three days as the VM's speed and load
# varied).
test-fast: $(STAMP) blas
	@$(MAKE) --no-print-directory _test-fast

_test-fast:
	@DFLASH_TEST_FAST=1 $(MAKE) --no-print-directory _test PYTEST_ARGS='-m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)'

lint: $(STAMP)
	$(VENV)/bin/ruff check app tests tools packaging

bench: $(STAMP) blas
	@$(MAKE) --no-print-directory _bench

_bench:
	$(RUN_ENV) $(PY) -m app bench

app: $(STAMP)
	$(PY) -m pip install -q -e ".[$(EXTRAS),app]"
	$(PY) -m PyInstaller --noconfirm --clean --distpath dist --workpath build packaging/dflash_chat.spec
	@if [ "$(UNAME)" = Darwin ]; then echo "Built dist/DFlash Chat.app (unsigned; packaging/build_macos.sh signs, notarizes and makes a DMG: docs/packaging.md)"; \
	else echo "Built dist/DFlash Chat/dflash-chat (one-folder bundle; docs/packaging.md)"; fi

clean:
	rm -rf build dist .pytest_cache
