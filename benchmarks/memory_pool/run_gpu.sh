#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .carry/memory/ carried (built here by
# benchmarks/memory_pool/build_gpu.sh): the host-side contention table first (what issue 14's
# last item is judged on), the pool's real-GPU tests, then the benchmarks of issue 7. Logs and
# JSON go to $OUT (default ./gpu-logs).
# Time: under 6 minutes in all. Each step's timeout is cut to what is left of DEADLINE_S
# (default 340 s), and the repetition runs of step 4 are skipped (and say so) when less than
# their share is left.
# Exit status: non-zero if a test failed, the GPU tests were skipped, or a benchmark failed.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"
BIN=$PWD/.carry/memory/bin
DEADLINE_S=${DEADLINE_S:-340}
status=0
# left WANT: WANT seconds, or what is left before the deadline if that is less (at least 1).
left() { local l=$((DEADLINE_S - SECONDS)); [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; uname -r; } \
  > "$OUT/machine.txt" 2>&1

# 0. Host-side contention, ferrio's pool against one mutex (benchmarks/memory_pool/RESULTS.md,
#    "Contention"): T threads on one stream and on T streams. About 15 s.
timeout "$(left 60)" "$BIN/pool_contention" --seconds 1 --threads 1,4,8,16 \
  2>&1 | tee "$OUT/pool_contention.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1

# 1. The pool on real streams and device memory (memory::real), and the emulated suite beside it.
#    The real tests are #[ignore]d (they need a GPU): --include-ignored runs them.
( cd /tmp && timeout "$(left 120)" "$BIN/ferrio-tests" memory:: --include-ignored \
  --test-threads=1 --nocapture ) > "$OUT/memory-tests.log" 2>&1 || status=1
grep -q " 0 ignored" "$OUT/memory-tests.log" || { echo "GPU tests were not all run"; status=1; }
tail -3 "$OUT/memory-tests.log"

# 2. Host-side contention in Rust: ferrio's pool vs cuMemAllocAsync, streams fixed per thread,
#    then rotating (blocks move between streams: events and device waits come into play).
timeout "$(left 60)" "$BIN/pool_gpu_bench" --seconds 0.3 --json "$OUT/pool_gpu_bench.jsonl" \
  2>&1 | tee "$OUT/pool_gpu_bench.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
timeout "$(left 60)" "$BIN/pool_gpu_bench" --seconds 0.3 --rotate --json "$OUT/pool_gpu_bench_rotate.jsonl" \
  2>&1 | tee "$OUT/pool_gpu_bench_rotate.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1

# 3. The same loop from C++ for ferrio (C ABI), RMM's pool_memory_resource and cudaMallocAsync;
#    then the rmm#1887 multi-stream spin-kernel scenario, warm, fresh and empty.
timeout "$(left 270)" "$BIN/pool_bench" --seconds 0.3 --json "$OUT/pool_bench.jsonl" \
  2>&1 | tee "$OUT/pool_bench.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
grep -q failed "$OUT/pool_bench.txt" && status=1

# 4. The kernels scenario again with more repetitions (the spread says what is noise), and
#    empty pools with smaller growth steps (is the first cuMemAlloc's size what empty starts pay?).
#    Fewer repetitions than in session 3 (15 -> 7, 31 -> 11, 9 -> 5), to keep the whole run
#    under 6 minutes with step 0 added; each is skipped if less than 30 s is left.
# optional NAME WANT CMD...: runs CMD under a timeout of WANT (or what is left), logging to
# $OUT/NAME.txt; skipped, and said so, when less than 30 s is left.
optional() {
  local name=$1 want=$2; shift 2
  if [ $((DEADLINE_S - SECONDS)) -lt 30 ]; then
    echo "skipped: less than 30 s left of ${DEADLINE_S} s" | tee "$OUT/$name.txt"; return
  fi
  timeout "$(left "$want")" "$@" 2>&1 | tee "$OUT/$name.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
}
optional pool_bench_spread 90 "$BIN/pool_bench" --only kernels --kernel-streams 4,8,16,32 \
  --kernels 32 --repeat 7 --allocators ferrio,rmm-pool --json "$OUT/pool_bench_spread.jsonl"
# Warm and fresh at 4 and 8 streams: is ferrio behind "none" there, and does a stream's first
# allocation (the slowest of them: "first_alloc_us") cost more when fresh?
optional pool_bench_fresh 60 "$BIN/pool_bench" --only kernels --kernel-streams 4,8 --kernels 32 \
  --repeat 11 --starts warm,fresh --allocators ferrio --json "$OUT/pool_bench_fresh.jsonl"
for g in 2 8; do
  optional "pool_bench_grow$g" 40 "$BIN/pool_bench" --only kernels --kernel-streams 1,4,8,16 \
    --kernels 32 --repeat 5 --starts empty --allocators ferrio --grow-mib $g \
    --json "$OUT/pool_bench_grow$g.jsonl"
done
echo "run_gpu.sh: ${SECONDS} s" | tee "$OUT/elapsed.txt"
exit $status
