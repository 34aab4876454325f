//! [`PoolResource`]: the stream-ordered pool itself: its state (the stream map, the chunk
//! table, the counters), the public calls (allocate, deallocate, detach, consolidate, stats),
//! a stream's own list found through the per-thread cache, the use of the threads' block
//! caches (`thread_cache.rs`) and the in-use accounting. The cross-stream hand-over is in
//! `pool/steal.rs`, the growth from the upstream in
//! `pool/grow.rs`, one stream's list in `stream_list.rs`; options and stats types live in
//! `options.rs` and `stats.rs`. See the module docs of [`crate::memory`] for the design, the
//! lock order and the event strategy.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::blocks::{ChunkId, ChunkTable, FreeBlock};
use super::local;
use super::options::{EventPolicy, PoolOptions};
use super::order::{StreamId, StreamOrder};
use super::stats::{PoolStats, StreamStats};
use super::stream_list::{bump, lock, ListState, StreamList};
use super::thread_cache::{CacheOwner, Cached, StreamCache, ThreadCache, MAX_BLOCK_BYTES};
use super::upstream::Upstream;
use crate::error::{Error, Result};

mod grow;
mod steal;

use grow::NoGrowth;

/// The `seq` of a free block that every stream may take without ordering: memory fresh from
/// the upstream, or the rest of a block whose stream's event had completed.
const SAFE_FOR_ALL: u64 = 0;

/// A stream's allocations and frees are added to the pool-wide in-use total (and the peak
/// checked) once they amount to this many bytes, so the fast path writes no shared counter.
const STATS_SLACK_BYTES: isize = 1 << 20;

/// What a thread keeps for one pool (see `local.rs`).
type Loc<S> = local::Local<StreamList<S>, CacheOwner<S>>;

/// Source of the pools' unique numbers (the key of the per-thread caches).
static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// What [`PoolResource::cached_deallocate`] did.
enum Freed<S: StreamOrder> {
    /// The block went to this thread's cache (or was refused as a double free).
    Cached(Result<()>),
    /// It goes to the list: its chunk (if this thread's snapshot knows it) and the stream's
    /// list if this thread has it at hand.
    ToList(Option<ChunkId>, Option<Arc<StreamList<S>>>),
}

/// A stream's blocks and counters in threads' caches, summed for [`PoolResource::stats`].
#[derive(Clone, Copy, Default)]
struct CachedStats {
    blocks: usize,
    bytes: usize,
    largest: usize,
    allocations: u64,
    frees: u64,
}

/// A block handed out by [`PoolResource::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    addr: usize,
    size: usize,
}

impl Block {
    /// Address of the first byte (a device address for device memory).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Usable bytes: the request rounded up to the pool's alignment.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The address as a pointer, for memory the host can address (pinned or host upstreams).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

/// Reads a lock whose holder panicked as well (see [`lock`]).
fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes a lock whose holder panicked as well (see [`lock`]).
fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// A stream-ordered pool of memory from an upstream `U`, ordered across streams by `S`.
///
/// Blocks are allocated and freed *on a stream*: a block freed on stream S may be handed out
/// on S at once (work on S runs in order), and on another stream T only once T has been
/// ordered after S's work, by a device-side wait on an event of S (or at once if that event
/// has completed). The caller promises that all work using a block is enqueued on the stream
/// it frees the block on, before the free.
///
/// Every method takes `&self` and may be called from any number of threads at once; see the
/// module docs for how the locking is split.
///
/// Dropping the pool returns all its memory to the upstream, blocks still allocated
/// included.
pub struct PoolResource<U: Upstream, S: StreamOrder> {
    /// This pool's key in the per-thread caches.
    uid: u64,
    upstream: U,
    order: S,
    options: PoolOptions,
    /// Lock 1 (read-mostly). Written only to add or remove a stream.
    streams: RwLock<HashMap<StreamId, Arc<StreamList<S>>>>,
    /// Lock 4. Written only when the pool grows; read only to refresh a thread's snapshot.
    chunks: RwLock<Arc<ChunkTable>>,
    /// Bumped after each change to `chunks`.
    chunk_gen: AtomicU64,
    next_chunk: AtomicU64,
    /// Lock 0: held by one grower at a time, across the upstream call, so that threads that
    /// miss at the same moment do not each take a chunk. Only growers wait on it.
    grow_lock: Mutex<()>,
    /// Bumped, under the grow lock, once a grown chunk's rest is in the fresh list: a thread
    /// that sees it unchanged since before it looked at the free lists knows that every
    /// chunk grown so far was there to be found.
    grown: AtomicU64,
    /// Bytes taken from (or being asked of) the upstream.
    pool_bytes: AtomicUsize,
    /// The sum of the streams' flushed in-use bytes (see [`STATS_SLACK_BYTES`]).
    in_use_flushed: AtomicIsize,
    /// In-use bytes of lists that were pruned.
    in_use_retired: AtomicIsize,
    /// The highest `in_use_flushed` (or exact in-use total) seen.
    peak: AtomicUsize,
    /// Whether threads cache the blocks they free (see `thread_cache.rs`).
    caching: bool,
    /// Every thread's block cache for this pool, so that the pool can drain and count them.
    /// Taken alone (never while holding another of the pool's locks).
    caches: Mutex<Vec<Arc<ThreadCache<S>>>>,
}

impl<U: Upstream, S: StreamOrder> fmt::Debug for PoolResource<U, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolResource")
            .field("memory", &self.upstream.kind())
            .field("options", &self.options)
            .field("pool_bytes", &self.pool_bytes.load(Ordering::Relaxed))
            .field("in_use_bytes", &self.in_use_bytes())
            .finish_non_exhaustive()
    }
}

impl<U: Upstream, S: StreamOrder> PoolResource<U, S> {
    /// A pool over `upstream`, ordering streams with `order`. Takes `initial_bytes` from the
    /// upstream at once.
    pub fn new(upstream: U, order: S, options: PoolOptions) -> Result<Self> {
        options.validate()?;
        let mut options = options;
        let align = options.alignment;
        options.grow_bytes = round_up(options.grow_bytes, align).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "pool options: grow_bytes {} overflows when aligned",
                options.grow_bytes
            ))
        })?;
        let caching = options.thread_cache && options.event_policy == EventPolicy::OnSteal;
        let pool = PoolResource {
            uid: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            upstream,
            order,
            options,
            streams: RwLock::new(HashMap::new()),
            chunks: RwLock::new(Arc::new(ChunkTable::default())),
            chunk_gen: AtomicU64::new(1),
            next_chunk: AtomicU64::new(1),
            grow_lock: Mutex::new(()),
            grown: AtomicU64::new(0),
            pool_bytes: AtomicUsize::new(0),
            in_use_flushed: AtomicIsize::new(0),
            in_use_retired: AtomicIsize::new(0),
            peak: AtomicUsize::new(0),
            caching,
            caches: Mutex::new(Vec::new()),
        };
        if pool.options.initial_bytes > 0 {
            let bytes = round_up(pool.options.initial_bytes, align).ok_or_else(|| {
                Error::InvalidArgument("pool options: initial_bytes overflows".to_string())
            })?;
            let chunk = match pool.grow_exactly(bytes) {
                Ok(chunk) => chunk,
                Err(NoGrowth::Upstream(e)) => return Err(e),
                Err(NoGrowth::Limit) => {
                    return Err(Error::InvalidArgument(
                        "pool options: initial_bytes is above max_bytes once aligned".to_string(),
                    ))
                }
            };
            // Fresh memory: no stream has used it, so every stream may take it at once.
            let list = StreamList::new(StreamId::FRESH, None);
            list.lock()
                .free
                .insert(FreeBlock {
                    addr: chunk.addr,
                    size: chunk.size,
                    chunk: chunk.id,
                    seq: SAFE_FOR_ALL,
                })
                .map_err(|_| Error::InvalidArgument("empty pool overlaps".to_string()))?;
            write(&pool.streams).insert(StreamId::FRESH, Arc::new(list));
        }
        Ok(pool)
    }

    /// The options the pool was made with (`grow_bytes` rounded to the alignment).
    pub fn options(&self) -> &PoolOptions {
        &self.options
    }

    /// The stream/event model.
    pub fn order(&self) -> &S {
        &self.order
    }

    /// The upstream.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    fn align(&self) -> usize {
        self.options.alignment
    }

    /// Allocates at least `size` bytes for use on `stream`.
    ///
    /// In order, until one works: a block of exactly this size that this thread freed on
    /// `stream` (its thread cache); the best fit in `stream`'s own free list; one block taken
    /// from another stream's list (ordering `stream` after that stream's event); a new
    /// upstream chunk; every other stream's free blocks gathered into `stream`'s list and
    /// coalesced. Otherwise [`Error::OutOfMemory`], with the pool's state in the message.
    pub fn allocate(&self, size: usize, stream: &S::Stream) -> Result<Block> {
        let id = self.order.stream_id(stream);
        let Some(bytes) = self.rounded(size) else {
            return Err(self.out_of_memory(size, id, "the size overflows when aligned"));
        };
        if let Some(addr) = self.cached_allocate(id, bytes) {
            return Ok(Block { addr, size: bytes });
        }
        // A growth published after this point is one this call might use instead of growing
        // too; one published before it is in the fresh list for `steal` to find.
        let mut gen_seen = self.grown.load(Ordering::Acquire);
        let mut first = true;
        let (own, why) = loop {
            let (own, hit) = self.with_own_list(id, stream, None, |_, st| {
                let b = st.free.carve_best_fit(bytes)?;
                self.handed_out(st, bytes);
                Some(b.addr)
            })?;
            if first {
                first = false;
                self.cache_stream(&own);
            }
            if let Some(addr) = hit {
                return Ok(Block { addr, size: bytes });
            }
            // This thread's blocks cached for other streams are worth taking before growing.
            self.retire_own_cache(|s| s != id);
            if let Some(b) = self.steal(&own, stream, bytes, false)? {
                bump(&own.counters.steals);
                return Ok(self.place(&own, b, bytes));
            }
            // Before this stream waits on another's work for a block: memory grown since this
            // call began is in the fresh list, which the lists it looked at may have missed.
            let gen_now = self.grown.load(Ordering::Acquire);
            if gen_now != gen_seen {
                gen_seen = gen_now;
                continue;
            }
            if let Some(b) = self.steal(&own, stream, bytes, true)? {
                bump(&own.counters.steals);
                return Ok(self.place(&own, b, bytes));
            }
            let grow_guard = lock(&self.grow_lock);
            let gen_now = self.grown.load(Ordering::Acquire);
            if gen_now != gen_seen {
                // Another thread grew the pool while this one looked: look again.
                gen_seen = gen_now;
                drop(grow_guard);
                continue;
            }
            match self.grow(bytes) {
                Ok(chunk) => {
                    let b = FreeBlock {
                        addr: chunk.addr,
                        size: chunk.size,
                        chunk: chunk.id,
                        seq: SAFE_FOR_ALL,
                    };
                    // The rest goes to the fresh list *before* the grow lock is let go and
                    // `grown` bumped: a thread that waited on the lock finds it there.
                    let block = self.place_grown(&own, b, bytes)?;
                    self.grown.fetch_add(1, Ordering::Release);
                    drop(grow_guard);
                    return Ok(block);
                }
                Err(NoGrowth::Limit) => break (own, "the pool is at its limit".to_string()),
                Err(NoGrowth::Upstream(e)) => {
                    break (own, format!("the upstream refused to grow: {e}"))
                }
            }
        };
        self.gather(&own, stream)?;
        let (_, hit) = self.with_own_list(id, stream, None, |_, st| {
            let b = st.free.carve_best_fit(bytes)?;
            self.handed_out(st, bytes);
            Some(b.addr)
        })?;
        match hit {
            Some(addr) => Ok(Block { addr, size: bytes }),
            None => Err(self.out_of_memory(size, id, &why)),
        }
    }

    /// Returns a block to the pool, on `stream`: all work that uses it must already be
    /// enqueued on `stream`. `size` may be the size asked of [`allocate`](Self::allocate) or
    /// the block's [`size`](Block::size).
    ///
    /// A pointer that is not in the pool, or a block that overlaps one already free in the
    /// stream's list or in this thread's cache for the stream (a double free), is refused
    /// with [`Error::InvalidArgument`]. Other misuse (a wrong size, a double free across
    /// streams or threads, a double free of a block the cache has since passed to the list)
    /// is not detected and corrupts the pool's accounting, though never memory the pool
    /// itself reads.
    pub fn deallocate(&self, addr: usize, size: usize, stream: &S::Stream) -> Result<()> {
        let id = self.order.stream_id(stream);
        let bytes = self.rounded(size).filter(|_| addr % self.align() == 0);
        let (chunk, cached) = match bytes {
            Some(bytes) => match self.cached_deallocate(addr, bytes, size, id) {
                Freed::Cached(done) => return done,
                Freed::ToList(chunk, list) => (chunk, list),
            },
            None => (None, None),
        };
        let (Some(bytes), Some(chunk)) = (bytes, chunk) else {
            return Err(Error::InvalidArgument(format!(
                "deallocate({addr:#x}, {size} bytes) on stream {id}: not a block of this pool"
            )));
        };
        let policy = self.options.event_policy;
        // Outer error: the block was not taken back. Inner error: it was, but the event
        // record that the policy asks for failed.
        let (own, result) = self.with_own_list(id, stream, cached, |list, st| {
            let seq = st.next_seq();
            let block = FreeBlock {
                addr,
                size: bytes,
                chunk,
                seq,
            };
            if let Err(o) = st.free.insert(block) {
                return Err(Error::InvalidArgument(format!(
                    "deallocate({addr:#x}, {size} bytes) on stream {id}: overlaps the free \
                     block [{:#x}, +{} bytes) (double free or wrong size)",
                    o.addr, o.size
                )));
            }
            st.frees += 1;
            self.account(st, -(bytes as isize));
            let record = match policy {
                EventPolicy::OnSteal => false,
                EventPolicy::EveryFree => true,
                EventPolicy::EveryNthFree(n) => st.frees % u64::from(n.get()) == 0,
            };
            Ok(if record {
                st.record(&self.order, list).map(|_| ())
            } else {
                Ok(())
            })
        })?;
        if result.is_ok() {
            self.cache_stream(&own);
        }
        result?
    }

    /// Stops using `stream`'s handle: records a last event on it that covers every block freed
    /// on it, after which those blocks go to other streams like any others. Call this before
    /// destroying a stream the pool has seen; using the stream again afterwards is allowed and
    /// attaches it again.
    pub fn detach_stream(&self, stream: &S::Stream) -> Result<()> {
        let id = self.order.stream_id(stream);
        local::with(self.uid, |l: &mut Loc<S>| l.forget_stream(id));
        // Every thread's cached blocks of the stream go to its list first, so that the last
        // record covers them too.
        self.retire_caches(|s| s == id);
        let Some(list) = read(&self.streams).get(&id).cloned() else {
            return Ok(());
        };
        let mut st = list.lock();
        if st.stream.is_some() {
            if st.free.newest_seq() > st.covered_seq {
                st.record(&self.order, &list)?;
            }
            st.stream = None;
        }
        drop(st);
        // A thread that used the stream while it was being detached may have cached again.
        self.retire_caches(|s| s == id);
        let empty = list.lock().free.is_empty();
        if empty {
            self.prune(&list);
        }
        Ok(())
    }

    /// Moves every thread's cached blocks and every other stream's free blocks into
    /// `stream`'s list (ordering `stream` after each of them) and coalesces them. The pool
    /// does this by itself before it reports out of memory; call it to defragment ahead of a
    /// large allocation.
    pub fn consolidate(&self, stream: &S::Stream) -> Result<()> {
        let id = self.order.stream_id(stream);
        let (own, ()) = self.with_own_list(id, stream, None, |_, _| ())?;
        self.gather(&own, stream)
    }

    /// Moves every thread's cached blocks back to their streams' lists (where other streams
    /// can take them). The pool does this by itself when a stream is detached, before it
    /// reports out of memory and when it consolidates; a thread's own cache also empties when
    /// the thread exits.
    pub fn flush_thread_caches(&self) {
        self.retire_caches(|_| true);
    }

    /// A snapshot of the pool's use.
    ///
    /// Blocks in threads' caches count as free (in `free_blocks` and `free_bytes`, and in
    /// `cached_blocks` and `cached_bytes`), on the stream they were freed on; allocations
    /// and frees served by a cache count as the stream's.
    pub fn stats(&self) -> PoolStats {
        let in_use_bytes = self.in_use_bytes();
        let mut cached: HashMap<StreamId, CachedStats> = HashMap::new();
        for c in self.caches() {
            for e in &c.lock().streams {
                let s = cached.entry(e.id).or_default();
                s.blocks += e.blocks().count();
                s.bytes += e.bytes;
                s.largest = s.largest.max(e.blocks().map(|b| b.size).max().unwrap_or(0));
                s.allocations += e.allocations;
                s.frees += e.frees;
            }
        }
        let lists: Vec<Arc<StreamList<S>>> = read(&self.streams).values().cloned().collect();
        let mut largest_free_block = 0;
        let mut streams: Vec<StreamStats> = lists
            .iter()
            .map(|list| {
                let st = list.lock();
                let c = &list.counters;
                let k = cached.get(&list.id).copied().unwrap_or_default();
                largest_free_block = largest_free_block.max(st.free.largest()).max(k.largest);
                StreamStats {
                    stream: list.id,
                    attached: st.stream.is_some(),
                    allocations: st.allocations + k.allocations,
                    frees: st.frees + k.frees,
                    steals: c.steals.load(Ordering::Relaxed),
                    stolen: c.stolen.load(Ordering::Relaxed),
                    waits: c.waits.load(Ordering::Relaxed),
                    records: c.records.load(Ordering::Relaxed),
                    free_blocks: st.free.len() + k.blocks,
                    free_bytes: st.free.bytes() + k.bytes,
                    cached_blocks: k.blocks,
                    cached_bytes: k.bytes,
                }
            })
            .collect();
        streams.sort_by_key(|s| s.stream);
        PoolStats {
            memory: self.upstream.kind(),
            alignment: self.align(),
            pool_bytes: self.pool_bytes.load(Ordering::Relaxed),
            in_use_bytes,
            peak_in_use_bytes: self.peak.load(Ordering::Relaxed),
            free_bytes: streams.iter().map(|s| s.free_bytes).sum(),
            cached_bytes: streams.iter().map(|s| s.cached_bytes).sum(),
            largest_free_block,
            chunks: read(&self.chunks).len(),
            max_bytes: self.options.max_bytes,
            streams,
        }
    }

    // ---- internals -------------------------------------------------------------------------

    fn rounded(&self, size: usize) -> Option<usize> {
        round_up(size.max(1), self.align())
    }

    /// Hands the last `bytes` of `b`, a block that came from another list or the upstream,
    /// out (like [`FreeBlocks::carve_best_fit`]) and puts the front in this list. Unless `b`
    /// was safe for every stream, the front is stamped as a new free here: after the device
    /// wait it is safe for this stream.
    fn split(st: &mut ListState<S>, b: FreeBlock, bytes: usize) -> usize {
        let rest = b.size - bytes;
        if rest > 0 {
            let seq = if b.seq == SAFE_FOR_ALL {
                SAFE_FOR_ALL
            } else {
                st.next_seq()
            };
            let front = FreeBlock {
                size: rest,
                seq,
                ..b
            };
            // The front lies inside a block that was just free in a list of this pool (or a
            // new chunk), and no two lists hold overlapping blocks, so this cannot collide; if
            // it ever did, losing it (a leak) is the safe outcome.
            let inserted = st.free.insert(front);
            debug_assert!(inserted.is_ok(), "split remainder overlaps: {inserted:?}");
        }
        b.addr + rest
    }

    /// Hands out `bytes` of `b`, which came from another list or the upstream, keeping the
    /// rest in `own`.
    fn place(&self, own: &StreamList<S>, b: FreeBlock, bytes: usize) -> Block {
        let mut st = own.lock();
        self.handed_out(&mut st, bytes);
        let addr = Self::split(&mut st, b, bytes);
        Block { addr, size: bytes }
    }

    /// Counts an allocation of `bytes` on the list `st`.
    fn handed_out(&self, st: &mut ListState<S>, bytes: usize) {
        st.allocations += 1;
        self.account(st, bytes as isize);
    }

    /// Adds `delta` in-use bytes to the list `st`, and to the pool-wide total once the
    /// list's unflushed change reaches [`STATS_SLACK_BYTES`] either way.
    fn account(&self, st: &mut ListState<S>, delta: isize) {
        st.in_use += delta;
        st.unflushed += delta;
        if st.unflushed.abs() >= STATS_SLACK_BYTES {
            self.flush(st);
        }
    }

    fn flush(&self, st: &mut ListState<S>) {
        self.publish(std::mem::take(&mut st.unflushed));
    }

    /// Adds `delta` to the pool-wide in-use total and checks the peak.
    fn publish(&self, delta: isize) {
        let now = self.in_use_flushed.fetch_add(delta, Ordering::Relaxed) + delta;
        if delta > 0 {
            self.peak.fetch_max(now.max(0) as usize, Ordering::Relaxed);
        }
    }

    /// Bytes in use now: exact when no call is under way, as it sums every list and every
    /// thread cache.
    fn in_use_bytes(&self) -> usize {
        let cached: isize = self
            .caches()
            .iter()
            .map(|c| c.lock().streams.iter().map(|e| e.in_use).sum::<isize>())
            .sum();
        let lists: Vec<_> = read(&self.streams).values().cloned().collect();
        let total = lists.iter().map(|l| l.lock().in_use).sum::<isize>()
            + cached
            + self.in_use_retired.load(Ordering::Relaxed);
        let total = total.max(0) as usize;
        self.peak.fetch_max(total, Ordering::Relaxed);
        total
    }

    /// Adds `delta` in-use bytes to a thread cache's entry, and to the pool-wide total once
    /// its unflushed change reaches [`STATS_SLACK_BYTES`] (as [`account`](Self::account)).
    fn account_cached(&self, e: &mut StreamCache<S>, delta: isize) {
        e.in_use += delta;
        e.unflushed += delta;
        if e.unflushed.abs() >= STATS_SLACK_BYTES {
            self.publish(std::mem::take(&mut e.unflushed));
        }
    }

    /// A block of exactly `bytes` that this thread freed on stream `id`, from its cache.
    fn cached_allocate(&self, id: StreamId, bytes: usize) -> Option<usize> {
        if !self.caching || bytes > MAX_BLOCK_BYTES {
            return None;
        }
        local::with(self.uid, |l: &mut Loc<S>| {
            let mut cache = l.cache.as_ref()?.0.lock();
            let e = cache.stream(id)?;
            let addr = e.take(bytes)?;
            self.account_cached(e, bytes as isize);
            Some(addr)
        })
        .flatten()
    }

    /// Frees `[addr, addr + bytes)` into this thread's cache for stream `id` if it has one;
    /// else finds what the list path needs (the block's chunk and, if this thread has it
    /// cached, the stream's list) in the same visit to the thread's state.
    fn cached_deallocate(&self, addr: usize, bytes: usize, size: usize, id: StreamId) -> Freed<S> {
        let gen = self.chunk_gen.load(Ordering::Acquire);
        let cacheable = self.caching && bytes <= MAX_BLOCK_BYTES;
        let local = local::with(self.uid, |l: &mut Loc<S>| {
            let chunk = l
                .chunks(gen, || Arc::clone(&read(&self.chunks)))
                .find(addr, bytes)
                .map(|c| c.id);
            if let (Some(chunk), Some(owner), true) = (chunk, &l.cache, cacheable) {
                let mut cache = owner.0.lock();
                if let Some(e) = cache.stream(id) {
                    let put = e.put(Cached {
                        addr,
                        size: bytes,
                        chunk,
                    });
                    if put.is_err() {
                        return Freed::Cached(Err(Error::InvalidArgument(format!(
                            "deallocate({addr:#x}, {size} bytes) on stream {id}: already free \
                             in this thread's cache (double free)"
                        ))));
                    }
                    self.account_cached(e, -(bytes as isize));
                    return Freed::Cached(Ok(()));
                }
            }
            Freed::ToList(chunk, l.stream(id))
        });
        match local {
            Some(Freed::ToList(Some(chunk), list)) => Freed::ToList(Some(chunk), list),
            Some(Freed::Cached(done)) => Freed::Cached(done),
            // Not in the snapshot, or no state on this thread: ask the table itself.
            other => {
                let list = match other {
                    Some(Freed::ToList(_, list)) => list,
                    _ => None,
                };
                Freed::ToList(read(&self.chunks).find(addr, bytes).map(|c| c.id), list)
            }
        }
    }

    /// Makes this thread cache the blocks it frees on `own`'s stream from now on (a no-op if
    /// it does already).
    fn cache_stream(&self, own: &Arc<StreamList<S>>) {
        if !self.caching {
            return;
        }
        local::with(self.uid, |l: &mut Loc<S>| {
            let owner = l
                .cache
                .get_or_insert_with(|| CacheOwner(self.register_cache()));
            owner.0.lock().add_stream(own);
        });
    }

    /// A new thread cache, registered with the pool.
    fn register_cache(&self) -> Arc<ThreadCache<S>> {
        let cache = Arc::new(ThreadCache::new());
        let mut all = lock(&self.caches);
        all.retain(|c| !c.is_orphan());
        all.push(Arc::clone(&cache));
        cache
    }

    /// Every registered thread cache (a snapshot: the registry's lock is let go at once).
    fn caches(&self) -> Vec<Arc<ThreadCache<S>>> {
        if !self.caching {
            return Vec::new();
        }
        lock(&self.caches).clone()
    }

    /// Moves the blocks of every thread's cache entries for the streams `which` accepts to
    /// their lists.
    fn retire_caches(&self, which: impl Fn(StreamId) -> bool + Copy) {
        for c in self.caches() {
            c.lock().retire(which);
        }
    }

    /// Moves the blocks of this thread's cache entries for the streams `which` accepts to
    /// their lists.
    fn retire_own_cache(&self, which: impl Fn(StreamId) -> bool) {
        if !self.caching {
            return;
        }
        local::with(self.uid, |l: &mut Loc<S>| {
            if let Some(owner) = &l.cache {
                owner.0.lock().retire(which);
            }
        });
    }

    /// Runs `f` under the lock of `stream`'s own list, finding the list through this thread's
    /// cache (no shared lock) or else the stream map, and re-attaching a detached stream.
    fn with_own_list<R>(
        &self,
        id: StreamId,
        stream: &S::Stream,
        mut cached: Option<Arc<StreamList<S>>>,
        mut f: impl FnMut(&StreamList<S>, &mut ListState<S>) -> R,
    ) -> Result<(Arc<StreamList<S>>, R)> {
        loop {
            let list = match cached.take() {
                Some(list) => list,
                None => self.list_of(id, stream)?,
            };
            let mut st = list.lock();
            if st.removed {
                drop(st);
                local::with(self.uid, |l: &mut Loc<S>| l.forget_stream(id));
                continue;
            }
            if st.stream.is_none() {
                st.stream = Some(stream.clone());
            }
            let r = f(&list, &mut st);
            drop(st);
            return Ok((list, r));
        }
    }

    fn list_of(&self, id: StreamId, stream: &S::Stream) -> Result<Arc<StreamList<S>>> {
        if let Some(Some(list)) = local::with(self.uid, |l: &mut Loc<S>| l.stream(id)) {
            return Ok(list);
        }
        let found = read(&self.streams).get(&id).cloned();
        let list = match found {
            Some(list) => list,
            None => self.add_list(id, stream)?,
        };
        local::with(self.uid, |l: &mut Loc<S>| l.remember_stream(id, &list));
        Ok(list)
    }

    /// Adds a list for a stream the pool has not seen (or whose list was pruned).
    fn add_list(&self, id: StreamId, stream: &S::Stream) -> Result<Arc<StreamList<S>>> {
        let mut map = write(&self.streams);
        if let Some(list) = map.get(&id) {
            return Ok(Arc::clone(list));
        }
        let list = Arc::new(StreamList::new(id, Some(stream.clone())));
        map.insert(id, Arc::clone(&list));
        Ok(list)
    }

    fn out_of_memory(&self, size: usize, stream: StreamId, why: &str) -> Error {
        let largest = read(&self.streams)
            .values()
            .map(|l| l.lock().free.largest())
            .max()
            .unwrap_or(0);
        let limit = match self.options.max_bytes {
            Some(max) => format!("{max} bytes"),
            None => "none".to_string(),
        };
        Error::OutOfMemory(format!(
            "cannot allocate {size} bytes (alignment {}) on stream {stream} from the {} pool: \
             pool size {} bytes, {} bytes in use, largest free block {largest} bytes, \
             limit {limit}; {why}",
            self.align(),
            self.upstream.kind(),
            self.pool_bytes.load(Ordering::Relaxed),
            self.in_use_bytes(),
        ))
    }
}

#[cfg(test)]
impl<U: Upstream, S: StreamOrder> PoolResource<U, S> {
    /// Every free block of every list, with its stream, in address order.
    pub(crate) fn free_blocks(&self) -> Vec<(StreamId, FreeBlock)> {
        let lists: Vec<_> = read(&self.streams).values().cloned().collect();
        let mut all: Vec<_> = lists
            .iter()
            .flat_map(|l| {
                let st = l.lock();
                st.free.iter().map(|b| (l.id, b)).collect::<Vec<_>>()
            })
            .collect();
        all.sort_by_key(|(_, b)| b.addr);
        all
    }

    /// Every block in a thread's cache, with its stream, in address order.
    pub(crate) fn cached_blocks(&self) -> Vec<(StreamId, FreeBlock)> {
        let mut all: Vec<_> = self
            .caches()
            .iter()
            .flat_map(|c| {
                let st = c.lock();
                st.streams
                    .iter()
                    .flat_map(|e| {
                        e.blocks().map(|b| {
                            let block = FreeBlock {
                                addr: b.addr,
                                size: b.size,
                                chunk: b.chunk,
                                seq: 0,
                            };
                            (e.id, block)
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by_key(|(_, b)| b.addr);
        all
    }

    /// Every chunk, in address order.
    pub(crate) fn chunk_list(&self) -> Vec<super::blocks::Chunk> {
        read(&self.chunks).iter().copied().collect()
    }
}

impl<U: Upstream, S: StreamOrder> Drop for PoolResource<U, S> {
    fn drop(&mut self) {
        // Threads' block caches first: marked dead, they never touch a list again.
        for c in self
            .caches
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            c.lock().kill();
        }
        // Free lists (and their events) go next; nothing else holds them now: threads' caches
        // hold only weak references.
        self.streams
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let table = Arc::clone(
            self.chunks
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for chunk in table.iter() {
            // SAFETY: each chunk came from `self.upstream.allocate(chunk.size, alignment)`, is
            // in the table once, and is returned once, here; the pool is going away, so
            // nothing in it uses the memory any more.
            let _ = unsafe {
                self.upstream
                    .deallocate(chunk.addr, chunk.size, self.options.alignment)
            };
        }
    }
}

/// `n` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
fn round_up(n: usize, align: usize) -> Option<usize> {
    Some(n.checked_add(align - 1)? & !(align - 1))
}
