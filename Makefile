# The two commands of the README: `make bench` and `make test`. Each installs what it is missing.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
BENCH_ARGS ?= --compare
# moto[server]: the local S3 server of the remote-object tests (python/tests/test_remote.py);
# gcp-storage-emulator: the local GCS server of python/tests/test_remote_gcs.py.
# torch and transformers: the checkpoint interop tests (deps-torch). PyPI's only Linux torch
# brings about 5 GiB of CUDA libraries (it imports without a GPU once they are there); where it
# cannot be installed (a small disk) the note says so and those tests skip here. On the GPU
# machine torch is there and transformers is carried (benchmarks/gpu_all.sh).
# fusepy (with libfuse 2, a system package): the FUSE file system of the close-error tests
# (python/tests/fault_fs.py).
PY_TOOLS := maturin numpy pytest mypy ruff hypothesis safetensors "moto[server]" gcp-storage-emulator fusepy

.PHONY: help bench test lint rust-lint py-lint rust-test py-test deps-system deps-fuse deps-python deps-node deps-torch install \
	build gpu-wheel gpu-old gpu-nginx gpu-remote-peers gpu-moto gpu-peers gpu-tf gpu-fio gpu-test

help:
	@echo "make bench   install what is missing, build, run 'ferrio bench $(BENCH_ARGS)'"
	@echo "make test    every test: formatting, lints, Rust tests, Python tests, stub check"

# fio and dd are the yardsticks of `ferrio bench --compare`.
deps-system:
	@command -v fio >/dev/null || { echo "installing fio"; \
	  S=; [ "$$(id -u)" != 0 ] && S=sudo; \
	  $$S apt-get update -qq && $$S apt-get install -y -qq fio >/dev/null; }

# libfuse 2, which fusepy loads (the close-error tests mount a FUSE file system).
deps-fuse:
	@ldconfig -p | grep -q 'libfuse\.so\.2' || { echo "installing libfuse2"; \
	  S=; [ "$$(id -u)" != 0 ] && S=sudo; \
	  $$S apt-get update -qq && $$S apt-get install -y -qq libfuse2 >/dev/null; }

deps-python: deps-fuse
	@$(PYTHON) -c "import maturin, numpy, pytest, mypy, ruff, hypothesis, safetensors, moto.server, gcp_storage_emulator, fuse" 2>/dev/null || \
	  $(PYTHON) -m pip install -q $(PY_TOOLS)

# The versions the interop tests were last run with on this machine (transformers as carried to
# the GPU machine).
TORCH_TOOLS := torch==2.15.0 transformers==4.57.1
# An install that fails part way (a full disk) is taken out again, so the tests skip cleanly
# rather than fail to import a broken torch.
deps-torch:
	@$(PYTHON) -c "import torch, transformers" 2>/dev/null || \
	  { $(PYTHON) -m pip install -q $(TORCH_TOOLS) && $(PYTHON) -c "import torch, transformers"; } || \
	  { $(PYTHON) -m pip uninstall -q -y torch transformers >/dev/null 2>&1; \
	    echo "note: torch and transformers could not be installed; their interop tests skip"; }

# Azurite (the Azure Blob emulator of the az:// tests) comes from npm into .tools/; where npm's
# registry cannot be reached the tests use their own emulator, python/tests/azure_blob_server.py.
deps-node:
	@[ -x .tools/node_modules/.bin/azurite-blob ] || ! command -v npm >/dev/null || \
	  timeout 300 npm install -s --no-audit --no-fund --fetch-retries=1 --fetch-timeout=30000 --prefix .tools azurite >/dev/null 2>&1 || \
	  echo "note: npm could not install azurite into .tools; the az:// tests use their own emulator"

# The Python package, with the `ferrio` command (a release build of the whole engine).
install: deps-python
	$(PYTHON) -m pip install -q .

build:
	$(CARGO) build --release -p ferrio-cli

bench: deps-system install
	$(PYTHON) -m ferrio bench $(BENCH_ARGS)

rust-lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	# Without the tests the library builds without its `testing` feature: no dead code there either.
	$(CARGO) clippy --workspace -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps -q

py-lint: install
	$(PYTHON) -m ruff check python benchmarks
	$(PYTHON) -m ruff format --check python
	$(PYTHON) -m mypy --strict python/ferrio
	$(PYTHON) -m mypy.stubtest ferrio._native

lint: rust-lint py-lint

rust-test:
	$(CARGO) test --workspace

py-test: install deps-node deps-torch
	$(PYTHON) -m pytest -q -p no:cacheprovider python/tests

test: lint rust-test py-test

# --- The GPU machine (no Rust toolchain there): build here, carry .carry/, run there. ---
# Here: the abi3 wheel (Python 3.11 here, 3.12 there), the CLI and the release test binary.
gpu-wheel: deps-python
	rm -rf .carry/wheels && $(PYTHON) -m maturin build --release --strip --out .carry/wheels
	$(CARGO) build --release -p ferrio-cli
	$(CARGO) build --release -p ferrio --example ring_throughput
	mkdir -p .carry/bin && cp target/release/ferrio target/release/examples/ring_throughput .carry/bin/
	cp "$$($(CARGO) test --release -p ferrio --test tests --no-run --message-format=json 2>/dev/null \
	  | $(PYTHON) -c 'import json,sys; print([json.loads(l)["executable"] for l in sys.stdin if "\"executable\":\"/" in l][-1])')" \
	  .carry/bin/ferrio-tests
	strip .carry/bin/ferrio .carry/bin/ferrio-tests .carry/bin/ring_throughput  # the carry limit is 64 MiB

# Another build to compare against there (gpu_all.sh installs it to /tmp/old): the wheel of
# revision REV (default: main), built in a temporary worktree, into .carry/old.
REV ?= main
gpu-old: deps-python
	@wt=$$(mktemp -d /tmp/ferrio-old.XXXXXX) && git worktree add -q --detach "$$wt" "$(REV)" && \
	  ( cd "$$wt" && CARGO_TARGET_DIR="$(CURDIR)/target/old" $(PYTHON) -m maturin build --release --strip --out "$$wt/dist" ) ; \
	  rc=$$? ; if [ $$rc -eq 0 ]; then rm -rf .carry/old && mkdir -p .carry/old && cp "$$wt"/dist/*.whl .carry/old/ ; fi ; \
	  git worktree remove --force "$$wt" ; exit $$rc

# nginx with its lua module for benchmarks/remote_compare.py on the GPU machines, which have none.
gpu-nginx:
	bash benchmarks/carry_nginx.sh .carry/nginx

# obstore and boto3 for remote_compare.py's peers on the GPU machines (fsspec and aiohttp are
# there already); pure-Python or abi3 wheels, so any CPython 3 there installs them.
gpu-remote-peers:
	rm -rf .carry/remote-peers && $(PYTHON) -m pip download -q --no-deps --only-binary=:all: \
	  --platform manylinux2014_x86_64 --python-version 3.11 -d .carry/remote-peers \
	  obstore boto3 botocore s3transfer jmespath

# moto's S3 server and the GCS emulator for the remote tests there (Python 3.12 on the GPU
# machines): the packages they need and no more (moto[server] pulls in every service's stack,
# which would not fit the carry beside the rest), 31 MB.
gpu-moto:
	rm -rf .carry/moto && $(PYTHON) -m pip download -q --no-deps --only-binary=:all: \
	  --platform manylinux2014_x86_64 --python-version 3.12 -d .carry/moto \
	  moto boto3 botocore s3transfer jmespath cryptography cffi pycparser requests urllib3 idna \
	  certifi charset-normalizer werkzeug markupsafe jinja2 xmltodict responses "python-dateutil<3" six \
	  pyyaml flask flask-cors blinker itsdangerous click py-partiql-parser python-dotenv \
	  rfc3339-validator wrapt gcp-storage-emulator google-crc32c

# The peers of the GPU comparisons, as wheels for Python 3.12 there (--no-deps: torch, numpy and
# safetensors are on the GPU machine): KvikIO and the checkpoint loaders (../shared/GPU.md).
GPU_PIP := $(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
gpu-peers:
	rm -rf .carry/peers && $(GPU_PIP) -d .carry/peers --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
	  kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 "rapids-logger==0.3.*" fastsafetensors==0.5.0 instanttensor==0.2.2
	$(GPU_PIP) -d .carry/peers --platform manylinux_2_30_x86_64 runai-model-streamer==0.17.0

# transformers and the parts of its stack the GPU machine lacks (the interop tests there).
gpu-tf:
	rm -rf .carry/tf && $(GPU_PIP) -d .carry/tf --platform manylinux2014_x86_64 \
	  transformers==4.57.1 tokenizers==0.22.1 "huggingface_hub<1.0" regex

# A static fio for the cold rows there (benchmarks/carry_fio.sh).
gpu-fio:
	bash benchmarks/carry_fio.sh .carry/bin/fio

# There: everything that needs the GPU, logs in $OUT (benchmarks/gpu_all.sh).
gpu-test:
	bash benchmarks/gpu_all.sh
