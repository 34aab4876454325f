#!/usr/bin/env bash
# Here (no GPU, no nvcc): builds everything benchmarks/memory_pool/run_gpu.sh runs on the GPU
# machine into .carry/memory/ (git-ignored; carry that one folder).
#
#   bin/pool_contention  examples/pool_contention.rs, statically linked (crt-static): the
#                        host-side contention table of benchmarks/memory_pool/RESULTS.md
#   bin/ferrio-tests     the release integration-test binary (the memory::real tests among them)
#   bin/pool_gpu_bench   examples/pool_gpu_bench.rs: ferrio's pool vs cuMemAllocAsync, in Rust
#   bin/pool_bench       pool_bench.cpp: ferrio (through examples/pool_capi.rs) vs RMM's
#                        pool_memory_resource vs cudaMallocAsync, from C++; with the shared
#                        libraries it loads from its own folder (libpool_capi.so, librmm.so,
#                        librapids_logger.so)
#
# pool_bench.cpp is compiled with g++ against the headers of PyPI wheels: librmm-cu13 (RMM and
# the CCCL it was built with), rapids-logger, nvidia-cuda-runtime (CUDA 13.0 headers and
# libcudart_static.a, linked in) and nvidia-cuda-crt (crt/host_defines.h). CUDA 13.0 matches
# the H200's driver (580); the spin kernel is PTX, compiled by the driver at run time.
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=.carry/memory
WHEELS=target/pool_bench_wheels
BUILD=target/pool_bench_build
mkdir -p "$CARRY/bin" "$WHEELS" "$BUILD"

want=(librmm-cu13==26.10.0 rapids-logger==0.3.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88)
for w in "${want[@]}"; do
  name=${w%%==*}; glob=$(echo "${name//-/_}" | tr '[:upper:]' '[:lower:]')-${w##*==}-*.whl
  ls $WHEELS/$glob >/dev/null 2>&1 || python3 -m pip download -q --no-deps -d "$WHEELS" "$w"
done
for whl in "$WHEELS"/*.whl; do
  python3 -m zipfile -e "$whl" "$BUILD/" >/dev/null
done

# Static, as the contention table has always been built. `--target` keeps these artifacts
# (other RUSTFLAGS) in target/x86_64-unknown-linux-gnu/, apart from the ordinary build's.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p ferrio \
  --example pool_contention --target x86_64-unknown-linux-gnu
cp target/x86_64-unknown-linux-gnu/release/examples/pool_contention "$CARRY/bin/"
cargo build --release -p ferrio --example pool_capi --example pool_gpu_bench
cp target/release/examples/libpool_capi.so target/release/examples/pool_gpu_bench "$CARRY/bin/"
tests=$(cargo test --release -p ferrio --test tests --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys; print([json.loads(l)["executable"] for l in sys.stdin if "\"executable\":\"/" in l][-1])')
cp "$tests" "$CARRY/bin/ferrio-tests"

B=$BUILD
g++ -std=c++20 -O2 -Wall \
  -I "$B/librmm/include" -I "$B/librmm/include/rapids" -I "$B/rapids_logger/include" \
  -I "$B/nvidia/cu13/include" \
  benchmarks/memory_pool/pool_bench.cpp -o "$CARRY/bin/pool_bench" \
  -Wl,-rpath,'$ORIGIN' -L "$B/librmm/lib64" -lrmm -L "$B/rapids_logger/lib64" -lrapids_logger \
  -L "$CARRY/bin" -lpool_capi "$B/nvidia/cu13/lib/libcudart_static.a" -ldl -lpthread -lrt
cp "$B/librmm/lib64/librmm.so" "$B/rapids_logger/lib64/librapids_logger.so" "$CARRY/bin/"
strip --strip-debug "$CARRY/bin/"*
du -sh "$CARRY"; ls -l "$CARRY/bin"
