# The two commands of the README: `make bench` and `make test`. Each installs what it is missing.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
BENCH_ARGS ?= --compare

.PHONY: bench test lint rust-test deps-system build help

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
