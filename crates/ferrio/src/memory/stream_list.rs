//! One stream's free list ([`StreamList`]): its free blocks and counters under its own lock,
//! the event that orders other streams after its frees, and the stamps that say which frees
//! the event's last record covers. It may not touch other lists, the stream map or the chunk
//! table: moving blocks between lists is the pool's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use super::blocks::FreeBlocks;
use super::order::{StreamId, StreamOrder};
use crate::error::Result;

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) steals: AtomicU64,
    pub(super) stolen: AtomicU64,
    pub(super) waits: AtomicU64,
    pub(super) records: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed) + 1
}

/// The mutable part of a stream's free list, under its lock.
pub(super) struct ListState<S: StreamOrder> {
    /// The handle events are recorded on; `None` once detached (and for fresh memory).
    pub(super) stream: Option<S::Stream>,
    /// Set (under the map's write lock) when the list was taken out of the map; a thread that
    /// still finds it in its cache must look again.
    pub(super) removed: bool,
    pub(super) free: FreeBlocks,
    /// Blocks handed out on this stream.
    pub(super) allocations: u64,
    /// Blocks freed on this stream.
    pub(super) frees: u64,
    /// Bytes handed out on this stream minus bytes freed on it (negative when blocks are
    /// freed on another stream than the one they were allocated on).
    pub(super) in_use: isize,
    /// The part of `in_use` not yet added to the pool-wide total.
    pub(super) unflushed: isize,
    /// Stamps frees (and blocks arriving from other lists); a block's `seq` is the value
    /// after the stamp.
    pub(super) free_seq: u64,
    /// The event's latest record covers every block with `seq <= covered_seq`.
    pub(super) covered_seq: u64,
    /// Whether that record has been seen complete (then no wait is needed at all).
    pub(super) covered_done: bool,
    /// Threads' block caches that hold an entry for this stream: while there are any, the
    /// list is not pruned, so their blocks always have a list to go back to.
    pub(super) cache_entries: usize,
}

impl<S: StreamOrder> ListState<S> {
    /// An empty list for `stream` (`None`: memory no stream has used).
    pub(super) fn new(stream: Option<S::Stream>) -> Self {
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
            cache_entries: 0,
        }
    }

    /// Stamps a new free.
    pub(super) fn next_seq(&mut self) -> u64 {
        self.free_seq += 1;
        self.free_seq
    }

    /// Records the list's event on its stream now, covering every block in the list.
    pub(super) fn record(&mut self, order: &S, list: &StreamList<S>) -> Result<bool> {
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
    pub(super) fn covered_complete(&mut self, order: &S, list: &StreamList<S>) -> Result<bool> {
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
    pub(super) id: StreamId,
    /// Made at the list's first record (most streams are never stolen from, so most lists
    /// never need one: a stream's first allocation makes no driver call), recorded again and
    /// again, dropped with the list.
    pub(super) event: OnceLock<S::Event>,
    pub(super) counters: Counters,
    pub(super) state: Mutex<ListState<S>>,
}

impl<S: StreamOrder> StreamList<S> {
    /// An empty list; `stream` is `None` for fresh memory.
    pub(super) fn new(id: StreamId, stream: Option<S::Stream>) -> StreamList<S> {
        StreamList {
            id,
            event: OnceLock::new(),
            counters: Counters::default(),
            state: Mutex::new(ListState::new(stream)),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ListState<S>> {
        lock(&self.state)
    }

    /// The list's event, made on first use. Called with the list's lock held, so only one
    /// thread makes it.
    pub(super) fn event(&self, order: &S) -> Result<&S::Event> {
        if let Some(e) = self.event.get() {
            return Ok(e);
        }
        let made = order.create_event()?;
        Ok(self.event.get_or_init(|| made))
    }
}

/// Takes a lock whose holder panicked as well: every critical section of the pool leaves the
/// free lists consistent between statements, so a panic (a bug) loses no more than its block.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
