#!/usr/bin/env bash
# Several drives at once: N loop devices, each throttled to B MiB/s with cgroup (v1 blkio or v2
# io.max), one file on each, all read (or written) at once by one ferrio process. Reports the
# aggregate rate against the ideal N x B, for ferrio's defaults (one pool per device) and for one
# global pool, alternating, several rounds, medians. Needs root, losetup, mkfs.ext4.
#
#   benchmarks/multi_drive.sh [-n DEVICES] [-b MIB_PER_S] [-s FILE_SIZE] [-r ROUNDS] [-g]
#   -g: also read the files into GPU memory (CuPy + the ferrio Python package)
#   FERRIO=path/to/ferrio (default target/release/ferrio)
set -euo pipefail

N=4 B=256 SIZE=512M ROUNDS=3 GPU=0
while getopts "n:b:s:r:g" o; do
  case $o in n) N=$OPTARG ;; b) B=$OPTARG ;; s) SIZE=$OPTARG ;; r) ROUNDS=$OPTARG ;; g) GPU=1 ;;
    *) echo "usage: $0 [-n devices] [-b MiB/s] [-s size] [-r rounds]" >&2; exit 2 ;; esac
done
FERRIO=${FERRIO:-$(cd "$(dirname "$0")/.." && pwd)/target/release/ferrio}
[ "$(id -u)" = 0 ] || { echo "multi_drive: needs root (loop devices, mounts, cgroups)" >&2; exit 2; }
[ -x "$FERRIO" ] || { echo "multi_drive: no ferrio at $FERRIO (make build)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/ferrio-multi.XXXXXX")
CG=""
DEVS=()
cleanup() {
  set +e
  if [ -n "$CG" ]; then
    echo $$ > "$CG_ROOT/cgroup.procs" 2>/dev/null
    rmdir "$CG" 2>/dev/null
  fi
  for i in "${!DEVS[@]}"; do
    umount "$WORK/mnt$i" 2>/dev/null
    losetup -d "${DEVS[$i]}" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

bytes=$(numfmt --from=iec "${SIZE%iB}")
img_bytes=$((bytes + bytes / 4 + (64 << 20)))
rate=$((B << 20))
if [ -d /sys/fs/cgroup/blkio ]; then
  CG_ROOT=/sys/fs/cgroup/blkio; CG=$CG_ROOT/ferrio-multi-$$; mkdir "$CG"; CGV=1
else
  CG_ROOT=/sys/fs/cgroup; CG=$CG_ROOT/ferrio-multi-$$
  grep -qw io "$CG_ROOT/cgroup.subtree_control" || echo +io > "$CG_ROOT/cgroup.subtree_control"
  mkdir "$CG"; CGV=2
fi
FILES=()
for i in $(seq 0 $((N - 1))); do
  truncate -s "$img_bytes" "$WORK/d$i.img"
  mkfs.ext4 -q -F "$WORK/d$i.img"
  DEVS[$i]=$(losetup -f --show "$WORK/d$i.img")
  mkdir -p "$WORK/mnt$i"; mount "${DEVS[$i]}" "$WORK/mnt$i"
  mm=$(lsblk -dno MAJ:MIN "${DEVS[$i]}" | tr -d ' ')
  if [ $CGV = 1 ]; then
    echo "$mm $rate" > "$CG/blkio.throttle.read_bps_device"
    echo "$mm $rate" > "$CG/blkio.throttle.write_bps_device"
  else
    echo "$mm rbps=$rate wbps=$rate" > "$CG/io.max"
  fi
  FILES+=("$WORK/mnt$i/data")
done
echo $$ > "$CG/cgroup.procs"

ideal=$((N * B))
echo "multi_drive: $N loop devices x $B MiB/s (cgroup v$CGV), $SIZE per file, $ROUNDS rounds; ideal $ideal MiB/s"
"$FERRIO" info "${FILES[0]%/data}/../mnt0" >/dev/null 2>&1 || true

mibps() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["bytes"]/d["seconds"]/2**20, 1))'; }
declare -A R
run() { # name, env, command...
  local name=$1 envs=$2; shift 2
  local v; v=$(env $envs "$FERRIO" "$@" --json | mibps)
  R[$name]+="$v "
}
for r in $(seq 1 "$ROUNDS"); do
  for mode in per-device global; do
    envs="FERRIO_PER_DEVICE_POOLS=on"; [ $mode = global ] && envs="FERRIO_PER_DEVICE_POOLS=off"
    run "write $mode" "$envs FERRIO_DIRECT_WRITE=on" write "${FILES[@]}" --size "$SIZE"
    sync; echo 3 > /proc/sys/vm/drop_caches
    run "read $mode" "$envs" read --cold "${FILES[@]}"
    if [ $GPU = 1 ]; then
      sync; echo 3 > /proc/sys/vm/drop_caches
      R["gpu read $mode"]+="$(env $envs python3 "$(dirname "$0")/multi_read_gpu.py" "${FILES[@]}" | mibps) "
    fi
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf '%-20s %12s %10s  %s\n' "" "MiB/s" "x ideal" "rounds"
for k in "read per-device" "read global" "write per-device" "write global" "gpu read per-device" "gpu read global"; do
  [ -n "${R[$k]:-}" ] || continue
  m=$(echo "${R[$k]}" | median)
  printf '%-20s %12s %10s  %s\n' "$k" "$m" "$(python3 -c "print(round($m/$ideal, 3))")" "${R[$k]}"
done
