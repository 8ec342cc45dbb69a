# trainbook — the two commands:
#   make demo   set up everything, then run the main job
#   make test   set up everything, then run every test
SHELL := /bin/bash
.DEFAULT_GOAL := help
export LIBTORCH := $(CURDIR)/.libtorch
CARGO ?= cargo

.PHONY: help setup build test test-quick demo bench clean

# Every make run records how long each phase took (scripts/phase.sh); `make test`, `make
# test-quick` and `make demo` print the table at the end, and a failing phase prints it too.
# A make started by a test (tests/docker runs the build's steps) records nothing.
ifeq ($(MAKELEVEL)$(PYTEST_CURRENT_TEST),0)
export TRAINBOOK_PHASES := $(CURDIR)/target/phases/$(shell date +%Y%m%d-%H%M%S).tsv
else
unexport TRAINBOOK_PHASES
endif
PHASE = scripts/phase.sh

help:
	@echo "make demo   - set up (system packages, .venv with torch, build) and run the main job"
	@echo "make test   - set up and run every test"
	@echo "make test-quick - unit tests and one end-to-end job (the inner loop; a few minutes warm)"
	@echo "make bench  - run the benchmarks (writes docs/benchmarks.md figures to stdout)"

setup:
	@$(PHASE) setup scripts/setup.sh

# Every cargo run of these targets goes through scripts/cargo.sh, which adds the features set-up
# chose (scripts/cargo-features.sh: `cuda` on a machine whose nvidia-smi sees a GPU, `hpu` where
# torch's Python can be embedded, with PYO3_PYTHON naming it): one configuration, so no target
# undoes another's build.
CARGO_WS = env CARGO=$(CARGO) scripts/cargo.sh

# The default members (everything but the kernel's trainbook_torch library, which
# build-torch-library.sh makes). On a machine set-up has not reached yet (no .libtorch), the
# crates that need neither libtorch nor set-up's Python compile beside set-up, which mostly waits
# on downloads (scripts/compile-beside-setup.sh); if set-up fails, that compile is stopped.
build:
	@if [ -f .libtorch/build-version ]; then $(PHASE) setup scripts/setup.sh; else \
	  $(PHASE) "cargo build beside set-up" scripts/compile-beside-setup.sh & early=$$!; \
	  $(PHASE) setup scripts/setup.sh || { pkill -TERM -P $$early; wait; exit 1; }; wait $$early; fi
	@$(PHASE) "cargo build" $(CARGO_WS) build --release --bins
	@$(PHASE) "trainbook_torch library" scripts/build-torch-library.sh
	@scripts/install-bins.sh
	@scripts/install-kernel.sh

test: build
	@$(PHASE) "structure" python3 scripts/check-structure.py
	@$(PHASE) "docs" python3 scripts/check-docs.py
	@$(PHASE) "cargo test" $(CARGO_WS) test --release -- --test-threads=1
	@# The torch pairs check (a compile) runs beside pytest at a low priority, on the cycles
	@# pytest's waiting tests leave free; its output follows pytest's.
	@mkdir -p target; $(PHASE) "torch pairs (beside pytest)" nice -n 15 scripts/check-torch-pairs.sh > target/torch-pairs.log 2>&1 & pairs=$$!; \
	  $(PHASE) "pytest" scripts/test-kernel.sh; rc=$$?; \
	  wait $$pairs; prc=$$?; cat target/torch-pairs.log; \
	  [ $$rc = 0 ] && [ $$prc = 0 ] || { $(PHASE) --report; exit 1; }
	@$(PHASE) "browser" scripts/test-browser.sh
	@$(PHASE) --report

# The inner loop: every crate's unit tests and one end-to-end job through the kernel.
test-quick: build
	@$(PHASE) "cargo unit tests" $(CARGO_WS) test --release --lib --bins -- --test-threads=1
	@$(PHASE) "one job end to end" scripts/test-kernel.sh tests/kernel/test_kernel.py -k "execute_returns_a_result or background_job_display_updates"
	@$(PHASE) --report

# notebooks/bert.ipynb, executed headless; prints where the executed copy is.
demo: build
	@$(PHASE) "demo notebook" scripts/demo.sh
	@$(PHASE) --report

bench: build
	@scripts/bench.sh

clean:
	$(CARGO) clean
	rm -rf .libtorch trainbook_runs
