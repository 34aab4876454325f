//! Correctness tests of the pool's internals, run on every `cargo test` against the emulated
//! streams and host memory: ordering across streams, limits and errors, chunk boundaries, and
//! properties of the free lists. The multi-threaded stress runs are in the integration suite.

use std::num::NonZeroU32;
use std::sync::{Arc, Barrier, Mutex};

use proptest::prelude::*;

use super::blocks::Chunk;
use super::*;
use crate::error::Error;

type TestPool = PoolResource<HostUpstream, EmulatedStreams>;

fn pool_with(emu: &EmulatedStreams, options: PoolOptions) -> TestPool {
    PoolResource::new(HostUpstream, emu.clone(), options).unwrap()
}

fn stream_stats(pool: &TestPool, s: &EmulatedStream) -> StreamStats {
    pool.stats()
        .streams
        .into_iter()
        .find(|x| x.stream == s.id())
        .unwrap()
}

/// Checks that every byte of the pool is accounted for: nothing in use, the free lists and
/// the threads' caches hold the whole pool without overlaps and without crossing chunk boundaries; then, after
/// consolidating on `onto`, that the free blocks are exactly the upstream chunks.
fn assert_all_returned(pool: &TestPool, onto: &EmulatedStream) {
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats:?}");
    assert_eq!(stats.free_bytes, stats.pool_bytes, "{stats:?}");
    let chunks = pool.chunk_list();
    let mut free = pool.free_blocks();
    free.extend(pool.cached_blocks());
    free.sort_by_key(|(_, b)| b.addr);
    for pair in free.windows(2) {
        assert!(
            pair[0].1.end() <= pair[1].1.addr,
            "free blocks overlap: {pair:?}"
        );
    }
    for (_, b) in &free {
        let c = chunks.iter().find(|c| c.id == b.chunk).unwrap();
        assert!(
            c.addr <= b.addr && b.end() <= c.end(),
            "{b:?} outside {c:?}"
        );
    }
    pool.consolidate(onto).unwrap();
    let free: Vec<Chunk> = pool
        .free_blocks()
        .into_iter()
        .map(|(_, b)| Chunk {
            id: b.chunk,
            addr: b.addr,
            size: b.size,
        })
        .collect();
    assert_eq!(
        free, chunks,
        "after consolidating, the free list is the chunks"
    );
}

#[test]
fn same_stream_reuse_is_immediate_and_needs_no_event() {
    let emu = EmulatedStreams::with_log();
    // One block per chunk: reuse is the only way to get the same address back.
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(1024));
    let s = emu.create_stream();
    let a = pool.allocate(1000, &s).unwrap();
    assert_eq!(a.size(), 1024);
    assert_eq!(a.addr() % 256, 0);
    emu.launch(&s, a.addr(), a.size());
    pool.deallocate(a.addr(), 1000, &s).unwrap();
    let b = pool.allocate(1000, &s).unwrap();
    assert_eq!(
        a, b,
        "reused at once on the same stream, pending work or not"
    );
    let calls = emu.calls();
    assert_eq!(
        (calls.records, calls.waits, calls.events_created),
        (0, 0, 0),
        "a stream nobody steals from needs no event: {calls:?}"
    );
    pool.deallocate(b.addr(), b.size(), &s).unwrap();
    assert_all_returned(&pool, &s);
}

#[test]
fn block_with_pending_work_goes_to_another_stream_only_after_a_wait() {
    let emu = EmulatedStreams::with_log();
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(1024));
    let (s, t) = (emu.create_stream(), emu.create_stream());
    let a = pool.allocate(1024, &s).unwrap();
    emu.launch(&s, a.addr(), a.size());
    pool.deallocate(a.addr(), a.size(), &s).unwrap();

    let b = pool.allocate(1024, &t).unwrap();
    assert_eq!(a, b, "taken from s rather than grown");
    emu.launch(&t, b.addr(), b.size());

    let log = emu.log_entries();
    let s_use = log
        .iter()
        .position(|op| matches!(op, EmulatedOp::Launch { stream, .. } if *stream == s.id()))
        .unwrap();
    let wait = log
        .iter()
        .position(|op| {
            matches!(op, EmulatedOp::Wait { stream, on: Some((on, pos)), satisfied: false, .. }
                if *stream == t.id() && *on == s.id() && *pos >= 1)
        })
        .unwrap_or_else(|| panic!("no pending wait of t on s in {log:#?}"));
    let t_use = log
        .iter()
        .position(|op| matches!(op, EmulatedOp::Launch { stream, .. } if *stream == t.id()))
        .unwrap();
    assert!(s_use < wait && wait < t_use, "{log:#?}");

    assert_eq!(emu.advance(&t, 10), 0, "t is held back by the wait");
    assert_eq!(emu.advance(&s, 10), 1);
    assert_eq!(emu.advance(&t, 10), 2);
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());

    let ts = stream_stats(&pool, &t);
    let ss = stream_stats(&pool, &s);
    assert_eq!((ts.steals, ts.waits, ss.stolen, ss.records), (1, 1, 1, 1));
    assert_eq!(
        emu.calls().events_created,
        1,
        "one event, made for s's first record; t needed none"
    );
    pool.deallocate(b.addr(), b.size(), &t).unwrap();
    assert_all_returned(&pool, &t);
}

#[test]
fn block_is_handed_over_at_once_when_the_event_completed() {
    for policy in [
        EventPolicy::OnSteal,
        EventPolicy::EveryFree,
        EventPolicy::EveryNthFree(NonZeroU32::MIN),
    ] {
        let emu = EmulatedStreams::with_log();
        let pool = pool_with(
            &emu,
            PoolOptions::default().grow_bytes(1024).event_policy(policy),
        );
        let (s, t) = (emu.create_stream(), emu.create_stream());
        let a = pool.allocate(1024, &s).unwrap();
        emu.launch(&s, a.addr(), a.size());
        pool.deallocate(a.addr(), a.size(), &s).unwrap();
        assert_eq!(emu.advance(&s, 10), 1, "s finishes its work");

        let b = pool.allocate(1024, &t).unwrap();
        assert_eq!(a, b, "{policy:?}");
        assert_eq!(emu.pending(&t), 0, "{policy:?}: nothing enqueued on t");
        assert_eq!(emu.calls().waits_pending, 0, "{policy:?}");
        assert_eq!(stream_stats(&pool, &t).waits, 0, "{policy:?}");
        pool.deallocate(b.addr(), b.size(), &t).unwrap();
    }
}

#[test]
fn policies_record_as_documented() {
    let frees = 12u64;
    for (policy, want) in [
        (EventPolicy::OnSteal, 0),
        (EventPolicy::EveryFree, frees),
        (EventPolicy::EveryNthFree(NonZeroU32::new(4).unwrap()), 3),
    ] {
        let emu = EmulatedStreams::new();
        let pool = pool_with(&emu, PoolOptions::default().event_policy(policy));
        let s = emu.create_stream();
        for _ in 0..frees {
            let b = pool.allocate(100, &s).unwrap();
            pool.deallocate(b.addr(), 100, &s).unwrap();
        }
        assert_eq!(emu.calls().records, want, "{policy:?}");
        assert_eq!(stream_stats(&pool, &s).records, want, "{policy:?}");
    }
}

#[test]
fn steal_takes_one_block_not_the_list() {
    let emu = EmulatedStreams::new();
    // Chunks of exactly one block, so that frees on s cannot coalesce.
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(256));
    let (s, t) = (emu.create_stream(), emu.create_stream());
    let blocks: Vec<Block> = (0..4).map(|_| pool.allocate(256, &s).unwrap()).collect();
    for b in &blocks {
        pool.deallocate(b.addr(), b.size(), &s).unwrap();
    }
    let got = pool.allocate(256, &t).unwrap();
    assert!(blocks.contains(&got));
    assert_eq!(stream_stats(&pool, &s).free_blocks, 3);
    assert_eq!(stream_stats(&pool, &t).free_blocks, 0);
    assert_eq!(pool.stats().chunks, 4, "no growth");
}

#[test]
fn steal_prefers_a_stream_whose_event_completed() {
    let emu = EmulatedStreams::new();
    let pool = pool_with(
        &emu,
        PoolOptions::default()
            .grow_bytes(256)
            .event_policy(EventPolicy::EveryFree),
    );
    let (busy, idle, t) = (
        emu.create_stream(),
        emu.create_stream(),
        emu.create_stream(),
    );
    let x = pool.allocate(256, &busy).unwrap();
    let y = pool.allocate(256, &idle).unwrap();
    emu.launch(&busy, x.addr(), 256);
    emu.launch(&idle, y.addr(), 256);
    pool.deallocate(x.addr(), 256, &busy).unwrap();
    pool.deallocate(y.addr(), 256, &idle).unwrap();
    emu.advance(&idle, 1);
    for _ in 0..3 {
        // Whatever order the map lists them in.
        let got = pool.allocate(256, &t).unwrap();
        assert_eq!(got, y, "the block whose stream is done");
        assert_eq!(emu.pending(&t), 0);
        pool.deallocate(got.addr(), 256, &idle).unwrap();
    }
}

#[test]
fn free_lists_are_gathered_before_out_of_memory() {
    let emu = EmulatedStreams::with_log();
    let pool = pool_with(
        &emu,
        PoolOptions::default()
            .grow_bytes(2048)
            .max_bytes(Some(2048)),
    );
    let (s, t, u) = (
        emu.create_stream(),
        emu.create_stream(),
        emu.create_stream(),
    );
    let a = pool.allocate(1024, &s).unwrap();
    let b = pool.allocate(1024, &s).unwrap();
    emu.launch(&s, a.addr(), 1024);
    emu.launch(&s, b.addr(), 1024);
    pool.deallocate(a.addr(), 1024, &s).unwrap();
    // Free b on t after ordering t behind s's use of it (the caller's duty).
    let ev = emu.create_event().unwrap();
    emu.record(&ev, &s).unwrap();
    emu.wait(&t, &ev).unwrap();
    pool.deallocate(b.addr(), 1024, &t).unwrap();
    // Neither list holds 2048 contiguous bytes and the pool is at its limit.
    let c = pool.allocate(2048, &u).unwrap();
    assert_eq!(c.addr(), a.addr().min(b.addr()));
    emu.launch(&u, c.addr(), 2048);
    assert!(emu.run_until_idle());
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
    assert_eq!(pool.stats().chunks, 1);
    pool.deallocate(c.addr(), 2048, &u).unwrap();
    assert_all_returned(&pool, &u);
}

#[test]
fn out_of_memory_says_what_and_why() {
    let emu = EmulatedStreams::new();
    let pool = pool_with(
        &emu,
        PoolOptions::default()
            .grow_bytes(4096)
            .max_bytes(Some(4096)),
    );
    let s = emu.create_stream();
    let a = pool.allocate(3000, &s).unwrap();
    let err = pool.allocate(2000, &s).unwrap_err();
    let Error::OutOfMemory(msg) = &err else {
        panic!("wrong error {err:?}")
    };
    for want in [
        "cannot allocate 2000 bytes",
        "alignment 256",
        &format!("on stream {}", s.id()),
        "host pool",
        "pool size 4096 bytes",
        "3072 bytes in use",
        "largest free block 1024 bytes",
        "limit 4096 bytes",
        "at its limit",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg:?}");
    }
    assert_eq!(
        std::io::Error::from(err).kind(),
        std::io::ErrorKind::OutOfMemory
    );
    pool.deallocate(a.addr(), 3000, &s).unwrap();
    assert!(pool.allocate(4096, &s).is_ok(), "the pool recovers");

    let unlimited = pool_with(&emu, PoolOptions::default());
    let err = unlimited.allocate(usize::MAX - 10, &s).unwrap_err();
    assert!(
        matches!(&err, Error::OutOfMemory(m) if m.contains("limit none") && m.contains("overflows")),
        "{err}"
    );
}

#[test]
fn upstream_failure_is_out_of_memory_with_its_reason() {
    struct Refusing;
    impl Upstream for Refusing {
        fn kind(&self) -> MemoryKind {
            MemoryKind::Device
        }
        fn allocate(&self, bytes: usize, _align: usize) -> crate::Result<usize> {
            Err(Error::OutOfMemory(format!("no room for {bytes}")))
        }
        unsafe fn deallocate(&self, _: usize, _: usize, _: usize) -> crate::Result<()> {
            Ok(())
        }
    }
    let emu = EmulatedStreams::new();
    let pool = PoolResource::new(Refusing, emu.clone(), PoolOptions::default()).unwrap();
    let err = pool.allocate(10, &emu.create_stream()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("device pool") && msg.contains("no room for 256"),
        "{msg}"
    );
    assert_eq!(pool.stats().pool_bytes, 0, "the reservation was undone");
}

#[test]
fn limit_is_never_exceeded() {
    let emu = EmulatedStreams::new();
    let max = 10 * 1024;
    let pool = pool_with(
        &emu,
        PoolOptions::default().grow_bytes(4096).max_bytes(Some(max)),
    );
    let s = emu.create_stream();
    let mut live = Vec::new();
    loop {
        match pool.allocate(256, &s) {
            Ok(b) => live.push(b),
            Err(Error::OutOfMemory(_)) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(pool.stats().pool_bytes <= max);
    }
    // 4096 + 4096 + the 2048 of room left: every byte up to the limit was usable.
    assert_eq!(live.len(), max / 256);
    assert_eq!(pool.stats().pool_bytes, max);
    for b in live {
        pool.deallocate(b.addr(), 256, &s).unwrap();
    }
    assert_all_returned(&pool, &s);
    assert!(PoolResource::new(
        HostUpstream,
        emu.clone(),
        PoolOptions::default()
            .initial_bytes(8192)
            .max_bytes(Some(4096))
    )
    .is_err());
}

/// Hands out consecutive pieces of one buffer, so that chunks are adjacent in memory.
struct Arena {
    base: usize,
    size: usize,
    next: Mutex<usize>,
}

impl Arena {
    fn new(size: usize) -> Self {
        let base = HostUpstream.allocate(size, 4096).unwrap();
        Arena {
            base,
            size,
            next: Mutex::new(0),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this size and alignment, freed once.
        unsafe { HostUpstream.deallocate(self.base, self.size, 4096).unwrap() };
    }
}

impl Upstream for Arena {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn allocate(&self, bytes: usize, align: usize) -> crate::Result<usize> {
        let mut next = self.next.lock().unwrap();
        let at = (*next + align - 1) & !(align - 1);
        if at + bytes > self.size {
            return Err(Error::OutOfMemory("arena full".to_string()));
        }
        *next = at + bytes;
        Ok(self.base + at)
    }
    unsafe fn deallocate(&self, _: usize, _: usize, _: usize) -> crate::Result<()> {
        Ok(())
    }
}

#[test]
fn adjacent_upstream_chunks_are_never_merged() {
    let emu = EmulatedStreams::new();
    let pool = PoolResource::new(
        Arena::new(1 << 20),
        emu.clone(),
        PoolOptions::default().grow_bytes(1024),
    )
    .unwrap();
    let s = emu.create_stream();
    let blocks: Vec<Block> = (0..8).map(|_| pool.allocate(1024, &s).unwrap()).collect();
    for w in blocks.windows(2) {
        assert_eq!(w[0].addr() + 1024, w[1].addr(), "the arena's chunks touch");
    }
    for b in &blocks {
        pool.deallocate(b.addr(), 1024, &s).unwrap();
    }
    pool.consolidate(&s).unwrap();
    assert_eq!(pool.free_blocks().len(), 8, "one free block per chunk");
    let big = pool.allocate(2048, &s).unwrap();
    assert_eq!(pool.stats().chunks, 9, "2048 bytes need a new chunk");
    assert!(big.addr() >= blocks[7].addr() + 1024);
    pool.deallocate(big.addr(), 2048, &s).unwrap();
    // What follows is about the list: the block this thread just freed goes there first.
    pool.flush_thread_caches();
    let stats = pool.stats();
    assert_eq!(stats.free_bytes, stats.pool_bytes);
    assert_eq!(pool.free_blocks().len(), 9);
}

#[test]
fn deallocate_refuses_foreign_pointers_and_double_frees() {
    let emu = EmulatedStreams::new();
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(4096));
    let s = emu.create_stream();
    let a = pool.allocate(256, &s).unwrap();
    let _keep = pool.allocate(256, &s).unwrap();
    let outside = a.addr() + (1 << 30);
    assert!(matches!(
        pool.deallocate(outside, 256, &s),
        Err(Error::InvalidArgument(m)) if m.contains("not a block of this pool")
    ));
    assert!(matches!(
        pool.deallocate(a.addr() + 8, 256, &s),
        Err(Error::InvalidArgument(_))
    ));
    pool.deallocate(a.addr(), 256, &s).unwrap();
    assert!(matches!(
        pool.deallocate(a.addr(), 256, &s),
        Err(Error::InvalidArgument(m)) if m.contains("double free")
    ));
    assert_eq!(
        pool.stats().in_use_bytes,
        256,
        "a refused free changes nothing"
    );
}

#[test]
fn initial_memory_goes_to_any_stream_without_events() {
    let emu = EmulatedStreams::new();
    let pool = pool_with(
        &emu,
        PoolOptions::default()
            .initial_bytes(8192)
            .grow_bytes(1024)
            .max_bytes(Some(8192)),
    );
    let (s, t) = (emu.create_stream(), emu.create_stream());
    let a = pool.allocate(4096, &s).unwrap();
    let b = pool.allocate(4096, &t).unwrap();
    assert_ne!(a, b);
    assert_eq!(pool.stats().chunks, 1);
    let calls = emu.calls();
    assert_eq!(
        (calls.records, calls.waits, calls.events_created),
        (0, 0, 0),
        "{calls:?}"
    );
    pool.deallocate(a.addr(), 4096, &s).unwrap();
    pool.deallocate(b.addr(), 4096, &t).unwrap();
    assert_all_returned(&pool, &s);
}

#[test]
fn detached_stream_lends_its_blocks_and_leaves() {
    let emu = EmulatedStreams::with_log();
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(1024));
    let (s, t) = (emu.create_stream(), emu.create_stream());
    let a = pool.allocate(1024, &s).unwrap();
    emu.launch(&s, a.addr(), 1024);
    pool.deallocate(a.addr(), 1024, &s).unwrap();
    pool.detach_stream(&s).unwrap();
    assert!(!stream_stats(&pool, &s).attached);
    let records = emu.calls().records;
    assert_eq!(records, 1, "detach records the last event");
    drop(s); // The pool holds no handle of s any more.

    let b = pool.allocate(1024, &t).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        emu.calls().records,
        records,
        "no record on the detached stream"
    );
    assert_eq!(
        emu.calls().waits_pending,
        1,
        "but t waits for its last work"
    );
    assert_eq!(pool.stats().streams.len(), 1, "the drained list is gone");
    emu.launch(&t, b.addr(), 1024);
    assert!(emu.run_until_idle());
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
}

#[test]
fn detached_stream_used_again_is_attached_again() {
    let emu = EmulatedStreams::new();
    let pool = pool_with(&emu, PoolOptions::default());
    let s = emu.create_stream();
    let a = pool.allocate(256, &s).unwrap();
    let b = pool.allocate(256, &s).unwrap();
    pool.deallocate(a.addr(), 256, &s).unwrap();
    pool.detach_stream(&s).unwrap();
    pool.deallocate(b.addr(), 256, &s).unwrap();
    assert!(stream_stats(&pool, &s).attached);
    let c = pool.allocate(256, &s).unwrap();
    pool.deallocate(c.addr(), 256, &s).unwrap();
    assert_all_returned(&pool, &s);
}

#[test]
fn stats_count_per_stream_and_peak() {
    const SLACK: usize = 1 << 20;
    let emu = EmulatedStreams::new();
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(1 << 16));
    let (s, t) = (emu.create_stream(), emu.create_stream());
    let a = pool.allocate(1000, &s).unwrap();
    let b = pool.allocate(3000, &s).unwrap();
    let c = pool.allocate(10, &t).unwrap();
    pool.deallocate(a.addr(), 1000, &s).unwrap();
    pool.deallocate(b.addr(), 3000, &s).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 256, "exact");
    // `c`'s miss on t sent this thread's cache for s to the list (it is worth taking before
    // growing), so `a` went to the list and made the entry again, and `b` waits in it.
    assert_eq!(stats.cached_bytes, 3072, "b waits in this thread's cache");
    assert_eq!(stats.free_bytes, (1 << 16) - 256);
    // What follows is about the lists: the cached blocks go there first.
    pool.flush_thread_caches();
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 256, "exact");
    assert_eq!(stats.cached_bytes, 0);
    // Small changes are checkpointed late: the peak may miss up to 1 MiB per stream.
    let true_peak = 1024 + 3072 + 256;
    assert!(stats.peak_in_use_bytes <= true_peak, "{stats:?}");
    assert!(
        stats.peak_in_use_bytes + 2 * SLACK >= true_peak,
        "{stats:?}"
    );
    assert_eq!(
        stats.pool_bytes,
        1 << 16,
        "s and t share the one chunk s grew"
    );
    assert_eq!(stats.alignment, 256);
    assert_eq!(stats.memory, MemoryKind::Host);
    // s grew for `a` and left the rest in the fresh list; `b` and `c` came from there.
    let ss = stream_stats(&pool, &s);
    assert_eq!((ss.allocations, ss.frees, ss.free_blocks), (2, 2, 1));
    assert_eq!((ss.free_bytes, ss.stolen, ss.steals), (4096, 0, 1));
    let ts = stream_stats(&pool, &t);
    assert_eq!(
        (ts.allocations, ts.frees, ts.steals, ts.waits),
        (1, 0, 1, 0)
    );
    assert_eq!(ts.free_bytes, 0);
    let fresh = stats
        .streams
        .iter()
        .find(|x| x.stream == StreamId::FRESH)
        .expect("the fresh list");
    assert_eq!(
        (fresh.stolen, fresh.free_bytes, fresh.attached),
        (2, (1 << 16) - 4096 - 256, false)
    );

    // A large allocation is checkpointed at once.
    let d = pool.allocate(4 * SLACK, &s).unwrap();
    pool.deallocate(d.addr(), d.size(), &s).unwrap();
    let peak = pool.stats().peak_in_use_bytes;
    assert!((4 * SLACK..=4 * SLACK + 256).contains(&peak), "peak {peak}");
    pool.deallocate(c.addr(), 10, &t).unwrap();
    assert_all_returned(&pool, &t);
}

#[test]
fn threads_that_miss_together_grow_the_pool_once() {
    for shared_stream in [true, false] {
        let emu = EmulatedStreams::new();
        let pool = Arc::new(pool_with(&emu, PoolOptions::default().grow_bytes(1 << 20)));
        let one = emu.create_stream();
        let start = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (pool, start) = (Arc::clone(&pool), Arc::clone(&start));
                let stream = if shared_stream {
                    one.clone()
                } else {
                    emu.create_stream()
                };
                std::thread::spawn(move || {
                    start.wait();
                    pool.allocate(4096, &stream).unwrap()
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(pool.stats().chunks, 1, "shared stream: {shared_stream}");
    }
}

#[test]
fn alignment_is_configurable() {
    let emu = EmulatedStreams::new();
    let s = emu.create_stream();
    for align in [64usize, 256, 4096] {
        let pool = pool_with(&emu, PoolOptions::default().alignment(align));
        for size in [1, align - 1, align, align + 1, 3 * align] {
            let b = pool.allocate(size, &s).unwrap();
            assert_eq!(b.addr() % align, 0);
            assert_eq!(b.size() % align, 0);
            assert!(b.size() >= size);
        }
    }
    assert!(PoolResource::new(
        HostUpstream,
        emu.clone(),
        PoolOptions::default().alignment(100)
    )
    .is_err());
}

// ---- stress ----------------------------------------------------------------------------------
// The multi-threaded stress runs live in the integration suite (tests/memory), where every
// backend, the emulated one and the real GPU, runs the same shapes.

// ---- properties ------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Alloc { stream: usize, size: usize },
    Free { pick: usize, on: usize },
    Advance { stream: usize, items: usize },
    Consolidate { stream: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, 1usize..3000).prop_map(|(stream, size)| Op::Alloc { stream, size }),
        3 => (any::<usize>(), 0usize..3).prop_map(|(pick, on)| Op::Free { pick, on }),
        2 => (0usize..3, 0usize..4).prop_map(|(stream, items)| Op::Advance { stream, items }),
        1 => (0usize..3).prop_map(|stream| Op::Consolidate { stream }),
    ]
}

/// Free blocks (in lists and threads' caches) and live blocks tile the chunks exactly; no
/// free block crosses a chunk; no two neighbouring free blocks of one list and one chunk are
/// left unmerged.
fn check_tiling(pool: &TestPool, live: &[(Block, usize)]) -> Result<(), TestCaseError> {
    let chunks = pool.chunk_list();
    let free = pool.free_blocks();
    let mut pieces: Vec<(usize, usize)> = free
        .iter()
        .chain(&pool.cached_blocks())
        .map(|(_, b)| (b.addr, b.size))
        .collect();
    pieces.extend(live.iter().map(|(b, _)| (b.addr(), b.size())));
    pieces.sort_unstable();
    let mut ci = chunks.iter().peekable();
    let mut at = None::<usize>;
    for (addr, size) in pieces {
        let next = match at {
            Some(a) if a == addr => a + size,
            _ => {
                // A new chunk must start here.
                let c = ci
                    .next()
                    .ok_or_else(|| TestCaseError::fail("piece outside chunks"))?;
                prop_assert_eq!(c.addr, addr);
                addr + size
            }
        };
        at = Some(next);
        let c = chunks
            .iter()
            .find(|c| c.addr <= addr && addr < c.end())
            .unwrap();
        prop_assert!(next <= c.end(), "piece crosses chunk end");
        if next == c.end() {
            at = None;
        }
    }
    prop_assert!(
        ci.next().is_none() && at.is_none(),
        "chunks not fully tiled"
    );
    for w in free.windows(2) {
        let ((s1, a), (s2, b)) = (w[0], w[1]);
        let mergeable = s1 == s2 && a.chunk == b.chunk && a.end() == b.addr;
        prop_assert!(!mergeable, "unmerged neighbours {:?} {:?}", a, b);
    }
    let stats = pool.stats();
    let live_bytes: usize = live.iter().map(|(b, _)| b.size()).sum();
    prop_assert_eq!(stats.in_use_bytes, live_bytes);
    prop_assert_eq!(stats.free_bytes + live_bytes, stats.pool_bytes);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of allocations, frees (on the allocating or another stream, ordered by the
    /// caller), device progress and consolidations keeps the pool's books exact and never
    /// lets two streams touch the same bytes out of order.
    #[test]
    fn any_sequence_keeps_the_books(ops in proptest::collection::vec(op(), 1..120)) {
        let emu = EmulatedStreams::new();
        let pool = pool_with(&emu, PoolOptions::default().grow_bytes(8192).max_bytes(Some(64 << 10)));
        let streams: Vec<EmulatedStream> = (0..3).map(|_| emu.create_stream()).collect();
        let mut live: Vec<(Block, usize)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { stream, size } => match pool.allocate(size, &streams[stream]) {
                    Ok(b) => {
                        prop_assert!(b.size() >= size && b.addr() % 256 == 0);
                        emu.launch(&streams[stream], b.addr(), b.size());
                        live.push((b, stream));
                    }
                    Err(Error::OutOfMemory(_)) => {}
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                },
                Op::Free { pick, on } if !live.is_empty() => {
                    let (b, used) = live.swap_remove(pick % live.len());
                    if on != used {
                        // The caller orders the freeing stream after the using one.
                        let ev = emu.create_event().unwrap();
                        emu.record(&ev, &streams[used]).unwrap();
                        emu.wait(&streams[on], &ev).unwrap();
                    }
                    pool.deallocate(b.addr(), b.size(), &streams[on]).unwrap();
                }
                Op::Free { .. } => {}
                Op::Advance { stream, items } => {
                    emu.advance(&streams[stream], items);
                }
                Op::Consolidate { stream } => pool.consolidate(&streams[stream]).unwrap(),
            }
            check_tiling(&pool, &live)?;
        }
        prop_assert!(emu.run_until_idle());
        prop_assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
    }
}

// ---- thread caches ---------------------------------------------------------------------------

/// Runs `f` on a new thread and waits for it (so that its thread cache is flushed on exit).
fn on_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(f).join().unwrap()
}

#[test]
fn thread_cache_serves_the_same_stream_without_the_list() {
    let emu = EmulatedStreams::with_log();
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(1 << 16));
    let s = emu.create_stream();
    let a = pool.allocate(4096, &s).unwrap();
    emu.launch(&s, a.addr(), a.size());
    pool.deallocate(a.addr(), a.size(), &s).unwrap();
    assert_eq!(
        pool.cached_blocks().len(),
        1,
        "the free went to this thread's cache"
    );
    assert!(
        pool.free_blocks().iter().all(|(_, b)| b.addr != a.addr()),
        "and not to the list"
    );
    let stats = pool.stats();
    assert_eq!((stats.cached_bytes, stats.in_use_bytes), (4096, 0));
    assert_eq!(stats.free_bytes, stats.pool_bytes);

    let again = pool.allocate(4000, &s).unwrap();
    assert_eq!(
        again, a,
        "the same size on the same stream: the cached block"
    );
    emu.launch(&s, again.addr(), again.size());
    let ss = stream_stats(&pool, &s);
    assert_eq!((ss.allocations, ss.frees, ss.cached_blocks), (2, 1, 0));
    assert_eq!(pool.stats().in_use_bytes, 4096);
    assert_eq!(emu.calls().records, 0, "no event for same-stream reuse");
    assert!(emu.run_until_idle());
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
    pool.deallocate(again.addr(), again.size(), &s).unwrap();
    assert_all_returned(&pool, &s);
}

#[test]
fn cached_blocks_reach_other_streams_only_through_the_event() {
    let emu = EmulatedStreams::with_log();
    let pool = Arc::new(pool_with(&emu, PoolOptions::default().grow_bytes(1 << 16)));
    let (s, t) = (emu.create_stream(), emu.create_stream());
    let (x, y) = {
        let (p, e, st) = (Arc::clone(&pool), emu.clone(), s.clone());
        let (go, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (g, d) = (Arc::clone(&go), Arc::clone(&done));
        let h = std::thread::spawn(move || {
            let (pool, emu, s) = (p, e, st);
            let x = pool.allocate(4096, &s).unwrap();
            emu.launch(&s, x.addr(), x.size());
            pool.deallocate(x.addr(), x.size(), &s).unwrap();
            g.wait();
            d.wait();
            x
        });
        go.wait();
        // x waits in the other thread's cache for s: t cannot have it.
        let y = pool.allocate(4096, &t).unwrap();
        assert_eq!(pool.stats().cached_bytes, 4096);
        done.wait();
        (h.join().unwrap(), y)
    };
    assert_ne!(y, x, "t took a block cached by another thread");
    // That thread exited: x went to s's list, and t gets it after a wait on s's work.
    assert_eq!(pool.stats().cached_bytes, 0);
    assert!(pool
        .free_blocks()
        .iter()
        .any(|(id, b)| *id == s.id() && b.addr == x.addr()));
    let mut got = Vec::new();
    while !got.contains(&x) {
        let b = pool.allocate(4096, &t).unwrap();
        emu.launch(&t, b.addr(), b.size());
        got.push(b);
        assert!(got.len() < 64, "x never came to t");
    }
    assert_eq!(stream_stats(&pool, &t).waits, 1, "t waited on s's work");
    emu.advance(&t, 100);
    assert!(emu.pending(&t) > 0, "t is held back by the wait on s");
    assert!(emu.run_until_idle());
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
    for b in got.into_iter().chain([y]) {
        pool.deallocate(b.addr(), b.size(), &t).unwrap();
    }
    assert_all_returned(&pool, &t);
}

#[test]
fn thread_exit_returns_its_cache_to_the_lists() {
    let emu = EmulatedStreams::new();
    let pool = Arc::new(pool_with(&emu, PoolOptions::default().grow_bytes(1 << 16)));
    let s = emu.create_stream();
    let (p, st) = (Arc::clone(&pool), s.clone());
    let freed = on_thread(move || {
        let blocks: Vec<Block> = (0..5).map(|i| p.allocate(256 << i, &st).unwrap()).collect();
        for b in &blocks {
            p.deallocate(b.addr(), b.size(), &st).unwrap();
        }
        assert_eq!(p.stats().cached_bytes, 31 * 256);
        blocks
    });
    let stats = pool.stats();
    assert_eq!(
        (stats.cached_bytes, stats.in_use_bytes),
        (0, 0),
        "{stats:?}"
    );
    let ss = stream_stats(&pool, &s);
    assert_eq!(
        (ss.allocations, ss.frees),
        (5, 5),
        "the counters came along"
    );
    let in_list: usize = pool
        .free_blocks()
        .iter()
        .filter(|(id, _)| *id == s.id())
        .map(|(_, b)| b.size)
        .sum();
    assert!(in_list >= freed.iter().map(|b| b.size()).sum::<usize>());
    assert_all_returned(&pool, &s);
}

#[test]
fn detach_consolidate_and_flush_drain_every_threads_cache() {
    for how in ["detach", "consolidate", "flush"] {
        let emu = EmulatedStreams::new();
        let pool = Arc::new(pool_with(&emu, PoolOptions::default().grow_bytes(1 << 16)));
        let (s, t) = (emu.create_stream(), emu.create_stream());
        let (cached, drained) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let h = {
            let (pool, emu, s) = (Arc::clone(&pool), emu.clone(), s.clone());
            let (c, d) = (Arc::clone(&cached), Arc::clone(&drained));
            std::thread::spawn(move || {
                let x = pool.allocate(8192, &s).unwrap();
                emu.launch(&s, x.addr(), x.size());
                pool.deallocate(x.addr(), x.size(), &s).unwrap();
                c.wait();
                d.wait();
                x
            })
        };
        cached.wait();
        assert_eq!(pool.stats().cached_bytes, 8192, "{how}");
        match how {
            "detach" => pool.detach_stream(&s).unwrap(),
            "consolidate" => pool.consolidate(&t).unwrap(),
            _ => pool.flush_thread_caches(),
        }
        // The owner is still alive: the pool took the blocks out of its cache.
        let stats = pool.stats();
        assert_eq!((stats.cached_bytes, stats.in_use_bytes), (0, 0), "{how}");
        assert_eq!(stats.free_bytes, stats.pool_bytes, "{how}");
        drained.wait();
        let x = h.join().unwrap();
        let holder = if how == "consolidate" { t.id() } else { s.id() };
        assert!(
            pool.free_blocks()
                .iter()
                .any(|(id, b)| *id == holder && b.addr <= x.addr() && x.addr() < b.end()),
            "{how}: {:?}",
            pool.free_blocks()
        );
        if how == "detach" {
            // The detach's record covers the cached block: t takes it after a wait.
            let got = pool.allocate(8192, &t).unwrap();
            emu.launch(&t, got.addr(), got.size());
            assert!(emu.run_until_idle());
            assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
            pool.deallocate(got.addr(), got.size(), &t).unwrap();
        }
        assert_all_returned(&pool, &t);
    }
}

#[test]
fn pool_dropped_before_a_thread_with_a_cache_exits() {
    let emu = EmulatedStreams::new();
    let pool = Arc::new(pool_with(&emu, PoolOptions::default().grow_bytes(1 << 16)));
    let s = emu.create_stream();
    let (cached, dropped) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let h = {
        let (pool, s) = (Arc::clone(&pool), s.clone());
        let (c, d) = (Arc::clone(&cached), Arc::clone(&dropped));
        std::thread::spawn(move || {
            let x = pool.allocate(4096, &s).unwrap();
            pool.deallocate(x.addr(), x.size(), &s).unwrap();
            drop(pool);
            c.wait();
            d.wait();
            // Exits with a cache whose pool is gone.
        })
    };
    cached.wait();
    drop(pool);
    dropped.wait();
    h.join().unwrap();
}

#[test]
fn pool_at_its_limit_takes_blocks_from_other_threads_caches() {
    let emu = EmulatedStreams::new();
    let pool = Arc::new(pool_with(
        &emu,
        PoolOptions::default()
            .grow_bytes(64 << 10)
            .max_bytes(Some(64 << 10)),
    ));
    let (s, t) = (emu.create_stream(), emu.create_stream());
    let (cached, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let h = {
        let (pool, s) = (Arc::clone(&pool), s.clone());
        let (c, d) = (Arc::clone(&cached), Arc::clone(&done));
        std::thread::spawn(move || {
            let blocks: Vec<Block> = (0..16).map(|_| pool.allocate(4096, &s).unwrap()).collect();
            for b in &blocks {
                pool.deallocate(b.addr(), b.size(), &s).unwrap();
            }
            c.wait();
            d.wait();
        })
    };
    cached.wait();
    assert_eq!(
        pool.stats().cached_bytes,
        64 << 10,
        "the whole pool is cached"
    );
    let all = pool.allocate(64 << 10, &t).unwrap();
    assert_eq!(all.size(), 64 << 10);
    assert_eq!(pool.stats().chunks, 1);
    done.wait();
    h.join().unwrap();
    pool.deallocate(all.addr(), all.size(), &t).unwrap();
    assert_all_returned(&pool, &t);
}

#[test]
fn thread_cache_refuses_a_double_free_and_stays_bounded() {
    let emu = EmulatedStreams::new();
    let pool = pool_with(&emu, PoolOptions::default().grow_bytes(1 << 20));
    let s = emu.create_stream();
    let a = pool.allocate(256, &s).unwrap();
    pool.deallocate(a.addr(), 256, &s).unwrap();
    assert_eq!(pool.cached_blocks().len(), 1);
    assert!(matches!(
        pool.deallocate(a.addr(), 256, &s),
        Err(Error::InvalidArgument(m)) if m.contains("double free")
    ));
    assert_eq!(
        pool.stats().in_use_bytes,
        0,
        "a refused free changes nothing"
    );
    // Many frees: the cache keeps a bounded number of blocks, the rest goes to the list.
    let many: Vec<Block> = (0..200).map(|_| pool.allocate(1024, &s).unwrap()).collect();
    for b in &many {
        pool.deallocate(b.addr(), b.size(), &s).unwrap();
    }
    let cached = pool.cached_blocks();
    let of_1k = cached.iter().filter(|(_, b)| b.size == 1024).count();
    assert!((1..=16).contains(&of_1k), "{of_1k} blocks of 1 KiB cached");
    // Many sizes: the cache keeps blocks of at most 16 of them.
    let sizes: Vec<Block> = (1..=20)
        .map(|k| pool.allocate(k * 256, &s).unwrap())
        .collect();
    for b in &sizes {
        pool.deallocate(b.addr(), b.size(), &s).unwrap();
    }
    let mut kept: Vec<usize> = pool.cached_blocks().iter().map(|(_, b)| b.size).collect();
    kept.dedup();
    kept.sort_unstable();
    kept.dedup();
    assert!(kept.len() <= 16, "{kept:?}");
    let stats = pool.stats();
    assert_eq!(
        (stats.in_use_bytes, stats.free_bytes),
        (0, stats.pool_bytes)
    );
    // A block over the cache's size goes straight to the list.
    let big = pool.allocate(2 << 20, &s).unwrap();
    pool.deallocate(big.addr(), big.size(), &s).unwrap();
    assert!(pool.cached_blocks().iter().all(|(_, b)| b.size <= 1 << 20));
    assert_all_returned(&pool, &s);
}

#[test]
fn threads_sharing_streams_never_get_one_block_twice() {
    const THREADS: usize = 8;
    let emu = EmulatedStreams::new();
    let pool = Arc::new(pool_with(
        &emu,
        PoolOptions::default()
            .grow_bytes(256 << 10)
            .max_bytes(Some(4 << 20)),
    ));
    let streams: Arc<Vec<EmulatedStream>> = Arc::new((0..3).map(|_| emu.create_stream()).collect());
    // Every block handed out and not yet freed, by address: an overlap is a double hand-out.
    let live: Arc<Mutex<std::collections::BTreeMap<usize, usize>>> = Arc::default();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, emu, streams, live) = (
                Arc::clone(&pool),
                emu.clone(),
                Arc::clone(&streams),
                Arc::clone(&live),
            );
            std::thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((t as u64 + 1) << 20);
                let mut next = move || {
                    rng ^= rng >> 12;
                    rng ^= rng << 25;
                    rng ^= rng >> 27;
                    rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
                };
                let mut mine: Vec<(Block, usize)> = Vec::new();
                for _ in 0..3000 {
                    let r = next();
                    if mine.len() < 12 && r % 3 != 0 {
                        let on = (next() % 3) as usize;
                        let size = 256 << (next() % 6);
                        let b = match pool.allocate(size, &streams[on]) {
                            Ok(b) => b,
                            Err(Error::OutOfMemory(_)) => continue,
                            Err(e) => panic!("{e}"),
                        };
                        {
                            let mut live = live.lock().unwrap();
                            let before = live.range(..b.addr() + b.size()).next_back();
                            if let Some((&a, &n)) = before {
                                assert!(a + n <= b.addr(), "{b:?} overlaps live [{a:#x}, +{n})");
                            }
                            live.insert(b.addr(), b.size());
                        }
                        emu.launch(&streams[on], b.addr(), b.size());
                        mine.push((b, on));
                    } else if !mine.is_empty() {
                        let (b, used) = mine.swap_remove((r as usize / 3) % mine.len());
                        live.lock().unwrap().remove(&b.addr());
                        // Mostly on the stream that used it; sometimes on another, ordered
                        // after the use by the caller.
                        let on = if next() % 4 == 0 {
                            (used + 1) % 3
                        } else {
                            used
                        };
                        if on != used {
                            let ev = emu.create_event().unwrap();
                            emu.record(&ev, &streams[used]).unwrap();
                            emu.wait(&streams[on], &ev).unwrap();
                        }
                        pool.deallocate(b.addr(), b.size(), &streams[on]).unwrap();
                    }
                    if r % 7 == 0 {
                        emu.advance(&streams[(r % 3) as usize], 4);
                    }
                }
                for (b, on) in mine {
                    live.lock().unwrap().remove(&b.addr());
                    pool.deallocate(b.addr(), b.size(), &streams[on]).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(emu.run_until_idle());
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
    assert_all_returned(&pool, &streams[0]);
}
