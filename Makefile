# The two commands of the README: `make bench` and `make test`. Each installs what it is missing.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
BENCH_ARGS ?= --compare

.PHONY: bench test lint rust-test deps-system build help gpu-wheel gpu-test

help:
	@echo "make bench   install what is missing, build, run 'ferrio bench $(BENCH_ARGS)'"
	@echo "make test    every test: formatting, lints, Rust tests"

# fio and dd are the yardsticks of `ferrio bench --compare`.
deps-system:
	@command -v fio >/dev/null || { echo "installing fio"; \
	  (command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && S=sudo; \
	   $$S apt-get update -qq && $$S apt-get install -y -qq fio >/dev/null) ; }

build:
	$(CARGO) build --release -p ferrio-cli

bench: deps-system build
	./target/release/ferrio bench $(BENCH_ARGS)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -q

rust-test:
	$(CARGO) test --workspace

test: lint rust-test

# --- The GPU machine (no Rust toolchain there): build here, carry .carry/, run there. ---
# Here: the abi3 wheel (Python 3.11 here, 3.12 there), the CLI and the release test binary.
gpu-wheel:
	$(PYTHON) -m maturin build --release --out .carry/wheels
	$(CARGO) build --release -p ferrio-cli
	mkdir -p .carry/bin && cp target/release/ferrio .carry/bin/
	cp "$$($(CARGO) test --release -p ferrio --test tests --no-run --message-format=json 2>/dev/null \
	  | $(PYTHON) -c 'import json,sys; print([json.loads(l)["executable"] for l in sys.stdin if "\"executable\":\"/" in l][-1])')" \
	  .carry/bin/ferrio-tests

# There: install the carried wheels, run the Rust tests on the real GPU, then the Python GPU tests.
gpu-test:
	bash benchmarks/gpu_test.sh
