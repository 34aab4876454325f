#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .carry/memory/ carried (built here by
# benchmarks/memory_pool/build_gpu.sh): the pool's real-GPU tests, then the benchmarks of
# issue 7. Logs and JSON go to $OUT (default ./gpu-logs). About a minute in all.
# Exit status: non-zero if a test failed, the GPU tests were skipped, or a benchmark failed.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"
BIN=$PWD/.carry/memory/bin
status=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; uname -r; } \
  > "$OUT/machine.txt" 2>&1

# 1. The pool on real streams and device memory (memory::real), and the emulated suite beside it.
( cd /tmp && timeout 120 "$BIN/ferrio-tests" memory:: --test-threads=1 --nocapture ) \
  > "$OUT/memory-tests.log" 2>&1 || status=1
grep -q "skipped: CUDA" "$OUT/memory-tests.log" && { echo "GPU tests were skipped"; status=1; }
tail -3 "$OUT/memory-tests.log"

# 2. Host-side contention in Rust: ferrio's pool vs cuMemAllocAsync, streams fixed per thread,
#    then rotating (blocks move between streams: events and device waits come into play).
timeout 60 "$BIN/pool_gpu_bench" --seconds 0.3 --json "$OUT/pool_gpu_bench.jsonl" \
  2>&1 | tee "$OUT/pool_gpu_bench.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
timeout 60 "$BIN/pool_gpu_bench" --seconds 0.3 --rotate --json "$OUT/pool_gpu_bench_rotate.jsonl" \
  2>&1 | tee "$OUT/pool_gpu_bench_rotate.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1

# 3. The same loop from C++ for ferrio (C ABI), RMM's pool_memory_resource and cudaMallocAsync;
#    then the rmm#1887 multi-stream spin-kernel scenario, warm, fresh and empty.
timeout 270 "$BIN/pool_bench" --seconds 0.3 --json "$OUT/pool_bench.jsonl" \
  2>&1 | tee "$OUT/pool_bench.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
grep -q failed "$OUT/pool_bench.txt" && status=1

# 4. The kernels scenario again with more repetitions (the spread says what is noise), and
#    empty pools with smaller growth steps (is the first cuMemAlloc's size what empty starts pay?).
timeout 120 "$BIN/pool_bench" --only kernels --kernel-streams 4,8,16,32 --kernels 32 --repeat 15 \
  --allocators ferrio,rmm-pool --json "$OUT/pool_bench_spread.jsonl" \
  2>&1 | tee "$OUT/pool_bench_spread.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
# Warm and fresh at 4 and 8 streams, 31 times: is ferrio behind "none" there, and does a
# stream's first allocation (the slowest of them: "first_alloc_us") cost more when fresh?
timeout 90 "$BIN/pool_bench" --only kernels --kernel-streams 4,8 --kernels 32 --repeat 31 \
  --starts warm,fresh --allocators ferrio --json "$OUT/pool_bench_fresh.jsonl" \
  2>&1 | tee "$OUT/pool_bench_fresh.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
for g in 2 8; do
  timeout 60 "$BIN/pool_bench" --only kernels --kernel-streams 1,4,8,16 --kernels 32 --repeat 9 \
    --starts empty --allocators ferrio --grow-mib $g --json "$OUT/pool_bench_grow$g.jsonl" \
    2>&1 | tee "$OUT/pool_bench_grow$g.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
exit $status
