#!/usr/bin/env bash
# Several drives at once: N loop devices, each throttled to B MiB/s with cgroup (v1 blkio or v2
# io.max), one file on each, all read (or written) at once by one ferrio process. Reports the
# aggregate rate against the ideal N x B, for ferrio's defaults (one pool per device) and for one
# global pool, alternating, several rounds, medians. Needs root, losetup, mkfs.ext4.
#
#   benchmarks/multi_drive.sh [-n DEVICES] [-b MIB_PER_S] [-s FILE_SIZE] [-r ROUNDS] [-g] [-m]
#   -g: also read the files into GPU memory (CuPy + the ferrio Python package)
#   -m: keep the loop devices' backing images in memory (a tmpfs mounted for the run), so that the throttle is the
#       only limit; otherwise all four devices write back into one disk, which on the development
#       VM caps writes near 0.86x ideal for fio and ferrio alike
#   FERRIO=path/to/ferrio (default target/release/ferrio)
set -euo pipefail

N=4 B=256 SIZE=512M ROUNDS=3 GPU=0 MEM=0
while getopts "n:b:s:r:gm" o; do
  case $o in n) N=$OPTARG ;; b) B=$OPTARG ;; s) SIZE=$OPTARG ;; r) ROUNDS=$OPTARG ;; g) GPU=1 ;; m) MEM=1 ;;
    *) echo "usage: $0 [-n devices] [-b MiB/s] [-s size] [-r rounds] [-g] [-m]" >&2; exit 2 ;; esac
done
FERRIO=${FERRIO:-$(cd "$(dirname "$0")/.." && pwd)/target/release/ferrio}
[ "$(id -u)" = 0 ] || { echo "multi_drive: needs root (loop devices, mounts, cgroups)" >&2; exit 2; }
[ -x "$FERRIO" ] || { echo "multi_drive: no ferrio at $FERRIO (make build)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/ferrio-multi.XXXXXX")
IMG=$WORK
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
  [ "$IMG" != "$WORK" ] && umount "$IMG" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

bytes=$(numfmt --from=iec "${SIZE%iB}")
# Room for two copies of the file: a rewrite then finds free blocks at once instead of waiting
# for the journal to release the old file's (on a file system sized 1.25x the file, rewrites ran
# at 0.86x ideal against 0.97x for the same writes with room).
img_bytes=$((2 * bytes + (256 << 20)))
if [ $MEM = 1 ]; then
  mkdir "$WORK/img"
  mount -t tmpfs -o size=$((N * img_bytes + (64 << 20))) ferrio-multi "$WORK/img"
  IMG=$WORK/img
fi
rate=$((B << 20))
if [ -d /sys/fs/cgroup/blkio ]; then
  CG_ROOT=/sys/fs/cgroup/blkio; CG=$CG_ROOT/ferrio-multi-$$; mkdir "$CG"; CGV=1
else
  CG_ROOT=/sys/fs/cgroup; CG=$CG_ROOT/ferrio-multi-$$
  grep -qw io "$CG_ROOT/cgroup.subtree_control" || echo +io > "$CG_ROOT/cgroup.subtree_control"
  mkdir "$CG"; CGV=2
fi
FILES=() FIO_JOBS=()
for i in $(seq 0 $((N - 1))); do
  truncate -s "$img_bytes" "$IMG/d$i.img"
  # Inode tables and journal written now, not by a background thread during the measurement.
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$IMG/d$i.img"
  DEVS[$i]=$(losetup -f --show "$IMG/d$i.img")
  mkdir -p "$WORK/mnt$i"; mount "${DEVS[$i]}" "$WORK/mnt$i"
  mm=$(lsblk -dno MAJ:MIN "${DEVS[$i]}" | tr -d ' ')
  if [ $CGV = 1 ]; then
    echo "$mm $rate" > "$CG/blkio.throttle.read_bps_device"
    echo "$mm $rate" > "$CG/blkio.throttle.write_bps_device"
  else
    echo "$mm rbps=$rate wbps=$rate" > "$CG/io.max"
  fi
  FILES+=("$WORK/mnt$i/data")
  FIO_JOBS+=(--name="d$i" --filename="$WORK/mnt$i/data")
done
echo $$ > "$CG/cgroup.procs"

ideal=$((N * B))
echo "multi_drive: $N loop devices x $B MiB/s (cgroup v$CGV), images $([ $MEM = 1 ] && echo "in memory" || echo "in $WORK"), $SIZE per file, $ROUNDS rounds; ideal $ideal MiB/s"
"$FERRIO" info "${FILES[0]%/data}/../mnt0" >/dev/null 2>&1 || true

mibps() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["bytes"]/d["seconds"]/2**20, 1))'; }
declare -A R
run() { # name, env, command...
  local name=$1 envs=$2; shift 2
  local v; v=$(env $envs "$FERRIO" "$@" --json | mibps)
  R[$name]+="$v "
}
# Every write starts from a quiet file system: no file to truncate, nothing left to commit
# (a truncate's journal commit during the timed writes flushes each loop device's backing
# file: 0.86x ideal against 0.97x).
fresh() { rm -f "${FILES[@]}"; sync; }
for r in $(seq 1 "$ROUNDS"); do
  for mode in per-device global; do
    envs="FERRIO_PER_DEVICE_POOLS=on"; [ $mode = global ] && envs="FERRIO_PER_DEVICE_POOLS=off"
    fresh
    run "write $mode" "$envs FERRIO_DIRECT_WRITE=on" write "${FILES[@]}" --size "$SIZE"
    if [ $mode = global ] && command -v fio >/dev/null; then
      # The yardstick for writes: fio, one job per file, O_DIRECT, iodepth 8, fsync at the end.
      fresh
      R["write fio"]+="$(fio --group_reporting --rw=write --bs=1M --size="$SIZE" --direct=1 \
        --ioengine=io_uring --iodepth=8 --end_fsync=1 --output-format=terse "${FIO_JOBS[@]}" |
        awk -F';' '{printf "%.1f", $48 / 1024}') "
    fi
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
for k in "read per-device" "read global" "write per-device" "write global" "write fio" "gpu read per-device" "gpu read global"; do
  [ -n "${R[$k]:-}" ] || continue
  m=$(echo "${R[$k]}" | median)
  printf '%-20s %12s %10s  %s\n' "$k" "$m" "$(python3 -c "print(round($m/$ideal, 3))")" "${R[$k]}"
done
