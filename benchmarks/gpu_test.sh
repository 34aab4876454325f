#!/usr/bin/env bash
# On the GPU machine: the real-GPU tests, from what `make gpu-wheel` carried in .carry/.
# Writes logs to $OUT (or ./gpu-logs). Exit status: non-zero if any test failed.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/wheels/*.whl .carry/peers/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site
status=0
# Rust: every integration test, the GPU ones now for real (one thread: they share the GPU).
( cd /tmp && "$OLDPWD/.carry/bin/ferrio-tests" --test-threads=4 ) 2>&1 | tee "$OUT/rust-tests.log" || status=1
grep -q "skipped: CUDA" "$OUT/rust-tests.log" && { echo "GPU tests were skipped: no driver?"; status=1; }
# Python: the whole suite (GPU tests included) against the installed wheel.
PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider python/tests 2>&1 | tee "$OUT/pytest.log" || status=1
exit $status
