#!/usr/bin/env bash
# Everything that needs the GPU machine, in one go (device time is short): install the carried
# wheels, the Rust and Python GPU tests, the memory-pool tests and benchmarks, the file -> GPU
# benchmark against KvikIO, and the multi-drive run into GPU memory. Every log is packed into
# $OUT/gpu-logs.tgz at exit, whatever happens (the machine returns at most 8 files).
#   bash benchmarks/gpu_all.sh [STEP...]
#   steps: tests (= rusttests pytests) memory contention sweep compare checkpoint fillshapes afterfill callers blocks window parts policy cligpu ringsetup pcreg firstcall save remote multigpu
#          multickpt multidrive
#   (default: tests memory compare multidrive)
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}; mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/ferrio-gpu-logs.XXXXXX)
trap 'tar czf "$OUT/gpu-logs.tgz" -C "$LOGS" . ; cp "$LOGS/summary.txt" "$OUT/" 2>/dev/null' EXIT
S=$LOGS/summary.txt
step() { echo "== $* ($(date +%T))" | tee -a "$S"; }
STEPS=" ${*:-tests memory compare multidrive} "
[[ $STEPS == *" tests "* ]] && STEPS+="rusttests pytests "
want() { [[ $STEPS == *" $1 "* ]]; }

step install
# .carry/tf (transformers and the parts of its stack the machine lacks) and .carry/moto (moto's
# S3 server and its stack, for the remote tests) only where carried.
python3 -m pip install -q --no-index --no-deps --target /tmp/site \
  $(ls .carry/wheels/*.whl .carry/peers/*.whl .carry/tf/*.whl .carry/moto/*.whl 2>/dev/null) \
  >"$LOGS/pip.log" 2>&1 || { tail "$LOGS/pip.log" | tee -a "$S"; }
# obstore and boto3 (`make gpu-remote-peers`), one by one: a wheel the machine's Python refuses
# is skipped, not the lot.
for w in .carry/remote-peers/*.whl; do
  [ -e "$w" ] && { python3 -m pip install -q --no-index --no-deps --target /tmp/site "$w" >>"$LOGS/pip.log" 2>&1 || echo "skip: $w" | tee -a "$S"; }
done
# Another build of ferrio to compare against, where carried (.carry/old): loaders and clients
# named `ferrio@PYTHONPATH=/tmp/old:/tmp/site` run it.
for w in .carry/old/*.whl; do
  [ -e "$w" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/old "$w" >>"$LOGS/pip.log" 2>&1
done
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; free -g | head -2; df -h /root | tail -1; command -v fio || echo "no fio"; uname -r
  # Whether freed memory goes back to the host (a virtio balloon with free page reporting,
  # feature bit 5), which makes filling the page cache after drop_caches costly (RESULTS.md,
  # Cache policy, session 14), and the transparent huge page modes the fill relies on.
  for d in /sys/bus/virtio/drivers/virtio_balloon/virtio*; do
    [ -e "$d/features" ] && echo "virtio_balloon $(basename "$d"): free page reporting $(cut -c6 "$d/features")"
  done
  echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  # Whether the GPU driver mirrors the process's address space (HMM), which puts it in the path
  # of every mapping change, and whether kernel stacks are readable (FERRIO_BENCH_SAMPLE_MS).
  echo "uvm_disable_hmm: $(cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm 2>/dev/null || echo n/a);" \
    "$(nvidia-smi -q 2>/dev/null | grep -i 'addressing mode' | xargs)"
  echo "kptr_restrict: $(cat /proc/sys/kernel/kptr_restrict)"; } >>"$S" 2>&1

if want rusttests; then
step rust-gpu-tests
# The GPU tests are #[ignore]d elsewhere; here they must run, and fail if no GPU can be used.
( cd /tmp && timeout 300 "$ROOT/.carry/bin/ferrio-tests" --include-ignored --nocapture --test-threads=4 ) >"$LOGS/rust-tests.log" 2>&1
tail -3 "$LOGS/rust-tests.log" | tee -a "$S"
# Whatever still skipped itself (the no-driver tests, on this machine), by name.
grep -o "skipped: .*" "$LOGS/rust-tests.log" | sed 's/^/skip: /' | tee -a "$S"
grep -E "^test .*FAILED|panicked" "$LOGS/rust-tests.log" | head -20 | tee -a "$S"
step ring-throughput
timeout 120 "$ROOT/.carry/bin/ring_throughput" 2>&1 | tee -a "$S"
fi

if want pytests; then
step python-tests
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs python/tests >"$LOGS/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/pytest.log" | tail -30 | tee -a "$S"
fi

if want memory; then
step memory-pool
OUT=$LOGS/memory timeout 420 bash benchmarks/memory_pool/run_gpu.sh >"$LOGS/memory-run.log" 2>&1
tail -5 "$LOGS/memory-run.log" | tee -a "$S"
fi

if want contention; then
step pool-contention
# Only the pool's contention table (issue 14's rows), from .carry/bin (memory/build_gpu.sh builds it
# statically); the whole memory step above runs it too, with the rest of issue 7's benchmarks.
timeout 120 "$ROOT/.carry/bin/pool_contention" --seconds 1 --threads 1,4,8,16 2>&1 | tee -a "$S"
fi

if want sweep; then
step gpu-sweep
"$ROOT/.carry/bin/ferrio" write /root/ferrio-sweep.bin --size 4GiB >>"$S" 2>&1
timeout 540 python3 benchmarks/gpu_sweep.py /root/ferrio-sweep.bin --plan "${SWEEP_PLAN:-full}" --json "$LOGS/gpu_sweep.json" \
  >"$LOGS/gpu_sweep.log" 2>&1
cat "$LOGS/gpu_sweep.log" >>"$S"; rm -f /root/ferrio-sweep.bin
fi

if want compare; then
step gpu-compare
cd /root
ARGS="--size-gib 8 --rounds 3"
timeout 330 python3 "$ROOT/benchmarks/gpu_compare.py" $ARGS --json "$LOGS/gpu_compare.json" \
  >"$LOGS/gpu_compare.log" 2>&1
sed -n '/^medians/,$p' "$LOGS/gpu_compare.log" | tee -a "$S"; tail -3 "$LOGS/gpu_compare.log" >>"$S"
cd "$ROOT"
fi

if want cligpu; then
step cli-read-gpu
# `ferrio read --gpu 0`: the file -> GPU rate from the command line, warm then cold.
F=/root/ferrio-cli-gpu.bin
"$ROOT/.carry/bin/ferrio" write "$F" --size 8GiB >>"$S" 2>&1
dd if="$F" of=/dev/null bs=16M status=none
timeout 60 "$ROOT/.carry/bin/ferrio" read --gpu 0 "$F" 2>&1 | sed 's/^/warm: /' | tee -a "$S"
# Cold into GPU memory against cold into host memory, same file, alternating (issue 15: >= 0.95x).
for r in 1 2; do
  timeout 60 "$ROOT/.carry/bin/ferrio" read --gpu 0 --cold "$F" 2>&1 | sed "s/^/cold, round $r: /" | tee -a "$S"
  timeout 60 "$ROOT/.carry/bin/ferrio" read --cold "$F" 2>&1 | sed "s/^/cold into host memory, round $r: /" | tee -a "$S"
done
timeout 60 "$ROOT/.carry/bin/ferrio" read --gpu 0 "$F" 2>&1 | sed 's/^/again, new process: /' | tee -a "$S"
rm -f "$F"
fi

if want policy; then
step cache-policy
# Issue 15's targets: cold first read against fio's O_DIRECT shapes, second read in a new
# process, larger than memory in a cgroup (fio and ferrio from .carry/bin).
PATH=$ROOT/.carry/bin:$PATH timeout "${POLICY_TIMEOUT:-300}" python3 benchmarks/cache_policy.py \
  --dir /root --size-gib "${POLICY_GIB:-8}" --rounds "${POLICY_ROUNDS:-2}" --gpu \
  --ferrio "$ROOT/.carry/bin/ferrio" >"$LOGS/cache_policy.log" 2>&1
tail -40 "$LOGS/cache_policy.log" | tee -a "$S"
fi

if want checkpoint; then
step checkpoint-compare
# Fresh process per load, warm and cold, the 8 GiB file and 4 x 2 GiB shards (created if missing);
# fio's O_DIRECT shapes on the same files join the cold rows where .carry/bin/fio is carried.
timeout "${CKPT_TIMEOUT:-420}" python3 benchmarks/checkpoint_compare.py --dir /root/ferrio-ckpt \
  --rounds "${CKPT_ROUNDS:-2}" --checkpoints "${CKPT_WHICH:-both}" \
  ${CKPT_LOADERS:+--loaders "$CKPT_LOADERS"} ${CKPT_WARM:+--warm-loaders "$CKPT_WARM"} \
  ${CKPT_COLD:+--cold-loaders "$CKPT_COLD"} ${CKPT_FIO_SHAPES:+--fio-shapes "$CKPT_FIO_SHAPES"} \
  ${CKPT_REREAD:+--reread} $( [ -x "$ROOT/.carry/bin/fio" ] && echo --fio "$ROOT/.carry/bin/fio" ) \
  >"$LOGS/checkpoint_compare.log" 2>&1
cat "$LOGS/checkpoint_compare.log" | tail -30 | tee -a "$S"
fi

if want fillshapes; then
step fill-shapes
# How a cold file is best pulled into the page cache (issue 15/16's cold gap): each shape's cold
# rate, the disk's view of it, and the next read in a new process, into host and GPU memory.
F=/root/ferrio-fill.bin
"$ROOT/.carry/bin/ferrio" write "$F" --size "${FILLSHAPES_SIZE:-8GiB}" >>"$S" 2>&1
timeout "${FILLSHAPES_TIMEOUT:-300}" python3 benchmarks/fill_shapes.py "$F" --rounds "${FILLSHAPES_ROUNDS:-3}" \
  --shapes "${FILLSHAPES:-populate:4:2M,random:16:512K,direct:16:512K}" --gpu-again "$ROOT/.carry/bin/ferrio" \
  >"$LOGS/fill_shapes.log" 2>&1
tail -20 "$LOGS/fill_shapes.log" | tee -a "$S"
rm -f "$F"
fi

if want afterfill; then
step read-after-fill
# Whether the first read of a warm file into the GPU is slower than the next, by how the page
# cache was filled (benchmarks/read_after_fill.py).
F=/root/ferrio-after-fill.bin
timeout "${AFTERFILL_TIMEOUT:-300}" python3 benchmarks/read_after_fill.py "$F" --ferrio "$ROOT/.carry/bin/ferrio" \
  --size "${AFTERFILL_SIZE:-8GiB}" --rounds "${AFTERFILL_ROUNDS:-2}" ${AFTERFILL_FILLS:+--fills "$AFTERFILL_FILLS"} \
  >"$LOGS/read_after_fill.log" 2>&1
tail -12 "$LOGS/read_after_fill.log" | tee -a "$S"
rm -f "$F"
fi

if want callers; then
step many-callers
# Many callers, one 512 KiB read each, into GPU memory: 16 threads taking pieces of one file
# from a shared counter (benchmarks/many_callers.py), warm then cold; ferrio against KvikIO and,
# where carried, the build in /tmp/old.
F=/root/ferrio-callers.bin
"$ROOT/.carry/bin/ferrio" write "$F" --size "${CALLERS_SIZE:-4GiB}" >>"$S" 2>&1
C=${CALLERS_CLIENTS:-ferrio,kvikio,kvikio@NTHREADS=16$( [ -d /tmp/old/ferrio ] && echo ",ferrio@/tmp/old")}
for cold in "" --cold; do
  ( cd benchmarks && timeout "${CALLERS_TIMEOUT:-150}" python3 many_callers.py "$F" --gpu $cold \
    --threads "${CALLERS_THREADS:-16}" --piece "${CALLERS_PIECE:-512KiB}" --rounds "${CALLERS_ROUNDS:-3}" \
    --clients "$C" ) >>"$LOGS/many_callers.log" 2>&1
done
grep -v "^#" "$LOGS/many_callers.log" | tee -a "$S"
rm -f "$F"
fi

if want blocks; then
step block-queue
# fastsafetensors' read shape on the cold 8 GiB checkpoint (benchmarks/block_queue.py): 16
# threads, 512 KiB blocks from one queue, each read with or without the next block's first page
# (fastsafetensors reads with it), against 4 MiB blocks. Run it beside `checkpoint`.
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import checkpoint_compare as c; c.make_checkpoints('/root/ferrio-ckpt', 'single')" >>"$S" 2>&1
timeout "${BLOCKS_TIMEOUT:-300}" python3 benchmarks/block_queue.py /root/ferrio-ckpt/single/model.safetensors \
  --shapes "${BLOCKS_SHAPES:-512+0,512+4096,4096+0}" --rounds "${BLOCKS_ROUNDS:-4}" \
  >"$LOGS/block_queue.log" 2>&1
tail -4 "$LOGS/block_queue.log" | tee -a "$S"
fi

if want window; then
step window-read
# Issue 16's next experiment (RESULTS.md, Checkpoints, session 23 run 4): on the cold 8 GiB
# checkpoint, ferrio's direct host reads in tasks of 512 KiB to 4 MiB handed out in file order
# (16 threads: a window of requests moving through the file, as fastsafetensors reads), and its
# defaults with fill tasks of 2-8 MiB (the same window, filling the page cache) against its
# defaults and fio's best shapes of that run (benchmarks/window_read.py; WINDOW_ARGS for more of
# its options, e.g. "--nomerges --fio-shapes 7,8"). Beside `checkpoint`.
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import checkpoint_compare as c; c.make_checkpoints('/root/ferrio-ckpt', 'single')" >>"$S" 2>&1
( cd benchmarks && timeout "${WINDOW_TIMEOUT:-300}" python3 window_read.py /root/ferrio-ckpt/single/model.safetensors \
  --ferrio "$ROOT/.carry/bin/ferrio" --fio "$ROOT/.carry/bin/fio" --tasks "${WINDOW_TASKS:-512KiB,512KiB/32,4MiB,fill:2MiB/16,fill:2MiB/8,fill:8MiB/16}" \
  --rounds "${WINDOW_ROUNDS:-4}" ${WINDOW_ARGS:-} ) >"$LOGS/window_read.log" 2>&1
grep -v "^#" "$LOGS/window_read.log" | tee -a "$S"
fi

if want parts; then
step warm-load-parts
# Where a warm load_file onto the GPU spends its time: the load, its header, the allocation and
# the bare read, each in fresh processes (benchmarks/warm_load_parts.py).
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import checkpoint_compare as c; c.make_checkpoints('/root/ferrio-ckpt', 'single')" >>"$S" 2>&1
timeout "${PARTS_TIMEOUT:-240}" python3 benchmarks/warm_load_parts.py /root/ferrio-ckpt/single/model.safetensors \
  --rounds "${PARTS_ROUNDS:-4}" >"$LOGS/warm_load_parts.log" 2>&1
grep -v "^#" "$LOGS/warm_load_parts.log" | tee -a "$S"
fi

if want ringsetup; then
step ring-setup
# What 16 workers' rings cost the driver to set up, made the ways benchmarks/ring_setup.py names
# (ctypes, no ferrio; a fresh process per row).
timeout "${RINGSETUP_TIMEOUT:-120}" python3 benchmarks/ring_setup.py --rounds "${RINGSETUP_ROUNDS:-5}" \
  >"$LOGS/ring_setup.log" 2>&1
sed -n '/^medians/,$p' "$LOGS/ring_setup.log" | tee -a "$S"
fi

if want firstcall; then
step first-call
# Issue 16's first-call cost: a fresh process's first warm 8 GiB read against its second, for
# each ring variant (benchmarks/first_call.py), with FERRIO_TRACE timelines.
F=/root/ferrio-first-call.bin
"$ROOT/.carry/bin/ferrio" write "$F" --size 8GiB >>"$S" 2>&1
timeout "${FIRSTCALL_TIMEOUT:-150}" python3 benchmarks/first_call.py "$F" --rounds "${FIRSTCALL_ROUNDS:-4}" \
  --variants "${FIRSTCALL_VARIANTS:-mapped,driver}" --json "$LOGS/first_call.json" >"$LOGS/first_call.log" 2>&1
sed -n '/^medians/,$p' "$LOGS/first_call.log" | head -12 | tee -a "$S"
rm -f "$F"
fi

if want pcreg; then
step page-cache-register
# Whether the page cache itself can be a host -> device copy's source (pinned read-only with
# cuMemHostRegister, no CPU copy): the driver alone, ctypes, a warm 8 GiB file.
F=/root/ferrio-pcreg.bin
"$ROOT/.carry/bin/ferrio" write "$F" --size 8GiB >>"$S" 2>&1
dd if="$F" of=/dev/null bs=16M status=none
timeout "${PCREG_TIMEOUT:-180}" python3 benchmarks/page_cache_register.py "$F" --rounds "${PCREG_ROUNDS:-3}" \
  ${PCREG_VARIANTS:+--variants "$PCREG_VARIANTS"} >"$LOGS/page_cache_register.log" 2>&1
grep -E "^(attributes|  )|failed" "$LOGS/page_cache_register.log" | tee -a "$S"
rm -f "$F"
fi

if want save; then
step checkpoint-save
# ferrio.safetensors.torch.save_file against safetensors', from GPU and host tensors.
timeout "${SAVE_TIMEOUT:-200}" python3 benchmarks/checkpoint_save.py --dir /root/ferrio-save \
  --size-gib "${SAVE_GIB:-8}" --device "${SAVE_DEVICES:-cuda:0,cpu}" --rounds "${SAVE_ROUNDS:-1}" \
  --fsync "${SAVE_FSYNC:-off,on}" --writers "${SAVE_WRITERS:-safetensors,ferrio}" >"$LOGS/checkpoint_save.log" 2>&1
sed -n '/^medians/,$p' "$LOGS/checkpoint_save.log" | tee -a "$S"
rm -rf /root/ferrio-save
fi

if want remote; then
step remote-compare
# Issue 17 on the GPU machine: remote reads into host and GPU memory against KvikIO's RemoteFile,
# from a local server capped per request: nginx from .carry/nginx where carried (`make
# gpu-nginx`; the machine has none), else the script's threaded Python server.
mkdir -p /dev/shm/ferrio-remote
# REMOTE_TRACE=1 runs ferrio's clients with FERRIO_TRACE=1 and keeps each timeline's summary
# (benchmarks/trace_summary.py) in trace-SERVER/.
# REMOTE_SERVERS=nginx,python runs the comparison once per server (both stream each reply at the
# cap from its first byte: nginx through lua, the Python one with sendfile).
REMOTE_SERVERS=${REMOTE_SERVERS:-auto}
for server in ${REMOTE_SERVERS//,/ }; do
timeout "${REMOTE_TIMEOUT:-150}" python3 benchmarks/remote_compare.py --server "$server" --size "${REMOTE_SIZE:-1GiB}" --rate 100m \
  --rounds "${REMOTE_ROUNDS:-2}" --gpu --settings "${REMOTE_SETTINGS:-capped}" --clients "${REMOTE_CLIENTS:-ferrio,kvikio,kvikio-32}" \
  --timeout 60 --dir /dev/shm/ferrio-remote --json "$LOGS/remote_compare-$server.json" \
  ${REMOTE_TRACE:+--trace-dir "$LOGS/trace-$server"} >"$LOGS/remote_compare-$server.log" 2>&1
tail -25 "$LOGS/remote_compare-$server.log" | tee -a "$S"
done
rm -rf /dev/shm/ferrio-remote
fi

if want multigpu; then
step multi-gpu
for g in $(nvidia-smi --query-gpu=index --format=csv,noheader); do "$ROOT/.carry/bin/ferrio" info --gpu "$g" 2>&1 | tee -a "$S"; done
"$ROOT/.carry/bin/ferrio" info --gpu 0 --json >>"$S" 2>&1
# Issue 18: every GPU of the host fed at once (one process per GPU, and one process for all),
# against the sum of each GPU's pinned host -> device rate, page cache warm.
timeout "${MULTIGPU_TIMEOUT:-300}" python3 benchmarks/multi_gpu.py --size-gib "${MULTIGPU_GIB:-8}" \
  --rounds "${MULTIGPU_ROUNDS:-3}" --variants "${MULTIGPU_VARIANTS:-}" --json "$LOGS/multi_gpu.json" >"$LOGS/multi_gpu.log" 2>&1
tail -20 "$LOGS/multi_gpu.log" | tee -a "$S"
fi

if want multickpt; then
step multi-gpu-checkpoint
# Issue 18 item 3: one process per GPU loading the same checkpoint (8 GiB single file, shared with
# the checkpoint step), ferrio alone and with a process group against InstantTensor and
# safetensors, page cache warm (MULTICKPT_COLD=1 adds dropped-cache rows).
timeout "${MULTICKPT_TIMEOUT:-300}" python3 benchmarks/multi_gpu_checkpoint.py --dir /root/ferrio-ckpt \
  --checkpoint "${MULTICKPT_WHICH:-single}" --rounds "${MULTICKPT_ROUNDS:-2}" ${MULTICKPT_COLD:+--cold} \
  ${MULTICKPT_LOADERS:+--loaders "$MULTICKPT_LOADERS"} --json "$LOGS/multi_gpu_checkpoint.json" \
  >"$LOGS/multi_gpu_checkpoint.log" 2>&1
tail -14 "$LOGS/multi_gpu_checkpoint.log" | tee -a "$S"
fi

if want multidrive; then
step multi-drive-gpu
# Backing images in memory (the throttle is the only limit), then on the machine's disk.
FERRIO=$ROOT/.carry/bin/ferrio timeout 240 bash benchmarks/multi_drive.sh -n 4 -b 256 -s 1G -r 2 -g -m \
  >"$LOGS/multi_drive.log" 2>&1
tail -9 "$LOGS/multi_drive.log" | tee -a "$S"
FERRIO=$ROOT/.carry/bin/ferrio timeout 150 bash benchmarks/multi_drive.sh -n 4 -b 256 -s 1G -r 1 \
  >"$LOGS/multi_drive_disk.log" 2>&1
tail -7 "$LOGS/multi_drive_disk.log" | tee -a "$S"
fi
step done
