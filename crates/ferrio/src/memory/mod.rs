//! A stream-ordered pool memory resource for device, pinned and host memory, built for many
//! threads and many streams at once.
//!
//! It owns: the free lists, the chunk table, the per-thread caches and the event strategy.
//! It may not touch: the CUDA driver directly. Streams and events come in through the
//! [`StreamOrder`] trait (emulated in the `emulated` module for CI; the CUDA driver in [`CudaStreams`]),
//! memory through the [`Upstream`] trait ([`DeviceUpstream`], [`PinnedUpstream`],
//! [`HostUpstream`]).
//!
//! # Semantics
//!
//! [`PoolResource::allocate`] and [`PoolResource::deallocate`] take a stream. A block freed
//! on stream S can be handed out on S at once, because S runs its work in order. Handed to
//! another stream T, it is safe only once T is ordered after S's work up to the free: the
//! pool then records an event on S (if the last one does not cover the free yet), asks
//! whether it has completed (`cuEventQuery`), and if not makes T wait for it on the device
//! (`cuStreamWaitEvent`). The host never blocks on the GPU.
//!
//! # Design: nothing shared on the fast path
//!
//! RMM's `pool_memory_resource` keeps a free list per stream but guards all of them, the
//! growth and the event bookkeeping with one mutex; with 32 streams each allocate/free spent
//! over a millisecond waiting for it (rapidsai/rmm#1887). Here:
//!
//! - **One free list per stream, each with its own lock** (`StreamList`). Blocks are
//!   indexed by `(size, addr)` for best fit and by `addr` for merging with neighbours, and
//!   only neighbours from the same upstream chunk merge, so chunks stay separable.
//! - **A read-mostly map** `RwLock<HashMap<StreamId, Arc<StreamList>>>` from stream to list,
//!   written only when a stream is first seen or a detached stream's list runs empty.
//! - **A per-thread cache of freed blocks per stream** (`ThreadCache`): a block freed on S
//!   waits in the freeing thread's cache for S and serves that thread's next allocation of the
//!   same size on S, with no list lock and no search (bins by exact size). Threads sharing one
//!   stream (one default stream per device is the common case) would otherwise all queue on
//!   that stream's list lock. See "Thread caches" below.
//! - **A per-thread map** of `StreamId → Weak<StreamList>` and of the chunk table: a thread
//!   allocating and freeing on its own streams takes its list's lock and nothing else when
//!   its cache cannot serve it (the chunk table snapshot is checked with one atomic load).
//!   Lists are 128-byte aligned so two streams' locks never share a cache line.
//! - **No shared counter on the fast path.** Each list keeps its own in-use bytes; a list adds
//!   its change to the pool-wide total (and checks the peak) only once it reaches 1 MiB either
//!   way. `stats().in_use_bytes` sums the lists and the thread caches (exact when no call is
//!   under way);
//!   `peak_in_use_bytes` is within 1 MiB per stream of the true peak. Measured on 16 cores,
//!   a single pool-wide `fetch_add` per call capped 16 threads × 16 streams at 7 M
//!   allocations/s; without it they reach 40 M/s.
//! - **Streams are keyed by [`StreamId`]**, a process-unique number the stream implementation
//!   assigns at creation or registration, never by the raw `CUstream` (which the driver reuses
//!   after a stream is destroyed). [`PoolResource::detach_stream`] releases a stream's handle
//!   before it is destroyed.
//! - **Fresh memory has its own list.** The initial bytes and the rest of every grown chunk
//!   go to a list no stream frees into, so no stream's frees ever merge into them (a merged
//!   block carries its newest free's stamp and would make the next taker wait on the device).
//! - **When the own list has no fit**: carve *only the bytes needed* from another list, the
//!   fresh list first (no driver call), then a block already safe for everyone (its stream's
//!   event has completed: one `cuEventQuery`), else any, with a device wait; the rest of the
//!   block stays where it was, as safe as it was. (Taking the whole block made the H200's
//!   multi-stream kernel scenario pass the whole pool from stream to stream, each hand-over
//!   a device wait on the previous stream's kernel, and GPU overlap collapsed: see the first
//!   H200 run in `benchmarks/memory_pool/RESULTS.md`.) Then
//!   grow from the upstream; only then gather every list into the own list and coalesce, and
//!   if that still does not fit, return [`Error::OutOfMemory`](crate::Error::OutOfMemory).
//! - **Growth** reserves the bytes against the limit with a compare-and-swap, then calls the
//!   upstream holding only the grow lock, which serializes growers. The grower puts the rest
//!   of its chunk in the fresh list and bumps a growth counter *before* letting the lock go;
//!   a thread that finds the counter moved since it first looked looks again, so threads that
//!   miss at the same moment take one chunk, not one each.

//! # Thread caches
//!
//! Per thread, per pool, per stream (at most four streams): bins of blocks of one exact size
//! (at most 16 blocks each, 16 sizes, 4 MiB in all; blocks over 1 MiB are never cached).
//! Only a block freed on S is ever put in a cache for S, and a cache for S serves only
//! allocations on S, so a cached block needs no event, exactly as in S's list. Blocks leave a
//! cache for S's list, stamped there as a new free (so S's event covers them only once
//! recorded after that), when:
//! - a bin or the cache is over its bounds (the oldest half goes);
//! - the thread exits, or forgets the pool or the stream for newer ones;
//! - the thread misses in its own list: its caches for *other* streams go first, before it
//!   steals or grows;
//! - [`PoolResource::detach_stream`] (every thread's cache for that stream, before the last
//!   record), [`PoolResource::consolidate`], [`PoolResource::flush_thread_caches`], and before
//!   out of memory: a pool at its limit drains every thread's cache, so an allocation never
//!   fails while blocks sit idle in one.
//!
//! Each cache is registered with the pool behind its own mutex, which its thread takes on
//! every cached call and other threads only to drain or count caches. Cached blocks count as
//! free (`free_bytes`, and `cached_bytes` of them) on their stream, and a cache's
//! allocations and frees as its stream's. A double free is refused when the first copy is
//! still in the stream's list or in this thread's cache for the stream; once the cache has
//! passed it to the list, a second free on the same thread is not detected. The cache is used
//! only with [`EventPolicy::OnSteal`]: the other policies record on frees.
//!
//! # Lock order
//!
//! 0. the grow lock (`Mutex<()>`), then
//! 1. the stream map (`RwLock`), then
//! 2. one thread's block cache (`Mutex`), then
//! 3. one stream's list (`Mutex`), then
//! 4. the chunk table (`RwLock`).
//!
//! The registry of thread caches (`Mutex<Vec<_>>`) is taken alone and let go at once.
//!
//! No two list locks are ever held at once (a steal locks one victim at a time and the
//! thief's own list only after letting the victim go); the map is held with a list only when
//! a drained, detached list is removed; the chunk table is written only by a grower and read
//! only to refresh a thread's snapshot. The grow lock is the one lock held across an upstream
//! call (`cuMemAlloc` may block for hundreds of microseconds): only threads that would
//! otherwise call the upstream themselves wait on it, never the fast path. The only driver
//! calls made under a list lock are `cuEventRecord`, `cuEventQuery` and `cuStreamWaitEvent`
//! (and, once per list, `cuEventCreate` before its first record),
//! under the *victim's* list lock during a steal (and `cuEventRecord` under the own list lock
//! when the policy records on free): all three enqueue or inspect and return without waiting
//! for the GPU, and holding the lock keeps another thread from re-recording the event between
//! the check of what it covers and the wait on it. Thread-local caches are never borrowed
//! across a call out of the pool.
//!
//! # Events
//!
//! Each stream's list owns one event, made at its first record (a stream nobody steals from
//! never makes one, so a stream's first allocation makes no driver call) and recorded again
//! whenever a steal needs it to cover newer frees. [`EventPolicy`] chooses when to record:
//! [`OnSteal`](EventPolicy::OnSteal) (the default), [`EveryFree`](EventPolicy::EveryFree)
//! (RMM's choice) or [`EveryNthFree`](EventPolicy::EveryNthFree).
//!
//! Every free stamps its block with the list's free counter; the event's last record covers
//! the blocks stamped before it. A steal takes a block the last record covers once that
//! record has completed (no wait), else records if needed and makes the thief wait on the
//! device. **The default, `OnSteal`, makes no driver call on the free path at all**, because:
//!
//! - Driver calls are not cheap under threads: an event record, query or wait costs several
//!   times a whole pool allocate + free pair once sixteen threads call at once, so recording
//!   on every free (RMM's choice) would make frees many times dearer
//!   (`benchmarks/memory_pool/event_cost.c`; numbers in `benchmarks/memory_pool/RESULTS.md`).
//! - Steals are rare, and one record covers every block freed before it, so `OnSteal`
//!   records a few events per thousand allocations even when every allocation must steal.
//! - With driver-like call costs emulated, `EveryFree` allocated several times slower than
//!   `OnSteal`, and `EveryNthFree(16)` came out between (same RESULTS page).
//!
//! The price of recording late is that a late record also covers work enqueued after the
//! free, so a thief may wait on the device longer than it had to. No workload above produced
//! such waits, but if profiles show them, `EveryNthFree` records closer to the free at
//! 1/N of the per-free cost.
//!
//! Events are destroyed only when the pool drops a list (pool drop, or a detached stream's
//! list running empty); per-thread caches hold weak references only, so no event or memory is
//! ever released from a thread-local or static destructor at process exit. A thread's block
//! cache moves its blocks into lists from such a destructor, but never drops one: a list
//! with cache entries is never pruned, and the pool's `Drop` marks every cache dead (under
//! its lock) before it lets its lists go.
//!
//! # Who uses it, and why not the bounce rings
//!
//! On a GPU the pool runs over [`CudaStreams`] with [`DeviceUpstream`] (device memory) or
//! [`PinnedUpstream`] (pinned host memory); it is meant for callers that allocate and free
//! often on many streams: Python arrays (as CuPy's allocator), staging buffers of user code.
//!
//! ferrio's own pinned bounce buffers (`crate::bounce`) do **not** come from it, on purpose:
//! - a ring allocates its K buffers once, when a worker first copies to a context, and keeps
//!   them for the worker's life; there is no allocate/free traffic for a pool to absorb (one
//!   `cuMemHostAlloc` per buffer per worker, against gigabytes copied through it);
//! - each buffer is used on its own ring's streams only, ordered by the ring's own events, so
//!   the pool's cross-stream ordering would be unused bookkeeping;
//! - a pool returns memory to its upstream only when dropped, while a ring's buffers go back
//!   to the driver (and to the ring's pinned-memory budget) when its worker
//!   releases them; pooling would keep released pinned memory locked away from the system.

mod blocks;
mod cuda;
#[cfg(any(test, feature = "testing"))]
pub mod emulated;
mod local;
mod options;
mod order;
mod pool;
mod stats;
mod stream_list;
mod thread_cache;
mod upstream;

#[cfg(test)]
mod tests;

pub use cuda::{
    CudaStreams, DeviceUpstream, DriverPool, OrderEvent, PinnedUpstream, StreamGate, StreamHandle,
};
#[cfg(any(test, feature = "testing"))]
pub use emulated::{EmulatedCalls, EmulatedEvent, EmulatedOp, EmulatedStream, EmulatedStreams};
pub use options::{EventPolicy, PoolOptions};
pub use order::{StreamId, StreamOrder};
pub use pool::{Block, PoolResource};
pub use stats::{PoolStats, StreamStats};
pub use upstream::{HostUpstream, MemoryKind, Upstream};
