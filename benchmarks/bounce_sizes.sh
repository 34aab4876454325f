#!/usr/bin/env bash
# Warm file -> GPU reads (`ferrio read --gpu 0`, a fresh process each) with each bounce buffer
# size, alternating, from a page-cache-warm file: is the warm rate set by the buffers' size (ring
# memory that stays in the CPU's cache) or by something else?
#   FERRIO=.carry/bin/ferrio bash benchmarks/bounce_sizes.sh FILE [ROUNDS] [SIZES...]
# Prints one line per read and the median of each size. The file is made (8 GiB) if missing.
set -euo pipefail
F=$1; ROUNDS=${2:-4}; shift $(( $# < 2 ? $# : 2 ))
[ $# -gt 0 ] || set -- 512KiB 1MiB 2MiB 4MiB 8MiB
SIZES=("$@")
FERRIO=${FERRIO:-ferrio}
INTO=${INTO---gpu 0}  # INTO= reads into host memory
[ -e "$F" ] || "$FERRIO" write "$F" --size 8GiB >/dev/null
dd if="$F" of=/dev/null bs=16M status=none
"$FERRIO" read $INTO "$F" >/dev/null  # the first read after a fill activates its pages
declare -A got
for r in $(seq "$ROUNDS"); do
  for i in "${!SIZES[@]}"; do
    s=${SIZES[$(( (i + r) % ${#SIZES[@]} ))]}
    g=$(FERRIO_BOUNCE_BUFFER_SIZE=$s "$FERRIO" read $INTO --json "$F" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["gib_per_s"], 2))')
    echo "round $r bounce_buffer_size=$s: $g GiB/s"
    got[$s]="${got[$s]:-} $g"
  done
done
for s in "${SIZES[@]}"; do
  echo "bounce_buffer_size=$s median: $(python3 -c 'import statistics,sys; print(round(statistics.median(map(float, sys.argv[1:])), 2))' ${got[$s]}) (${got[$s]# })"
done
