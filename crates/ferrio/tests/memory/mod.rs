//! The pool's conformance suite, run against every stream model: emulated streams over host
//! memory on every `cargo test` (`emulated`), CUDA streams over device memory where there is a
//! GPU (`real`).
//!
//! The suite uses only the public API. A [`Backend`] puts work on a stream that writes a tag
//! over a block and reads it back later; a pool that hands a block to a second stream before
//! the first stream's work on it is done shows up as a wrong value read (real GPU) or as a
//! hazard (emulator). Every test ends by checking that every byte came back to the pool.

mod emulated;
mod real;

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier, Mutex};

use ferrio::memory::{Block, EventPolicy, PoolOptions, PoolResource, StreamOrder, Upstream};
use ferrio::Error;

use crate::support::Rng;

/// A stream of backend `B`.
pub type StreamOf<B> = <<B as Backend>::Order as StreamOrder>::Stream;
/// A pool of backend `B`.
pub type PoolOf<B> = PoolResource<<B as Backend>::Up, <B as Backend>::Order>;

/// A stream model, a memory upstream and a way to put work on streams.
pub trait Backend: Send + Sync + 'static {
    /// Where the pool's memory comes from.
    type Up: Upstream + 'static;
    /// The stream model.
    type Order: StreamOrder;
    /// Holds a stream until dropped (see [`Backend::hold`]).
    type Gate;

    /// A new pool.
    fn pool(&self, options: PoolOptions) -> PoolOf<Self>;
    /// A new stream.
    fn stream(&self) -> StreamOf<Self>;
    /// Work enqueued on `stream` after this call runs only once the gate is dropped.
    fn hold(&self, stream: &StreamOf<Self>) -> Self::Gate;
    /// Enqueues on `stream` work that writes `tag` over every word of `block`.
    fn write(&self, stream: &StreamOf<Self>, block: Block, tag: u32);
    /// Enqueues on `stream` a read of `block`'s first and last word, which [`finish`]
    /// (Backend::finish) checks against `tag`.
    fn read_expect(&self, stream: &StreamOf<Self>, block: Block, tag: u32);
    /// Lets `stream` make some progress, for backends whose streams run only when told (the
    /// emulator); others do nothing.
    fn progress(&self, stream: &StreamOf<Self>);
    /// Runs every stream to completion; returns every mismatch or ordering hazard seen.
    fn finish(&self, streams: &[StreamOf<Self>]) -> Vec<String>;
    /// After [`finish`](Backend::finish): the first word of `block` as the device has it now
    /// (`None` where the backend keeps no data, as the emulator).
    fn first_word(&self, block: Block) -> Option<u32>;
}

/// Every byte is back: nothing in use, the free lists hold the whole pool, and after
/// consolidating on `onto` each chunk is one free block again.
pub fn assert_all_returned<B: Backend>(pool: &PoolOf<B>, onto: &StreamOf<B>) {
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats:?}");
    assert_eq!(stats.free_bytes, stats.pool_bytes, "{stats:?}");
    pool.consolidate(onto).expect("consolidate");
    let stats = pool.stats();
    let blocks: usize = stats.streams.iter().map(|s| s.free_blocks).sum();
    assert_eq!(blocks, stats.chunks, "one free block per chunk: {stats:?}");
    assert_eq!(stats.free_bytes, stats.pool_bytes, "{stats:?}");
}

fn finish_clean<B: Backend>(b: &B, streams: &[StreamOf<B>]) {
    let failures = b.finish(streams);
    assert!(
        failures.is_empty(),
        "{} failures, first: {}",
        failures.len(),
        failures[0]
    );
}

/// A block freed on s is reused on s at once, with no event.
pub fn same_stream_reuse_is_immediate<B: Backend>(b: &B) {
    let pool = b.pool(PoolOptions::default().grow_bytes(1 << 20));
    let s = b.stream();
    let a = pool.allocate(1 << 20, &s).expect("allocate");
    b.write(&s, a, 0x1111_1111);
    pool.deallocate(a.addr(), a.size(), &s).expect("free");
    let again = pool.allocate(1 << 20, &s).expect("allocate");
    assert_eq!(a, again, "reused at once on the same stream");
    b.write(&s, again, 0x2222_2222);
    b.read_expect(&s, again, 0x2222_2222);
    pool.deallocate(again.addr(), again.size(), &s)
        .expect("free");
    finish_clean(b, std::slice::from_ref(&s));
    let st = pool.stats();
    let ss = &st.streams[0];
    assert_eq!((ss.records, ss.waits, ss.steals), (0, 0, 0), "{st:?}");
    assert_all_returned::<B>(&pool, &s);
}

/// A block whose last use on s is still pending goes to t only behind a device-side wait:
/// t's write lands after s's, whatever the host does meanwhile.
pub fn handoff_waits_for_pending_work<B: Backend>(b: &B) {
    for policy in [
        EventPolicy::OnSteal,
        EventPolicy::EveryFree,
        EventPolicy::EveryNthFree(NonZeroU32::new(3).expect("3")),
    ] {
        let pool = b.pool(
            PoolOptions::default()
                .grow_bytes(1 << 20)
                .event_policy(policy),
        );
        let (s, t) = (b.stream(), b.stream());
        let a = pool.allocate(1 << 20, &s).expect("allocate");
        let gate = b.hold(&s);
        b.write(&s, a, 0xAAAA_AAAA);
        pool.deallocate(a.addr(), a.size(), &s).expect("free");
        let got = pool.allocate(1 << 20, &t).expect("allocate");
        assert_eq!(got, a, "{policy:?}: taken from s, not grown");
        b.write(&t, got, 0xBBBB_BBBB);
        b.read_expect(&t, got, 0xBBBB_BBBB);
        drop(gate);
        finish_clean(b, &[s.clone(), t.clone()]);
        if let Some(word) = b.first_word(got) {
            assert_eq!(word, 0xBBBB_BBBB, "{policy:?}: t's write must land last");
        }
        let st = pool.stats();
        let ts = st.streams.iter().find(|x| x.steals == 1).expect("t stole");
        assert_eq!(ts.waits, 1, "{policy:?}: one device wait: {st:?}");
        assert_eq!(st.chunks, 1, "{policy:?}");
        pool.deallocate(got.addr(), got.size(), &t).expect("free");
        assert_all_returned::<B>(&pool, &t);
    }
}

/// Once s's work is done and covered by a completed event, t takes the block without a wait.
pub fn handoff_after_completion_needs_no_wait<B: Backend>(b: &B) {
    let pool = b.pool(
        PoolOptions::default()
            .grow_bytes(1 << 20)
            .event_policy(EventPolicy::EveryFree),
    );
    let (s, t) = (b.stream(), b.stream());
    let a = pool.allocate(1 << 20, &s).expect("allocate");
    b.write(&s, a, 0x3333_3333);
    pool.deallocate(a.addr(), a.size(), &s).expect("free");
    finish_clean(b, std::slice::from_ref(&s));
    let got = pool.allocate(1 << 20, &t).expect("allocate");
    assert_eq!(got, a);
    let st = pool.stats();
    assert!(st.streams.iter().all(|x| x.waits == 0), "{st:?}");
    pool.deallocate(got.addr(), got.size(), &t).expect("free");
    assert_all_returned::<B>(&pool, &t);
}

/// A detached stream's blocks go to others behind its last event; the stream itself may be
/// gone by then (its handle dropped, a CUDA stream destroyed).
pub fn detached_stream_lends_its_blocks<B: Backend>(b: &B) {
    let pool = b.pool(PoolOptions::default().grow_bytes(1 << 20));
    let t = b.stream();
    let a;
    let gate;
    {
        let s = b.stream();
        a = pool.allocate(1 << 20, &s).expect("allocate");
        gate = b.hold(&s);
        b.write(&s, a, 0x4444_4444);
        pool.deallocate(a.addr(), a.size(), &s).expect("free");
        pool.detach_stream(&s).expect("detach");
        let st = pool.stats();
        assert!(st.streams.iter().all(|x| !x.attached), "{st:?}");
    }
    let got = pool.allocate(1 << 20, &t).expect("allocate");
    assert_eq!(got, a);
    b.write(&t, got, 0x5555_5555);
    b.read_expect(&t, got, 0x5555_5555);
    drop(gate);
    finish_clean(b, std::slice::from_ref(&t));
    if let Some(word) = b.first_word(got) {
        assert_eq!(
            word, 0x5555_5555,
            "t's write must land after the detached stream's"
        );
    }
    assert_eq!(pool.stats().streams.len(), 1, "the drained list is gone");
    pool.deallocate(got.addr(), got.size(), &t).expect("free");
    assert_all_returned::<B>(&pool, &t);
}

/// Out of memory names the request and the pool's state, and the pool recovers.
pub fn out_of_memory_is_reported_and_recovered<B: Backend>(b: &B, kind: &str) {
    let pool = b.pool(
        PoolOptions::default()
            .grow_bytes(1 << 20)
            .max_bytes(Some(1 << 20)),
    );
    let s = b.stream();
    let a = pool.allocate(768 << 10, &s).expect("allocate");
    let err = pool.allocate(512 << 10, &s).expect_err("over the limit");
    let Error::OutOfMemory(msg) = &err else {
        panic!("wrong error {err:?}")
    };
    for want in [
        "cannot allocate 524288 bytes",
        &format!("{kind} pool"),
        "pool size 1048576 bytes",
        "786432 bytes in use",
        "limit 1048576 bytes",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg:?}");
    }
    pool.deallocate(a.addr(), a.size(), &s).expect("free");
    let whole = pool.allocate(1 << 20, &s).expect("the pool recovers");
    pool.deallocate(whole.addr(), whole.size(), &s)
        .expect("free");
    assert_all_returned::<B>(&pool, &s);
}

/// Threads that miss at the same moment take one upstream chunk between them.
pub fn threads_that_miss_together_grow_once<B: Backend>(b: &Arc<B>) {
    miss_together(b, 8);
}

/// [`threads_that_miss_together_grow_once`] again and again, with more threads than most
/// machines have cores, so that a grower is often preempted between taking its chunk and
/// publishing the rest of it (the race the H200's 16 cores hit with 8 threads).
pub fn threads_that_miss_together_grow_once_stress<B: Backend>(b: &Arc<B>, rounds: usize) {
    for _ in 0..rounds {
        miss_together(b, 32);
    }
}

fn miss_together<B: Backend>(b: &Arc<B>, threads: usize) {
    let pool = Arc::new(b.pool(PoolOptions::default().grow_bytes(8 << 20)));
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (pool, start, stream) = (Arc::clone(&pool), Arc::clone(&start), b.stream());
            std::thread::spawn(move || {
                start.wait();
                let blk = pool.allocate(4096, &stream).expect("allocate");
                (blk, stream)
            })
        })
        .collect();
    let got: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    assert_eq!(pool.stats().chunks, 1);
    for (blk, stream) in &got {
        pool.deallocate(blk.addr(), blk.size(), stream)
            .expect("free");
    }
    assert_all_returned::<B>(&pool, &got[0].1);
}

/// The rapidsai/rmm#1887 scenario (`benchmarks/memory_pool/pool_bench.cpp`, "kernels"): one
/// thread per stream, each allocating 1 MiB, putting work on it and freeing it, again and
/// again, with the pool pre-warmed (`warm`) or empty. Every stream can reuse its own block
/// after its first allocation, so no allocation may make one stream wait for another's work
/// on the device (that is the loss of overlap), and each stream takes memory from elsewhere
/// at most once.
pub fn kernels_on_many_streams_never_wait<B: Backend>(b: &Arc<B>, warm: bool) {
    const STREAMS: usize = 16;
    const PER_STREAM: usize = 32;
    const BYTES: usize = 1 << 20;
    let initial = if warm { 256 << 20 } else { 0 };
    let pool = Arc::new(
        b.pool(
            PoolOptions::default()
                .initial_bytes(initial)
                .grow_bytes(32 << 20),
        ),
    );
    let streams: Vec<_> = (0..STREAMS).map(|_| b.stream()).collect();
    // Two rounds, as the benchmark's pre-warmed case runs an untimed round first.
    for round in 0..2u32 {
        let start = Arc::new(Barrier::new(STREAMS));
        let handles: Vec<_> = streams
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, s)| {
                let (b, pool, start) = (Arc::clone(b), Arc::clone(&pool), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    for k in 0..PER_STREAM {
                        let blk = pool.allocate(BYTES, &s).expect("allocate");
                        b.write(&s, blk, (round << 24) | ((i as u32) << 8) | k as u32);
                        pool.deallocate(blk.addr(), blk.size(), &s).expect("free");
                    }
                    s
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
    }
    let stats = pool.stats();
    let waits: u64 = stats.streams.iter().map(|s| s.waits).sum();
    let steals: u64 = stats.streams.iter().map(|s| s.steals).sum();
    assert_eq!(
        waits, 0,
        "device waits between streams (warm {warm}): {stats:?}"
    );
    assert!(
        steals <= STREAMS as u64,
        "{steals} steals for {STREAMS} streams (warm {warm}): {stats:?}"
    );
    finish_clean(b.as_ref(), &streams);
    assert_all_returned::<B>(&pool, &streams[0]);
}

/// Live blocks of all threads, by address, to catch overlapping blocks.
#[derive(Default)]
struct Live(Mutex<BTreeMap<usize, usize>>);

impl Live {
    fn insert(&self, b: Block) {
        let mut live = self.0.lock().expect("live");
        if let Some((&a, &len)) = live.range(..=b.addr()).next_back() {
            assert!(a + len <= b.addr(), "{b:?} overlaps live [{a:#x}, +{len})");
        }
        if let Some((&a, &len)) = live.range(b.addr()..).next() {
            assert!(
                b.addr() + b.size() <= a,
                "{b:?} overlaps live [{a:#x}, +{len})"
            );
        }
        live.insert(b.addr(), b.size());
    }
    fn remove(&self, b: Block) {
        assert_eq!(
            self.0.lock().expect("live").remove(&b.addr()),
            Some(b.size())
        );
    }
}

/// How a stress run is shaped.
#[derive(Clone, Copy, Debug)]
pub struct Stress {
    /// Threads allocating and freeing at once.
    pub threads: usize,
    /// Streams they pick from at random.
    pub streams: usize,
    /// Allocations and frees per thread.
    pub ops: usize,
    /// Most blocks a thread holds at once.
    pub max_live: usize,
    /// The pool's limit, if any (then out-of-memory errors are allowed).
    pub max_bytes: Option<usize>,
    /// The event policy.
    pub policy: EventPolicy,
}

/// Many threads allocate, use and free random sizes on shared streams; live blocks never
/// overlap, every read sees the writer's tag, and every byte comes back.
pub fn stress<B: Backend>(b: &Arc<B>, cfg: Stress) {
    let pool = Arc::new(
        b.pool(
            PoolOptions::default()
                .grow_bytes(1 << 20)
                .max_bytes(cfg.max_bytes)
                .event_policy(cfg.policy),
        ),
    );
    let streams: Arc<Vec<StreamOf<B>>> = Arc::new((0..cfg.streams).map(|_| b.stream()).collect());
    let live = Arc::new(Live::default());
    let start = Arc::new(Barrier::new(cfg.threads));
    let handles: Vec<_> = (0..cfg.threads)
        .map(|t| {
            let (b, pool, streams, live, start) = (
                Arc::clone(b),
                Arc::clone(&pool),
                Arc::clone(&streams),
                Arc::clone(&live),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                let mut rng = Rng::new((t as u64 + 1) * 0x1234_5678);
                let mut mine: Vec<(Block, usize, u32)> = Vec::new();
                let mut ooms = 0usize;
                start.wait();
                for op in 0..cfg.ops {
                    let alloc = mine.is_empty() || (mine.len() < cfg.max_live && rng.below(10) < 6);
                    if alloc {
                        let size = match rng.below(10) {
                            0 => 1 + rng.below(256 << 10) as usize,
                            _ => 1 + rng.below(8 << 10) as usize,
                        };
                        let si = rng.below(streams.len() as u64) as usize;
                        let blk = match pool.allocate(size, &streams[si]) {
                            Ok(blk) => blk,
                            Err(Error::OutOfMemory(_)) if cfg.max_bytes.is_some() => {
                                ooms += 1;
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        };
                        live.insert(blk);
                        let tag = ((t as u32) << 24) ^ (op as u32) ^ 0x5A00_0000;
                        b.write(&streams[si], blk, tag);
                        mine.push((blk, si, tag));
                    } else {
                        let i = rng.below(mine.len() as u64) as usize;
                        let (blk, si, tag) = mine.swap_remove(i);
                        b.read_expect(&streams[si], blk, tag);
                        live.remove(blk);
                        pool.deallocate(blk.addr(), blk.size(), &streams[si])
                            .expect("free");
                    }
                    b.progress(&streams[rng.below(streams.len() as u64) as usize]);
                }
                for (blk, si, tag) in mine {
                    b.read_expect(&streams[si], blk, tag);
                    live.remove(blk);
                    pool.deallocate(blk.addr(), blk.size(), &streams[si])
                        .expect("free");
                }
                ooms
            })
        })
        .collect();
    let ooms: usize = handles
        .into_iter()
        .map(|h| h.join().expect("stress thread"))
        .sum();
    finish_clean(b.as_ref(), &streams);
    let stats = pool.stats();
    match cfg.max_bytes {
        Some(max) => assert!(stats.pool_bytes <= max, "{stats:?}"),
        None => assert_eq!(ooms, 0),
    }
    let steals: u64 = stats.streams.iter().map(|s| s.steals).sum();
    assert!(steals > 0, "the workload exercises stealing: {stats:?}");
    println!(
        "stress {cfg:?}: {} chunks, {} steals, {} waits, {} records, {ooms} out-of-memory",
        stats.chunks,
        steals,
        stats.streams.iter().map(|s| s.waits).sum::<u64>(),
        stats.streams.iter().map(|s| s.records).sum::<u64>(),
    );
    assert_all_returned::<B>(&pool, &streams[0]);
}

/// The stress shapes every backend runs.
pub const STRESS: [Stress; 5] = [
    // Threads sharing one stream (one default stream per device): the thread caches' case,
    // with a limit, so that allocations must drain other threads' caches.
    Stress {
        threads: 12,
        streams: 1,
        ops: 3000,
        max_live: 12,
        max_bytes: Some(4 << 20),
        policy: EventPolicy::OnSteal,
    },
    Stress {
        threads: 8,
        streams: 6,
        ops: 3000,
        max_live: 12,
        max_bytes: None,
        policy: EventPolicy::OnSteal,
    },
    Stress {
        threads: 8,
        streams: 3,
        ops: 2000,
        max_live: 12,
        max_bytes: None,
        policy: EventPolicy::EveryFree,
    },
    Stress {
        threads: 6,
        streams: 4,
        ops: 2000,
        max_live: 8,
        max_bytes: Some(4 << 20),
        policy: EventPolicy::OnSteal,
    },
    Stress {
        threads: 6,
        streams: 4,
        ops: 2000,
        max_live: 8,
        max_bytes: Some(2 << 20),
        policy: EventPolicy::EveryNthFree(NonZeroU32::new(8).expect("8 is not zero")),
    },
];

/// Runs the whole suite on `b`; `kind` is how out-of-memory messages name its memory.
pub fn run_all<B: Backend>(b: &Arc<B>, kind: &str) {
    same_stream_reuse_is_immediate(b.as_ref());
    handoff_waits_for_pending_work(b.as_ref());
    handoff_after_completion_needs_no_wait(b.as_ref());
    detached_stream_lends_its_blocks(b.as_ref());
    out_of_memory_is_reported_and_recovered(b.as_ref(), kind);
    threads_that_miss_together_grow_once(b);
    threads_that_miss_together_grow_once_stress(b, 20);
    for warm in [true, false] {
        kernels_on_many_streams_never_wait(b, warm);
    }
    for cfg in STRESS {
        stress(b, cfg);
    }
}
