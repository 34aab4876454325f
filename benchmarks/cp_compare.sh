#!/usr/bin/env bash
# ferrio cp against cp and xcp, alternating, several rounds, medians. Needs root (drop_caches,
# loop devices, mounts, cgroups), mkfs.ext4, losetup, python3; installs xcp with cargo if missing.
#
# (a) one device: 12 files of 250 MB copied within one file system, page cache dropped before
#     every run; xcp at block sizes 4 KiB / 64 KiB / 256 KiB with both of its drivers (cp has
#     no block-size knob; ferrio picks its own sizes), and with 12 workers (one per file: its
#     fastest setting here). Also ferrio read+write and ferrio --sync.
# (c) many small files (2000 x 64 KiB): ferrio, ferrio --sync (the cost of one fdatasync per
#     file), cp.
# (b) four loop devices, each read-throttled to 256 MiB/s with cgroup (v1 blkio or v2 io.max),
#     mounted inside one source directory so that a tree copy reads from all four; the
#     destination is on the main disk. Before each run the source files' pages are dropped
#     (fadvise, through dd iflag=nocache) while the loop images stay cached, so each loop device
#     is an independent 256 MiB/s drive (see ../shared/MEASURE.md on why throttling matters).
#
# Times: "copy" is the command's wall time; "+sync" adds a sync(1) after it (the data on disk).
# Rates are MB/s (10^6) of file data over copy time.
#
#   benchmarks/cp_compare.sh [--quick] [--rounds N] [--only a|b|c]
#   FERRIO=path/to/ferrio (default target/release/ferrio), WORKDIR (default /var/tmp),
#   RAW=path (keeps every run's row: part, tool, copy s, sync s, CPU s)
set -euo pipefail

QUICK=0 ROUNDS=3 ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    *) echo "usage: $0 [--quick] [--rounds N] [--only a|b|c]" >&2; exit 2 ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FERRIO=${FERRIO:-$ROOT/target/release/ferrio}
[ "$(id -u)" = 0 ] || { echo "cp_compare: needs root (drop_caches, loop devices, cgroups)" >&2; exit 2; }
[ -x "$FERRIO" ] || { echo "cp_compare: no ferrio at $FERRIO (cargo build --release -p ferrio-cli)" >&2; exit 2; }
if ! command -v xcp >/dev/null; then
  echo "cp_compare: installing xcp (cargo install xcp)"
  cargo install --quiet xcp
  export PATH="$HOME/.cargo/bin:$PATH"
fi

if [ $QUICK = 1 ]; then
  A_SIZE=25000000 B_FILES=2 B_SIZE=64M C_FILES=300
else
  A_SIZE=250000000 B_FILES=2 B_SIZE=384M C_FILES=2000
fi
A_FILES=12 B_DEVS=4 B_MIBPS=256 C_SIZE=65536

WORK=$(mktemp -d "${WORKDIR:-/var/tmp}/ferrio-cp-bench.XXXXXX")
CG="" CG_ROOT="" DEVS=() MNTS=()
cleanup() {
  set +e
  for m in "${MNTS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
  for d in "${DEVS[@]}"; do losetup -d "$d"; done
  [ -n "$CG" ] && rmdir "$CG" 2>/dev/null
  rm -rf "$WORK"
}
trap '[ -n "${RAW:-}" ] && cp "$RESULTS" "$RAW"; cleanup' EXIT
trap 'exit 130' INT TERM

RESULTS=$WORK/results.tsv
: > "$RESULTS"
drop_all() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# run PART NAME SETUP_FN DST -- COMMAND...: times one copy and appends a row to $RESULTS.
run() {
  local part=$1 name=$2 prep=$3 dst=$4; shift 5
  rm -rf "$dst"; sync
  $prep
  local tf=$WORK/time.txt
  /usr/bin/time -f '%e %U %S' -o "$tf" "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || {
    echo "cp_compare: $name failed:" >&2; cat "$WORK/err.txt" >&2; exit 1; }
  local s0 s1; s0=$(date +%s.%N); sync; s1=$(date +%s.%N)
  read -r wall usr sys < <(tail -1 "$tf")
  awk -v p="$part" -v n="$name" -v w="$wall" -v s="$(awk "BEGIN{print $s1 - $s0}")" \
    -v c="$(awk "BEGIN{print $usr + $sys}")" 'BEGIN{printf "%s\t%s\t%s\t%s\t%s\n", p, n, w, s, c}' \
    >> "$RESULTS"
}

# check SRC DST: every file copied, same sizes; full byte comparison the first time per name.
declare -A CHECKED
check() {
  local src=$1 dst=$2 name=$3
  local a b; a=$(cd "$src" && find . -type f -printf '%p %s\n' | sort | md5sum)
  b=$(cd "$dst" && find . -type f -printf '%p %s\n' | sort | md5sum)
  [ "$a" = "$b" ] || { echo "cp_compare: $name: $dst differs from $src" >&2; exit 1; }
  if [ -z "${CHECKED[$name]:-}" ]; then
    diff -r -q "$src" "$dst" >/dev/null || { echo "cp_compare: $name: bytes differ" >&2; exit 1; }
    CHECKED[$name]=1
  fi
}

# ---- (a) one device, 12 large files -------------------------------------------------------
part_a() {
  local src=$WORK/a/src dst=$WORK/a/dst
  mkdir -p "$src"
  for i in $(seq -w 1 $A_FILES); do
    "$FERRIO" write "$src/f$i" --size "$A_SIZE" --json >/dev/null
  done
  echo "(a) $A_FILES files of $A_SIZE bytes on $(df --output=source "$src" | tail -1), $ROUNDS rounds"
  local tools=(
    "cp|cp -r $src $dst"
    "xcp parfile 4KiB|xcp --no-progress -r --block-size 4KiB $src $dst"
    "xcp parfile 64KiB|xcp --no-progress -r --block-size 64KiB $src $dst"
    "xcp parfile 256KiB|xcp --no-progress -r --block-size 256KiB $src $dst"
    "xcp parblock 4KiB|xcp --no-progress -r --driver parblock --block-size 4KiB $src $dst"
    "xcp parblock 64KiB|xcp --no-progress -r --driver parblock --block-size 64KiB $src $dst"
    "xcp parblock 256KiB|xcp --no-progress -r --driver parblock --block-size 256KiB $src $dst"
    "xcp -w 12|xcp --no-progress -r -w 12 $src $dst"
    "ferrio|$FERRIO cp -r $src $dst"
    "ferrio read-write|$FERRIO cp -r --method read-write $src $dst"
    "ferrio --sync|$FERRIO cp -r --sync $src $dst"
  )
  for r in $(seq 1 "$ROUNDS"); do
    for t in "${tools[@]}"; do
      local name=${t%%|*} cmd=${t#*|}
      # shellcheck disable=SC2086
      run a "$name" drop_all "$dst" -- $cmd
      check "$src" "$dst" "a $name"
    done
  done
  rm -rf "$src" "$dst"
}

# ---- (c) many small files -------------------------------------------------------------------
part_c() {
  local src=$WORK/c/src dst=$WORK/c/dst
  mkdir -p "$src"
  python3 - "$src" "$C_FILES" "$C_SIZE" <<'EOF'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    sub = os.path.join(d, f"d{i % 20}")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f"f{i}"), "wb") as f:
        f.write(os.urandom(size))
EOF
  echo "(c) $C_FILES files of $C_SIZE bytes, $ROUNDS rounds"
  local tools=(
    "cp|cp -r $src $dst"
    "xcp|xcp --no-progress -r $src $dst"
    "ferrio|$FERRIO cp -r $src $dst"
    "ferrio --sync|$FERRIO cp -r --sync $src $dst"
  )
  for r in $(seq 1 "$ROUNDS"); do
    for t in "${tools[@]}"; do
      local name=${t%%|*} cmd=${t#*|}
      # shellcheck disable=SC2086
      run c "$name" drop_all "$dst" -- $cmd
      check "$src" "$dst" "c $name"
    done
  done
  rm -rf "$src" "$dst"
}

# ---- (b) four throttled loop devices ----------------------------------------------------------
B_SRC=""
drop_b() {
  local f
  while IFS= read -r f; do dd if="$f" iflag=nocache count=0 status=none; done \
    < <(find "$B_SRC" -type f)
}
part_b() {
  local src=$WORK/b/src dst=$WORK/b/dst rate=$((B_MIBPS << 20))
  B_SRC=$src
  local bytes; bytes=$(numfmt --from=iec "$B_SIZE")
  local img=$((bytes * B_FILES + bytes / 2 + (64 << 20)))
  if [ -d /sys/fs/cgroup/blkio ]; then
    CG_ROOT=/sys/fs/cgroup/blkio CGV=1
  else
    CG_ROOT=/sys/fs/cgroup CGV=2
    grep -qw io "$CG_ROOT/cgroup.subtree_control" || echo +io > "$CG_ROOT/cgroup.subtree_control"
  fi
  CG=$CG_ROOT/ferrio-cp-bench-$$
  mkdir "$CG"
  for i in $(seq 0 $((B_DEVS - 1))); do
    truncate -s "$img" "$WORK/d$i.img"
    mkfs.ext4 -q -F "$WORK/d$i.img"
    DEVS+=("$(losetup -f --show "$WORK/d$i.img")")
    mkdir -p "$src/d$i"
    mount "${DEVS[$i]}" "$src/d$i"
    MNTS+=("$src/d$i")
    local mm; mm=$(lsblk -dno MAJ:MIN "${DEVS[$i]}" | tr -d ' ')
    if [ "$CGV" = 1 ]; then
      echo "$mm $rate" > "$CG/blkio.throttle.read_bps_device"
    else
      echo "$mm rbps=$rate" > "$CG/io.max"
    fi
    for j in $(seq 1 "$B_FILES"); do
      "$FERRIO" write "$src/d$i/f$j" --size "$B_SIZE" --json >/dev/null
    done
  done
  sync
  # Keep the images cached (the "drives" are the throttled loop devices, not the disk below).
  cat "$WORK"/d*.img > /dev/null
  echo "(b) $B_DEVS loop devices x $B_MIBPS MiB/s read (cgroup v$CGV), $B_FILES x $B_SIZE each," \
    "destination on the main disk, $ROUNDS rounds"
  # Every copy runs inside the throttling cgroup.
  local inside=(sh -c 'echo $$ > "$0"/cgroup.procs && exec "$@"' "$CG")
  for r in $(seq 1 "$ROUNDS"); do
    run b "cp" drop_b "$dst" -- "${inside[@]}" cp -r "$src" "$dst"
    check "$src" "$dst" "b cp"
    run b "ferrio" drop_b "$dst" -- "${inside[@]}" "$FERRIO" cp -r --json "$src" "$dst"
    check "$src" "$dst" "b ferrio"
    cp "$WORK/out.txt" "$WORK/ferrio_b.json"
    run b "ferrio --sync" drop_b "$dst" -- "${inside[@]}" "$FERRIO" cp -r --sync "$src" "$dst"
    check "$src" "$dst" "b ferrio --sync"
  done
  echo "(b) ferrio's last run, per device:"
  python3 - "$WORK/ferrio_b.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for d in r["devices"]:
    print(f"    {d['pool']:>8}: read {d['read_mib_per_s']:7.1f} MiB/s  wrote {d['write_mib_per_s']:7.1f} MiB/s")
EOF
}

case $ONLY in
  a) part_a ;; b) part_b ;; c) part_c ;;
  "") part_a; part_c; part_b ;;
  *) echo "cp_compare: --only a, b or c" >&2; exit 2 ;;
esac

python3 - "$RESULTS" "$A_FILES" "$A_SIZE" "$C_FILES" "$C_SIZE" "$B_DEVS" "$B_FILES" "$B_SIZE" <<'EOF'
import sys, statistics as st
from collections import defaultdict
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def iec(s):
    u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * u[s[-1]] if s[-1] in u else int(s)
total = {
    "a": int(sys.argv[2]) * int(sys.argv[3]),
    "c": int(sys.argv[4]) * int(sys.argv[5]),
    "b": int(sys.argv[6]) * int(sys.argv[7]) * iec(sys.argv[8]),
}
runs = defaultdict(list)
order = []
for part, name, wall, sync, cpu in rows:
    if (part, name) not in runs:
        order.append((part, name))
    runs[(part, name)].append((float(wall), float(sync), float(cpu)))
titles = {"a": "(a) one device, large files", "c": "(c) small files", "b": "(b) four throttled devices"}
for part in "acb":
    names = [n for p, n in order if p == part]
    if not names:
        continue
    print(f"\n{titles[part]}: {total[part] / 1e6:.0f} MB; medians of {len(runs[(part, names[0])])} rounds")
    print(f"  {'':22} {'copy s':>8} {'+sync s':>8} {'MB/s':>8} {'MB/s+sync':>10} {'CPU s/GiB':>10}")
    med = {}
    for n in names:
        v = runs[(part, n)]
        w = st.median(x[0] for x in v)
        ws = st.median(x[0] + x[1] for x in v)
        cpu = st.median(x[2] for x in v)
        med[n] = (w, ws)
        print(f"  {n:22} {w:8.3f} {ws:8.3f} {total[part] / w / 1e6:8.0f} {total[part] / ws / 1e6:10.0f}"
              f" {cpu / (total[part] / 2**30):10.2f}")
    others = [n for n in names if not n.startswith("ferrio")]
    if "ferrio" in med and others:
        best = min(others, key=lambda n: med[n][0])
        best_s = min(others, key=lambda n: med[n][1])
        print(f"  ferrio vs best other: {med[best][0] / med['ferrio'][0]:.2f}x copy ({best}),"
              f" {med[best_s][1] / med['ferrio'][1]:.2f}x with sync ({best_s})")
        if "cp" in med:
            print(f"  ferrio vs cp: {med['cp'][0] / med['ferrio'][0]:.2f}x copy,"
                  f" {med['cp'][1] / med['ferrio'][1]:.2f}x with sync")
EOF
