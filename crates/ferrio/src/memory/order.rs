//! The stream/event model the pool is written against: record an event on a stream, ask
//! whether it has completed, make a stream wait for it on the device.
//!
//! The pool never calls CUDA itself. It talks to a [`StreamOrder`], which is either the
//! host-memory emulation in [`super::emulated`] (tests, CI) or the CUDA driver (see
//! `memory/cuda.rs` for the place where that implementation goes).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;

/// A process-unique name for a stream, never reused.
///
/// The pool keys its per-stream free lists by `StreamId`, not by the raw stream handle: the
/// CUDA driver hands out the same `CUstream` value again after a stream is destroyed, and a
/// pool keyed by handle would then treat blocks freed on the dead stream as ordered on the
/// new one. A stream implementation assigns an id once, when the stream is created or first
/// registered, with [`StreamId::unique`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(u64);

/// Id 0 is the pool's own list of memory that no stream has touched yet.
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

impl StreamId {
    /// The id of the pool's list of fresh memory (from `initial_bytes`), which no stream has
    /// used and every stream may take at once.
    pub(crate) const FRESH: StreamId = StreamId(0);

    /// A new id, different from every id handed out before in this process.
    pub fn unique() -> StreamId {
        StreamId(NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed))
    }

    /// The number behind this id, for logs and statistics.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == StreamId::FRESH {
            f.write_str("fresh")
        } else {
            write!(f, "#{}", self.0)
        }
    }
}

/// Streams and events: the ordering primitives a stream-ordered pool needs.
///
/// The contract mirrors the CUDA driver:
/// - [`record`](StreamOrder::record) captures "everything enqueued on `stream` so far"; the
///   event completes when the stream has finished that work. Recording again replaces what
///   the event stands for, for waits and queries issued afterwards.
/// - [`wait`](StreamOrder::wait) makes work enqueued on `stream` *later* run only after the
///   event's most recent record has completed. It returns at once (no host synchronization);
///   waiting on an event that was never recorded is a no-op.
/// - [`is_complete`](StreamOrder::is_complete) never blocks.
///
/// The pool calls `record` and `is_complete` while holding the lock of one stream's free
/// list; implementations must return without waiting for device work (as `cuEventRecord`
/// and `cuEventQuery` do).
pub trait StreamOrder: Send + Sync + 'static {
    /// A stream handle. Cloning must be cheap; the pool keeps one clone per stream it has seen
    /// until [`detach_stream`](super::PoolResource::detach_stream) is called for it.
    type Stream: Clone + Send + Sync + 'static;
    /// An event. Dropping it releases it; the pool drops events only when it drops a stream's
    /// free list (when the pool is dropped or a detached stream runs empty), never from a
    /// thread-local or static destructor.
    type Event: Send + Sync + 'static;

    /// The stream's process-unique id.
    fn stream_id(&self, stream: &Self::Stream) -> StreamId;

    /// Creates an event that is used only for ordering (no timing).
    fn create_event(&self) -> Result<Self::Event>;

    /// Records `event` on `stream`: it completes once the work enqueued so far has.
    fn record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;

    /// Whether the event's most recent record has completed (true if it was never recorded).
    fn is_complete(&self, event: &Self::Event) -> Result<bool>;

    /// Makes later work on `stream` wait, on the device, for the event's most recent record.
    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;
}
