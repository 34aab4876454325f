//! The conformance suite on the CUDA driver: real streams and events over device memory
//! (`cuMemAlloc`), on device 0. Writes are `cuMemsetD32Async` fills of whole blocks; reads copy
//! a block's first and last word into pinned memory (`cuMemcpyDtoHAsync`), checked once every
//! stream has finished. Plus the pinned upstream, over-aligned chunks, foreign streams and the
//! driver's own pool. Skipped without a driver.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferrio::memory::{
    Block, CudaStreams, DeviceUpstream, DriverPool, PinnedUpstream, PoolOptions, PoolResource,
    StreamGate, StreamHandle, Upstream,
};

use super::{Backend, PoolOf};
use crate::require_cuda;

/// Reads the mailbox holds (two 32-bit words each); a test that reads more checks only these.
const SLOTS: usize = 1 << 17;

struct Gpu {
    streams: CudaStreams,
    pinned: PinnedUpstream,
    /// Pinned memory the reads land in: slot i is words 2i and 2i + 1.
    mailbox: usize,
    next: AtomicUsize,
    expected: Mutex<Vec<(usize, u32, Block)>>,
    unchecked: AtomicUsize,
}

impl Gpu {
    fn new() -> Gpu {
        let streams = CudaStreams::for_device(0).expect("CUDA streams");
        let pinned = PinnedUpstream::new(streams.context()).expect("pinned upstream");
        let mailbox = pinned.allocate(SLOTS * 8, 4096).expect("pinned mailbox");
        Gpu {
            streams,
            pinned,
            mailbox,
            next: AtomicUsize::new(0),
            expected: Mutex::new(Vec::new()),
            unchecked: AtomicUsize::new(0),
        }
    }

    fn slot_ptr(&self, slot: usize) -> *mut u32 {
        (self.mailbox + slot * 8) as *mut u32
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this size and alignment; every copy into it was
        // waited for in `finish` or `first_word`.
        unsafe { self.pinned.deallocate(self.mailbox, SLOTS * 8, 4096) }.expect("free mailbox");
    }
}

impl Backend for Gpu {
    type Up = DeviceUpstream;
    type Order = CudaStreams;
    type Gate = StreamGate;

    fn pool(&self, options: PoolOptions) -> PoolOf<Self> {
        let up = DeviceUpstream::new(self.streams.context()).expect("device upstream");
        PoolResource::new(up, self.streams, options).expect("pool")
    }
    fn stream(&self) -> StreamHandle {
        self.streams.create_stream().expect("cuStreamCreate")
    }
    fn hold(&self, stream: &StreamHandle) -> StreamGate {
        self.streams.hold(stream).expect("cuLaunchHostFunc")
    }
    fn write(&self, stream: &StreamHandle, block: Block, tag: u32) {
        // SAFETY: the block is device memory of this context handed to this caller by the
        // pool, which keeps it until it is freed on this stream after this fill.
        unsafe {
            self.streams
                .fill_async(block.addr(), tag, block.size(), stream)
        }
        .expect("cuMemsetD32Async");
    }
    fn read_expect(&self, stream: &StreamHandle, block: Block, tag: u32) {
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        if slot >= SLOTS {
            self.unchecked.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let dst = self.slot_ptr(slot);
        // SAFETY: slot `slot` of the pinned mailbox is this call's alone until `finish`, which
        // synchronizes every stream before reading it; the block is live device memory (as in
        // `write`).
        unsafe {
            self.streams
                .copy_to_host_async(dst.cast(), block.addr(), 4, stream)
                .expect("cuMemcpyDtoHAsync");
            self.streams
                .copy_to_host_async(
                    dst.add(1).cast(),
                    block.addr() + block.size() - 4,
                    4,
                    stream,
                )
                .expect("cuMemcpyDtoHAsync");
        }
        self.expected
            .lock()
            .expect("expected")
            .push((slot, tag, block));
    }
    fn progress(&self, _stream: &StreamHandle) {}
    fn finish(&self, streams: &[StreamHandle]) -> Vec<String> {
        let mut failures = Vec::new();
        for s in streams {
            if let Err(e) = self.streams.synchronize(s) {
                failures.push(format!("stream {}: {e}", s.id()));
            }
        }
        let expected = std::mem::take(&mut *self.expected.lock().expect("expected"));
        for (slot, tag, block) in expected {
            let p = self.slot_ptr(slot);
            // SAFETY: every stream that copied into the mailbox has been synchronized; the
            // words are aligned and inside the mailbox.
            let (first, last) = unsafe { (p.read_volatile(), p.add(1).read_volatile()) };
            if (first, last) != (tag, tag) {
                failures.push(format!(
                    "{block:?}: read {first:#x}/{last:#x}, wrote {tag:#x}: another stream \
                     used the block before this stream was done with it"
                ));
            }
        }
        self.next.store(0, Ordering::Relaxed);
        let unchecked = self.unchecked.swap(0, Ordering::Relaxed);
        if unchecked > 0 {
            println!("{unchecked} reads beyond the mailbox were not checked");
        }
        failures
    }
    fn first_word(&self, block: Block) -> Option<u32> {
        let s = self.stream();
        let slot = SLOTS - 1;
        // SAFETY: the last slot is used only here, between `finish` calls; the copy is
        // synchronized before the slot is read; the block is still allocated.
        unsafe {
            self.streams
                .copy_to_host_async(self.slot_ptr(slot).cast(), block.addr(), 4, &s)
                .expect("cuMemcpyDtoHAsync");
            self.streams.synchronize(&s).expect("synchronize");
            Some(self.slot_ptr(slot).read_volatile())
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn real_conformance() {
    require_cuda!();
    let gpu = Arc::new(Gpu::new());
    super::run_all(&gpu, "device");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn real_over_aligned_chunks_come_back_whole() {
    require_cuda!();
    let streams = CudaStreams::for_device(0).expect("streams");
    for align in [4096usize, 1 << 16] {
        let up = DeviceUpstream::new(streams.context()).expect("upstream");
        let pool = PoolResource::new(
            up,
            streams,
            PoolOptions::default().alignment(align).grow_bytes(1 << 20),
        )
        .expect("pool");
        let s = streams.create_stream().expect("stream");
        let blocks: Vec<Block> = (0..8)
            .map(|i| pool.allocate(1000 + i * 3000, &s).expect("allocate"))
            .collect();
        for b in &blocks {
            assert_eq!(b.addr() % align, 0, "{b:?} aligned to {align}");
        }
        for b in blocks {
            pool.deallocate(b.addr(), b.size(), &s).expect("free");
        }
        // Dropping the pool frees each chunk with the pointer cuMemAlloc returned; a wrong one
        // would make cuMemFree fail (ignored in drop) and leak, so check with a second round.
        drop(pool);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn real_pinned_pool_is_host_memory() {
    require_cuda!();
    let streams = CudaStreams::for_device(0).expect("streams");
    let up = PinnedUpstream::new(streams.context()).expect("upstream");
    let pool = PoolResource::new(
        up,
        streams,
        PoolOptions::default().alignment(8192).grow_bytes(4 << 20),
    )
    .expect("pool");
    let s = streams.create_stream().expect("stream");
    let a = pool.allocate(100_000, &s).expect("allocate");
    assert_eq!(a.addr() % 8192, 0);
    assert_eq!(
        ferrio::cuda::classify(a.addr()),
        ferrio::cuda::Memory::Host,
        "pinned memory is host memory"
    );
    // SAFETY: the block is pinned host memory of `a.size()` bytes, ours until freed.
    let bytes = unsafe { std::slice::from_raw_parts_mut(a.as_mut_ptr(), a.size()) };
    bytes.fill(0x5A);
    assert!(bytes.iter().all(|&x| x == 0x5A));
    pool.deallocate(a.addr(), a.size(), &s).expect("free");
    assert_eq!(pool.stats().memory, ferrio::memory::MemoryKind::Pinned);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn real_foreign_streams_get_fresh_ids() {
    require_cuda!();
    let streams = CudaStreams::for_device(0).expect("streams");
    let owner = streams.create_stream().expect("stream");
    // SAFETY: `owner` outlives both registrations, which are detached and dropped first.
    let (x, y) = unsafe {
        (
            streams.register_stream(owner.as_raw()),
            streams.register_stream(owner.as_raw()),
        )
    };
    assert_ne!(x.id(), y.id(), "one handle registered twice: two ids");
    assert!(!x.is_owned() && owner.is_owned());
    // SAFETY: null is the legacy default stream, which lives as long as the context.
    let legacy = unsafe { streams.register_stream(std::ptr::null_mut()) };
    let up = DeviceUpstream::new(streams.context()).expect("upstream");
    let pool = PoolResource::new(up, streams, PoolOptions::default()).expect("pool");
    for s in [&x, &y, &legacy] {
        let b = pool.allocate(4096, s).expect("allocate");
        // SAFETY: device memory of this pool, freed on the same stream afterwards.
        unsafe { streams.fill_async(b.addr(), 7, b.size(), s) }.expect("fill");
        pool.deallocate(b.addr(), b.size(), s).expect("free");
        pool.detach_stream(s).expect("detach");
    }
    streams.synchronize(&owner).expect("synchronize");
    streams.synchronize(&legacy).expect("synchronize");
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (make gpu-test)"]
fn real_driver_pool_allocates_in_stream_order() {
    require_cuda!();
    let streams = CudaStreams::for_device(0).expect("streams");
    let driver_pool = DriverPool::new(streams.context()).expect("cuMemAllocAsync pool");
    let s = streams.create_stream().expect("stream");
    let a = driver_pool.allocate(1 << 20, &s).expect("cuMemAllocAsync");
    // SAFETY: 1 MiB of device memory from the driver's pool, used on `s` before its free.
    unsafe { streams.fill_async(a, 1, 1 << 20, &s) }.expect("fill");
    // SAFETY: allocated above, freed once, after its last use on the same stream.
    unsafe { driver_pool.deallocate(a, &s) }.expect("cuMemFreeAsync");
    streams.synchronize(&s).expect("synchronize");
}
