#!/usr/bin/env bash
# Builds a static fio (with its io_uring engine) from Debian's source package into .carry/bin/fio,
# for the GPU machines, which have no fio and cannot fetch one (../shared/GPU.md's recipe).
#   bash benchmarks/carry_fio.sh [OUT]        (about 3 MB; `make gpu-fio`)
set -euo pipefail
out=$(realpath -m "${1:-.carry/bin/fio}")
work=$(mktemp -d /tmp/ferrio-fio.XXXXXX)
trap 'rm -rf "$work"' EXIT
# A private source list with a deb-src line for the suite and mirror of this machine's own.
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
echo "deb-src ${mirror:-http://deb.debian.org/debian} $suite main" >"$work/src.list"
mkdir -p "$work/lists/partial"
apt=(-o Dir::Etc::SourceList="$work/src.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$work/lists")
apt-get -qq "${apt[@]}" update
(cd "$work" && apt-get -qq "${apt[@]}" source --download-only fio >/dev/null 2>&1)
tar xzf "$work"/fio_*.orig.tar.gz -C "$work"
cd "$work"/fio-*/
./configure --build-static --disable-native >/dev/null
make -s -j"$(nproc)" fio >/dev/null 2>&1
strip fio
./fio --enghelp | grep -q io_uring
mkdir -p "$(dirname "$out")" && cp fio "$out"
echo "fio: $out ($(./fio --version))"
