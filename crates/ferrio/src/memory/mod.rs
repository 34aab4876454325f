//! A stream-ordered pool memory resource for device, pinned and host memory, built for many
//! threads and many streams at once.
//!
//! It owns: the free lists, the chunk table, the per-thread caches and the event strategy.
//! It may not touch: the CUDA driver directly. Streams and events come in through the
//! [`StreamOrder`] trait (emulated in [`emulated`] for CI; the real implementation goes in
//! `memory/cuda.rs`), memory through the [`Upstream`] trait.
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
//! - **A per-thread cache** of `StreamId → Weak<StreamList>` and of the chunk table: a thread
//!   allocating and freeing on its own streams takes its list's lock and nothing else
//!   (the chunk table snapshot is checked with one atomic load). The pool-wide byte counters
//!   are the only shared writes on the fast path (two relaxed atomic adds).
//! - **Streams are keyed by [`StreamId`]**, a process-unique number the stream implementation
//!   assigns at creation or registration, never by the raw `CUstream` (which the driver reuses
//!   after a stream is destroyed). [`PoolResource::detach_stream`] releases a stream's handle
//!   before it is destroyed.
//! - **When the own list has no fit**: steal *one* block from another stream, first one
//!   already safe for everyone (its stream's event has completed), else any, with a device
//!   wait; the rest of the stolen block stays with the thief. Then grow from the upstream,
//!   with no pool lock held (bytes are reserved against the limit with a compare-and-swap
//!   first). Only then gather every list into the own list and coalesce, and if that still
//!   does not fit, return [`Error::OutOfMemory`](crate::Error::OutOfMemory).
//!
//! # Lock order
//!
//! 1. the stream map (`RwLock`), then
//! 2. one stream's list (`Mutex`), then
//! 3. the chunk table (`RwLock`).
//!
//! No two list locks are ever held at once (a steal locks one victim at a time and the
//! thief's own list only after letting the victim go); the map is held with a list only when
//! a drained, detached list is removed; the chunk table is written only by a grower holding
//! nothing else, and read only to refresh a thread's snapshot. No lock is held across an
//! upstream call (`cuMemAlloc` may block). The only driver calls made under a lock are
//! `cuEventRecord`, `cuEventQuery` and `cuStreamWaitEvent`, under the *victim's* list lock
//! during a steal (and `cuEventRecord` under the own list lock when the policy records on
//! free): all three enqueue or inspect and return without waiting for the GPU, and holding
//! the lock keeps another thread from re-recording the event between the check of what it
//! covers and the wait on it. Thread-local caches are never borrowed across a call out of
//! the pool.
//!
//! # Events
//!
//! Each stream's list owns one event, made when the list is and recorded again whenever a
//! steal needs it to cover newer frees. [`EventPolicy`] chooses when to record:
//! [`OnSteal`](EventPolicy::OnSteal) (the default), [`EveryFree`](EventPolicy::EveryFree)
//! (RMM's choice) or [`EveryNthFree`](EventPolicy::EveryNthFree).
//!
//! EVENT-MEASUREMENTS
//!
//! Events are destroyed only when the pool drops a list (pool drop, or a detached stream's
//! list running empty); per-thread caches hold weak references only, so no event or memory is
//! ever released from a thread-local or static destructor at process exit.

mod blocks;
mod cuda;
pub mod emulated;
mod local;
mod order;
mod pool;
mod upstream;

#[cfg(test)]
mod tests;

pub use emulated::{EmulatedCalls, EmulatedEvent, EmulatedOp, EmulatedStream, EmulatedStreams};
pub use order::{StreamId, StreamOrder};
pub use pool::{Block, EventPolicy, PoolOptions, PoolResource, PoolStats, StreamStats};
pub use upstream::{HostUpstream, MemoryKind, Upstream};
