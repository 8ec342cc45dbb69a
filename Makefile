# trainbook — the two commands:
#   make demo   set up everything, then run the main job
#   make test   set up everything, then run every test
SHELL := /bin/bash
.DEFAULT_GOAL := help
export LIBTORCH := $(CURDIR)/.libtorch
CARGO ?= cargo

.PHONY: help setup build test demo bench clean

help:
	@echo "make demo   - set up (system packages, .venv with torch, build) and run the main job"
	@echo "make test   - set up and run every test"
	@echo "make bench  - run the benchmarks (writes docs/benchmarks.md figures to stdout)"

setup:
	@scripts/setup.sh

# CUDA builds (set up on a machine whose nvidia-smi sees a GPU) add the `cuda` feature; builds
# whose torch Python can be embedded add `hpu` (Intel Gaudi through its Python bridge), with
# PYO3_PYTHON naming that Python.
FEATURES = $$(test "$$(cat .libtorch/cuda 2>/dev/null)" = 1 && echo --features trainbook/cuda) \
	$$(test -s .libtorch/hpu-python && echo --features trainbook/hpu)
PYO3 = PYO3_PYTHON=$$(cat .libtorch/hpu-python 2>/dev/null || echo python3)

# The default members (everything but the kernel's prelude dylib, which build-prelude.sh makes).
build: setup
	$(PYO3) $(CARGO) build --release --bins $(FEATURES)
	@scripts/build-prelude.sh
	@scripts/install-bins.sh
	@scripts/install-kernel.sh

test: build
	$(PYO3) $(CARGO) test --release $(FEATURES) -- --test-threads=1
	@scripts/test-kernel.sh
	@scripts/test-browser.sh

# notebooks/bert.ipynb, executed headless; prints where the executed copy is.
demo: build
	@scripts/demo.sh

bench: build
	@scripts/bench.sh

clean:
	$(CARGO) clean
	rm -rf .libtorch trainbook_runs
