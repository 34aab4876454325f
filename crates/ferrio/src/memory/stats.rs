//! What a [`PoolResource`](super::PoolResource) reports about itself: [`PoolStats`] and one
//! [`StreamStats`] per stream. Plain snapshot types; the pool fills them in.

use super::order::StreamId;
use super::upstream::MemoryKind;

/// Counters of one stream's use of the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// The stream.
    pub stream: StreamId,
    /// Whether the pool still holds the stream's handle (false after
    /// [`detach_stream`](super::PoolResource::detach_stream), and for memory no stream used yet).
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
    /// Free blocks now in the stream's list and in threads' caches for the stream.
    pub free_blocks: usize,
    /// Free bytes now in the stream's list and in threads' caches for the stream.
    pub free_bytes: usize,
    /// Of `free_blocks`, those in threads' caches (reused only by the thread that freed
    /// them, on this stream, until the pool flushes them to the list).
    pub cached_blocks: usize,
    /// Of `free_bytes`, those in threads' caches.
    pub cached_bytes: usize,
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
    /// Bytes free: in free lists and in threads' caches (`pool_bytes` is `in_use_bytes`
    /// plus `free_bytes` when no call is under way).
    pub free_bytes: usize,
    /// Of `free_bytes`, those in threads' caches.
    pub cached_bytes: usize,
    /// The largest free block (in a list or a thread's cache).
    pub largest_free_block: usize,
    /// Upstream allocations held.
    pub chunks: usize,
    /// The limit on `pool_bytes`, if any.
    pub max_bytes: Option<usize>,
    /// One entry per stream the pool knows, by id.
    pub streams: Vec<StreamStats>,
}
