//! [`PoolResource`]: the stream-ordered pool itself. See the module docs of
//! [`crate::memory`] for the design, the lock order and the event strategy.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

use super::blocks::{Chunk, ChunkId, ChunkTable, FreeBlock, FreeBlocks};
use super::local;
use super::order::{StreamId, StreamOrder};
use super::upstream::{MemoryKind, Upstream};
use crate::error::{Error, Result};

/// How many best-fit candidates a steal looks at for one that is already safe to hand over.
const SAFE_FIT_PROBES: usize = 16;

/// The `seq` of a free block that every stream may take without ordering: memory fresh from
/// the upstream, or the rest of a block whose stream's event had completed.
const SAFE_FOR_ALL: u64 = 0;

/// A stream's allocations and frees are added to the pool-wide in-use total (and the peak
/// checked) once they amount to this many bytes, so the fast path writes no shared counter.
const STATS_SLACK_BYTES: isize = 1 << 20;

/// Source of the pools' unique numbers (the key of the per-thread caches).
static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// When the pool records the per-stream event that lets other streams reuse a freed block.
///
/// See "Events" in the [module docs](crate::memory) for the measurements behind the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum EventPolicy {
    /// Record only when another stream is about to take one of the stream's blocks and the
    /// last record does not cover it yet. Frees make no driver call at all.
    #[default]
    OnSteal,
    /// Record after every free (what RMM's pool does): steals find blocks already covered,
    /// at the price of one `cuEventRecord` per free.
    EveryFree,
    /// Record after every n-th free on a stream; blocks freed since are recorded on steal.
    EveryNthFree(NonZeroU32),
}

/// How a [`PoolResource`] is sized and aligned. Build with [`PoolOptions::default`] and the
/// setters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    alignment: usize,
    initial_bytes: usize,
    grow_bytes: usize,
    max_bytes: Option<usize>,
    event_policy: EventPolicy,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            alignment: PoolOptions::DEFAULT_ALIGNMENT,
            initial_bytes: 0,
            grow_bytes: PoolOptions::DEFAULT_GROW_BYTES,
            max_bytes: None,
            event_policy: EventPolicy::default(),
        }
    }
}

impl PoolOptions {
    /// Default alignment of every block: 256 bytes, what `cuMemAlloc` guarantees and what
    /// vectorized device loads want.
    pub const DEFAULT_ALIGNMENT: usize = 256;
    /// Default size of each upstream allocation when the pool grows: 32 MiB, so a pool makes
    /// few upstream calls (each `cuMemAlloc` may synchronize the device) without holding much
    /// more than it needs.
    pub const DEFAULT_GROW_BYTES: usize = 32 << 20;

    /// Every block's address and size are multiples of `bytes` (a power of two).
    pub fn alignment(mut self, bytes: usize) -> Self {
        self.alignment = bytes;
        self
    }

    /// Bytes taken from the upstream when the pool is created (default 0).
    pub fn initial_bytes(mut self, bytes: usize) -> Self {
        self.initial_bytes = bytes;
        self
    }

    /// Smallest upstream allocation when the pool grows (a larger request gets its own size).
    pub fn grow_bytes(mut self, bytes: usize) -> Self {
        self.grow_bytes = bytes;
        self
    }

    /// Most bytes the pool may take from its upstream in all (`None`: no limit).
    pub fn max_bytes(mut self, bytes: Option<usize>) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// When to record the events that order cross-stream reuse.
    pub fn event_policy(mut self, policy: EventPolicy) -> Self {
        self.event_policy = policy;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("pool options: {what}")));
        if !self.alignment.is_power_of_two() {
            return bad(format!(
                "alignment {} is not a power of two",
                self.alignment
            ));
        }
        if self.grow_bytes == 0 {
            return bad("grow_bytes is 0".to_string());
        }
        if let Some(max) = self.max_bytes {
            if self.initial_bytes > max {
                return bad(format!(
                    "initial_bytes {} is above max_bytes {max}",
                    self.initial_bytes
                ));
            }
        }
        Ok(())
    }
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

/// Counters of one stream's use of the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// The stream.
    pub stream: StreamId,
    /// Whether the pool still holds the stream's handle (false after
    /// [`detach_stream`](PoolResource::detach_stream), and for memory no stream used yet).
    pub attached: bool,
    /// Blocks allocated on the stream.
    pub allocations: u64,
    /// Blocks freed on the stream.
    pub frees: u64,
    /// Blocks the stream took from other streams' free lists.
    pub steals: u64,
    /// Blocks other streams took from this stream's free list.
    pub stolen: u64,
    /// Device-side waits enqueued on this stream to order it after another stream.
    pub waits: u64,
    /// Events recorded on this stream.
    pub records: u64,
    /// Free blocks now in the stream's list.
    pub free_blocks: usize,
    /// Free bytes now in the stream's list.
    pub free_bytes: usize,
}

/// A snapshot of a pool's use. Counters of different streams are read one after the other, so
/// under concurrent use the totals are approximate.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// The upstream's kind of memory.
    pub memory: MemoryKind,
    /// Alignment of every block.
    pub alignment: usize,
    /// Bytes taken from the upstream.
    pub pool_bytes: usize,
    /// Bytes handed out and not yet freed (the sum over streams, exact when no call is under
    /// way).
    pub in_use_bytes: usize,
    /// The most `in_use_bytes` has been, within 1 MiB per stream: streams add their changes
    /// to the pool-wide total only once they reach 1 MiB, so that the fast path writes no
    /// shared counter (see the [module docs](crate::memory)).
    pub peak_in_use_bytes: usize,
    /// Bytes in free lists.
    pub free_bytes: usize,
    /// The largest free block.
    pub largest_free_block: usize,
    /// Upstream allocations held.
    pub chunks: usize,
    /// The limit on `pool_bytes`, if any.
    pub max_bytes: Option<usize>,
    /// One entry per stream the pool knows, by id.
    pub streams: Vec<StreamStats>,
}

#[derive(Debug, Default)]
struct Counters {
    steals: AtomicU64,
    stolen: AtomicU64,
    waits: AtomicU64,
    records: AtomicU64,
}

fn bump(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed) + 1
}

/// The mutable part of a stream's free list, under its lock.
struct ListState<S: StreamOrder> {
    /// The handle events are recorded on; `None` once detached (and for fresh memory).
    stream: Option<S::Stream>,
    /// Set (under the map's write lock) when the list was taken out of the map; a thread that
    /// still finds it in its cache must look again.
    removed: bool,
    free: FreeBlocks,
    /// Blocks handed out on this stream.
    allocations: u64,
    /// Blocks freed on this stream.
    frees: u64,
    /// Bytes handed out on this stream minus bytes freed on it (negative when blocks are
    /// freed on another stream than the one they were allocated on).
    in_use: isize,
    /// The part of `in_use` not yet added to the pool-wide total.
    unflushed: isize,
    /// Stamps frees (and blocks arriving from other lists); a block's `seq` is the value
    /// after the stamp.
    free_seq: u64,
    /// The event's latest record covers every block with `seq <= covered_seq`.
    covered_seq: u64,
    /// Whether that record has been seen complete (then no wait is needed at all).
    covered_done: bool,
}

impl<S: StreamOrder> ListState<S> {
    /// An empty list for `stream` (`None`: memory no stream has used).
    fn new(stream: Option<S::Stream>) -> Self {
        ListState {
            stream,
            removed: false,
            free: FreeBlocks::default(),
            allocations: 0,
            frees: 0,
            in_use: 0,
            unflushed: 0,
            free_seq: 0,
            covered_seq: 0,
            covered_done: true,
        }
    }

    /// Stamps a new free.
    fn next_seq(&mut self) -> u64 {
        self.free_seq += 1;
        self.free_seq
    }

    /// Records the list's event on its stream now, covering every block in the list.
    fn record(&mut self, order: &S, list: &StreamList<S>) -> Result<bool> {
        let Some(stream) = &self.stream else {
            // Detached: the record made at detach already covers every block.
            return Ok(false);
        };
        order.record(list.event(order)?, stream)?;
        self.covered_seq = self.free_seq;
        self.covered_done = false;
        bump(&list.counters.records);
        Ok(true)
    }

    /// Whether the latest record has completed, asking the driver if not yet known.
    fn covered_complete(&mut self, order: &S, list: &StreamList<S>) -> Result<bool> {
        if !self.covered_done && order.is_complete(list.event(order)?)? {
            self.covered_done = true;
        }
        Ok(self.covered_done)
    }
}

/// One stream's free list. Aligned to 128 bytes (two cache lines, the prefetch pair), so that
/// the lists of streams used by different threads never share a cache line.
#[repr(align(128))]
pub(crate) struct StreamList<S: StreamOrder> {
    id: StreamId,
    /// Made at the list's first record (most streams are never stolen from, so most lists
    /// never need one: a stream's first allocation makes no driver call), recorded again and
    /// again, dropped with the list.
    event: OnceLock<S::Event>,
    counters: Counters,
    state: Mutex<ListState<S>>,
}

impl<S: StreamOrder> StreamList<S> {
    /// An empty list; `stream` is `None` for fresh memory.
    fn new(id: StreamId, stream: Option<S::Stream>) -> StreamList<S> {
        StreamList {
            id,
            event: OnceLock::new(),
            counters: Counters::default(),
            state: Mutex::new(ListState::new(stream)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ListState<S>> {
        lock(&self.state)
    }

    /// The list's event, made on first use. Called with the list's lock held, so only one
    /// thread makes it.
    fn event(&self, order: &S) -> Result<&S::Event> {
        if let Some(e) = self.event.get() {
            return Ok(e);
        }
        let made = order.create_event()?;
        Ok(self.event.get_or_init(|| made))
    }
}

/// Takes a lock whose holder panicked as well: every critical section of the pool leaves the
/// free lists consistent between statements, so a panic (a bug) loses no more than its block.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// Why the pool could not grow.
enum NoGrowth {
    Limit,
    Upstream(Error),
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
    /// Lock 3. Written only when the pool grows; read only to refresh a thread's snapshot.
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
    /// In order, until one works: the best fit in `stream`'s own free list; one block taken
    /// from another stream's list (ordering `stream` after that stream's event); a new
    /// upstream chunk; every other stream's free blocks gathered into `stream`'s list and
    /// coalesced. Otherwise [`Error::OutOfMemory`], with the pool's state in the message.
    pub fn allocate(&self, size: usize, stream: &S::Stream) -> Result<Block> {
        let id = self.order.stream_id(stream);
        let Some(bytes) = self.rounded(size) else {
            return Err(self.out_of_memory(size, id, "the size overflows when aligned"));
        };
        // A growth published after this point is one this call might use instead of growing
        // too; one published before it is in the fresh list for `steal` to find.
        let mut gen_seen = self.grown.load(Ordering::Acquire);
        let (own, why) = loop {
            let (own, hit) = self.with_own_list(id, stream, None, |_, st| {
                let b = st.free.carve_best_fit(bytes)?;
                self.handed_out(st, bytes);
                Some(b.addr)
            })?;
            if let Some(addr) = hit {
                return Ok(Block { addr, size: bytes });
            }
            if let Some(b) = self.steal(&own, stream, bytes)? {
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
    /// stream's list (a double free), is refused with [`Error::InvalidArgument`]. Other misuse
    /// (a wrong size, a double free across streams) is not detected and corrupts the pool's
    /// accounting, though never memory the pool itself reads.
    pub fn deallocate(&self, addr: usize, size: usize, stream: &S::Stream) -> Result<()> {
        let id = self.order.stream_id(stream);
        let bytes = self.rounded(size).filter(|_| addr % self.align() == 0);
        let (chunk, cached) = match bytes {
            Some(bytes) => self.chunk_and_list(addr, bytes, id),
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
        let (_, result) = self.with_own_list(id, stream, cached, |list, st| {
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
        result?
    }

    /// Stops using `stream`'s handle: records a last event on it that covers every block freed
    /// on it, after which those blocks go to other streams like any others. Call this before
    /// destroying a stream the pool has seen; using the stream again afterwards is allowed and
    /// attaches it again.
    pub fn detach_stream(&self, stream: &S::Stream) -> Result<()> {
        let id = self.order.stream_id(stream);
        local::with(self.uid, |l: &mut local::Local<StreamList<S>>| {
            l.forget_stream(id)
        });
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
        let empty = st.free.is_empty();
        drop(st);
        if empty {
            self.prune(&list);
        }
        Ok(())
    }

    /// Moves every other stream's free blocks into `stream`'s list (ordering `stream` after
    /// each of them) and coalesces them. The pool does this by itself before it reports out
    /// of memory; call it to defragment ahead of a large allocation.
    pub fn consolidate(&self, stream: &S::Stream) -> Result<()> {
        let id = self.order.stream_id(stream);
        let (own, ()) = self.with_own_list(id, stream, None, |_, _| ())?;
        self.gather(&own, stream)
    }

    /// A snapshot of the pool's use.
    pub fn stats(&self) -> PoolStats {
        let in_use_bytes = self.in_use_bytes();
        let lists: Vec<Arc<StreamList<S>>> = read(&self.streams).values().cloned().collect();
        let mut streams: Vec<StreamStats> = lists
            .iter()
            .map(|list| {
                let st = list.lock();
                let c = &list.counters;
                StreamStats {
                    stream: list.id,
                    attached: st.stream.is_some(),
                    allocations: st.allocations,
                    frees: st.frees,
                    steals: c.steals.load(Ordering::Relaxed),
                    stolen: c.stolen.load(Ordering::Relaxed),
                    waits: c.waits.load(Ordering::Relaxed),
                    records: c.records.load(Ordering::Relaxed),
                    free_blocks: st.free.len(),
                    free_bytes: st.free.bytes(),
                }
            })
            .collect();
        streams.sort_by_key(|s| s.stream);
        let largest_free_block = lists
            .iter()
            .map(|l| l.lock().free.largest())
            .max()
            .unwrap_or(0);
        PoolStats {
            memory: self.upstream.kind(),
            alignment: self.align(),
            pool_bytes: self.pool_bytes.load(Ordering::Relaxed),
            in_use_bytes,
            peak_in_use_bytes: self.peak.load(Ordering::Relaxed),
            free_bytes: streams.iter().map(|s| s.free_bytes).sum(),
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

    /// Hands out the last `bytes` of `b`, a chunk just grown, on `own` and puts the rest in
    /// the fresh list, where every stream takes from it without ordering. Kept out of the
    /// grower's own list so that the grower's frees never merge into it: a merged block would
    /// carry the grower's `seq`, and the next stream to take from it would have to wait on
    /// the device for the grower's work.
    fn place_grown(&self, own: &StreamList<S>, b: FreeBlock, bytes: usize) -> Result<Block> {
        let rest = b.size - bytes;
        if rest > 0 {
            self.add_fresh(FreeBlock { size: rest, ..b })?;
        }
        let mut st = own.lock();
        self.handed_out(&mut st, bytes);
        Ok(Block {
            addr: b.addr + rest,
            size: bytes,
        })
    }

    /// Puts `b`, memory no stream has used, in the fresh list (made again if it was pruned).
    fn add_fresh(&self, b: FreeBlock) -> Result<()> {
        loop {
            let found = read(&self.streams).get(&StreamId::FRESH).cloned();
            let list = match found {
                Some(list) => list,
                None => {
                    let mut map = write(&self.streams);
                    Arc::clone(
                        map.entry(StreamId::FRESH)
                            .or_insert_with(|| Arc::new(StreamList::new(StreamId::FRESH, None))),
                    )
                }
            };
            let mut st = list.lock();
            if st.removed {
                continue;
            }
            let inserted = st.free.insert(b);
            debug_assert!(inserted.is_ok(), "fresh memory overlaps: {inserted:?}");
            return Ok(());
        }
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
        let delta = std::mem::take(&mut st.unflushed);
        let now = self.in_use_flushed.fetch_add(delta, Ordering::Relaxed) + delta;
        if delta > 0 {
            self.peak.fetch_max(now.max(0) as usize, Ordering::Relaxed);
        }
    }

    /// Bytes in use now: exact when no call is under way, as it sums every list.
    fn in_use_bytes(&self) -> usize {
        let lists: Vec<_> = read(&self.streams).values().cloned().collect();
        let total = lists.iter().map(|l| l.lock().in_use).sum::<isize>()
            + self.in_use_retired.load(Ordering::Relaxed);
        let total = total.max(0) as usize;
        self.peak.fetch_max(total, Ordering::Relaxed);
        total
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
                local::with(self.uid, |l: &mut local::Local<StreamList<S>>| {
                    l.forget_stream(id)
                });
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
        if let Some(Some(list)) =
            local::with(self.uid, |l: &mut local::Local<StreamList<S>>| l.stream(id))
        {
            return Ok(list);
        }
        let found = read(&self.streams).get(&id).cloned();
        let list = match found {
            Some(list) => list,
            None => self.add_list(id, stream)?,
        };
        local::with(self.uid, |l: &mut local::Local<StreamList<S>>| {
            l.remember_stream(id, &list)
        });
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

    /// Takes one block of at least `bytes` from another stream's list, ordering `stream` after
    /// it. Prefers blocks that are already safe for every stream (their stream's last event
    /// has completed), then any block, recording the other stream's event if needed.
    fn steal(
        &self,
        own: &Arc<StreamList<S>>,
        stream: &S::Stream,
        bytes: usize,
    ) -> Result<Option<FreeBlock>> {
        let mut others = self.other_lists(own.id);
        // The fresh list first: its memory costs no driver call and no device wait.
        let (mut order, rest): (Vec<_>, Vec<_>) =
            others.drain(..).partition(|l| l.id == StreamId::FRESH);
        // Thieves start at different victims, so they do not all queue on the same list.
        let start = (own.id.get() as usize) % rest.len().max(1);
        order.extend(rest[start..].iter().chain(&rest[..start]).cloned());
        let others: Vec<_> = order.iter().collect();
        // Pass 1: a block safe for every stream (never used, or its free is covered by a
        // completed event): no device wait, and what is left of it stays safe for everyone.
        // Fresh memory needs no driver call; the event is queried only if it would help.
        for &victim in &others {
            let mut st = victim.lock();
            if st.removed || st.free.largest() < bytes {
                continue;
            }
            let mut at = st
                .free
                .find_fit_before(bytes, SAFE_FOR_ALL, SAFE_FIT_PROBES);
            if at.is_none() && st.covered_seq > SAFE_FOR_ALL {
                let covered = st.covered_seq;
                let candidate = st.free.find_fit_before(bytes, covered, SAFE_FIT_PROBES);
                if candidate.is_some() && st.covered_complete(&self.order, victim)? {
                    at = candidate;
                }
            }
            // Only `bytes` of it: the rest stays where it is, safe as it was, instead of
            // moving with the thief (where its frees would merge into it and make it unsafe).
            let Some(mut b) = at.and_then(|addr| st.free.carve(addr, bytes)) else {
                continue;
            };
            b.seq = SAFE_FOR_ALL;
            bump(&victim.counters.stolen);
            let prune = st.stream.is_none() && st.free.is_empty();
            drop(st);
            if prune {
                self.prune(victim);
            }
            return Ok(Some(b));
        }
        // Pass 2: any block, with `stream` waiting on the victim's event on the device.
        for &victim in &others {
            let mut st = victim.lock();
            if st.removed {
                continue;
            }
            let Some(b) = st.free.carve_best_fit(bytes) else {
                continue;
            };
            if let Err(e) = self.order_after(&mut st, victim, own, stream, b.seq) {
                let back = st.free.insert(b);
                debug_assert!(back.is_ok());
                return Err(e);
            }
            bump(&victim.counters.stolen);
            let prune = st.stream.is_none() && st.free.is_empty();
            drop(st);
            if prune {
                self.prune(victim);
            }
            return Ok(Some(b));
        }
        Ok(None)
    }

    /// Makes `stream` (whose list is `own`) ordered after every free on `victim` up to `seq`:
    /// records `victim`'s event if its last record is older than `seq`, then waits on it on
    /// the device unless it has completed. Called under `victim`'s lock (`st`): `record`,
    /// `is_complete` and `wait` only enqueue or inspect, and holding the lock keeps a
    /// concurrent record from making the event stand for less than we checked.
    fn order_after(
        &self,
        st: &mut ListState<S>,
        victim: &StreamList<S>,
        own: &StreamList<S>,
        stream: &S::Stream,
        seq: u64,
    ) -> Result<()> {
        if seq == SAFE_FOR_ALL {
            return Ok(());
        }
        if seq > st.covered_seq {
            st.record(&self.order, victim)?;
        }
        if !st.covered_complete(&self.order, victim)? {
            self.order.wait(stream, victim.event(&self.order)?)?;
            bump(&own.counters.waits);
        }
        Ok(())
    }

    /// Moves every other list's blocks into `own`, ordering `stream` after each list.
    fn gather(&self, own: &Arc<StreamList<S>>, stream: &S::Stream) -> Result<()> {
        for victim in self.other_lists(own.id) {
            let mut st = victim.lock();
            if st.removed || st.free.is_empty() {
                continue;
            }
            let newest = st.free.newest_seq();
            self.order_after(&mut st, &victim, own, stream, newest)?;
            let blocks = st.free.drain();
            victim
                .counters
                .stolen
                .fetch_add(blocks.len() as u64, Ordering::Relaxed);
            let prune = st.stream.is_none();
            drop(st);
            if prune {
                self.prune(&victim);
            }
            let mut own_st = own.lock();
            let seq = own_st.next_seq();
            for mut b in blocks {
                if b.seq != SAFE_FOR_ALL {
                    b.seq = seq;
                }
                let moved = own_st.free.insert(b);
                debug_assert!(moved.is_ok(), "gathered block overlaps: {moved:?}");
            }
        }
        Ok(())
    }

    /// Every list but `id`'s (a snapshot: the map lock is released before any list lock).
    fn other_lists(&self, id: StreamId) -> Vec<Arc<StreamList<S>>> {
        read(&self.streams)
            .iter()
            .filter(|(k, _)| **k != id)
            .map(|(_, v)| Arc::clone(v))
            .collect()
    }

    /// Drops a detached list that ran empty from the map (map lock, then list lock).
    fn prune(&self, list: &Arc<StreamList<S>>) {
        let mut map = write(&self.streams);
        let mut st = list.lock();
        let same = map.get(&list.id).is_some_and(|l| Arc::ptr_eq(l, list));
        if same && !st.removed && st.stream.is_none() && st.free.is_empty() {
            st.removed = true;
            self.flush(&mut st);
            self.in_use_retired
                .fetch_add(std::mem::take(&mut st.in_use), Ordering::Relaxed);
            map.remove(&list.id);
        }
    }

    /// The chunk that holds `[addr, addr + bytes)` and, if this thread has it cached, the
    /// list of stream `id`, in one visit to the thread's cache. The chunk comes from the
    /// thread's snapshot of the chunk table (refreshed when the pool has grown since), or from
    /// the table itself.
    fn chunk_and_list(
        &self,
        addr: usize,
        bytes: usize,
        id: StreamId,
    ) -> (Option<ChunkId>, Option<Arc<StreamList<S>>>) {
        let gen = self.chunk_gen.load(Ordering::Acquire);
        let cached = local::with(self.uid, |l: &mut local::Local<StreamList<S>>| {
            let chunk = l
                .chunks(gen, || Arc::clone(&read(&self.chunks)))
                .find(addr, bytes)
                .map(|c| c.id);
            (chunk, l.stream(id))
        });
        match cached {
            Some((Some(chunk), list)) => (Some(chunk), list),
            // Not in the snapshot, or no cache on this thread: ask the table itself.
            other => (
                read(&self.chunks).find(addr, bytes).map(|c| c.id),
                other.and_then(|(_, list)| list),
            ),
        }
    }

    /// Takes a new chunk of at least `bytes` from the upstream: `grow_bytes` if that fits
    /// under the limit, else what room is left, else exactly `bytes`.
    fn grow(&self, bytes: usize) -> Result<Chunk, NoGrowth> {
        let want = bytes.max(self.options.grow_bytes);
        let mut sizes = vec![want];
        if let Some(max) = self.options.max_bytes {
            let room = max.saturating_sub(self.pool_bytes.load(Ordering::Relaxed));
            let room = room - room % self.align();
            if room < want && room > bytes {
                sizes.push(room);
            }
        }
        if want > bytes {
            sizes.push(bytes);
        }
        let mut last = NoGrowth::Limit;
        for size in sizes {
            match self.grow_exactly(size) {
                Ok(chunk) => return Ok(chunk),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Takes one chunk of exactly `bytes` from the upstream. The bytes are reserved under the
    /// limit first, so concurrent growers never overshoot it; no lock is held meanwhile.
    fn grow_exactly(&self, bytes: usize) -> Result<Chunk, NoGrowth> {
        let max = self.options.max_bytes.unwrap_or(usize::MAX);
        let reserved = self
            .pool_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                cur.checked_add(bytes).filter(|&n| n <= max)
            });
        if reserved.is_err() {
            return Err(NoGrowth::Limit);
        }
        let align = self.align();
        let addr = match self.upstream.allocate(bytes, align) {
            Ok(addr) if addr % align == 0 && addr.checked_add(bytes).is_some() => addr,
            Ok(addr) => {
                // SAFETY: `addr` was just returned by `allocate(bytes, align)` and is unused.
                let _ = unsafe { self.upstream.deallocate(addr, bytes, align) };
                self.pool_bytes.fetch_sub(bytes, Ordering::Relaxed);
                return Err(NoGrowth::Upstream(Error::InvalidArgument(format!(
                    "upstream returned {addr:#x} for {bytes} bytes aligned to {align}"
                ))));
            }
            Err(e) => {
                self.pool_bytes.fetch_sub(bytes, Ordering::Relaxed);
                return Err(NoGrowth::Upstream(e));
            }
        };
        let chunk = Chunk {
            id: self.next_chunk.fetch_add(1, Ordering::Relaxed),
            addr,
            size: bytes,
        };
        {
            let mut table = write(&self.chunks);
            *table = Arc::new(table.with(chunk));
        }
        self.chunk_gen.fetch_add(1, Ordering::Release);
        Ok(chunk)
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

    /// Every chunk, in address order.
    pub(crate) fn chunk_list(&self) -> Vec<Chunk> {
        read(&self.chunks).iter().copied().collect()
    }
}

impl<U: Upstream, S: StreamOrder> Drop for PoolResource<U, S> {
    fn drop(&mut self) {
        // Free lists (and their events) go first; nothing else holds them now: threads' caches
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
