//! Per-thread caches that keep the pool's fast path off every shared lock.
//!
//! For each pool a thread has used (by the pool's unique number) it keeps:
//! - weak references to the free lists of the streams it used last, so finding "my stream's
//!   list" takes no lock at all (the pool's stream map is read only on a miss);
//! - a snapshot of the pool's chunk table with the generation it was taken at, so
//!   `deallocate` finds a block's chunk without a lock; the snapshot is refreshed when the
//!   pool's generation counter (read with one atomic load) has moved.
//!
//! - the thread's cache of freed blocks for the pool (`C`, the pool's
//!   [`CacheOwner`](super::thread_cache::CacheOwner)), made on first use.
//!
//! The caches hold only `Weak` free lists, plain chunk tables and the block cache: when a
//! thread exits, its cache is dropped by a thread-local destructor, and that must never
//! release a CUDA event or memory (the driver may already be shutting down at process exit).
//! A `Weak` keeps no list alive, so the last strong reference to a list (and its event) is
//! always dropped by the pool itself; the block cache's destructor only moves blocks into
//! lists that the pool still holds (see `thread_cache.rs`).

use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::blocks::ChunkTable;
use super::order::StreamId;

/// Pools remembered per thread; the least recently used is forgotten beyond this.
const POOLS_PER_THREAD: usize = 8;
/// Streams remembered per pool per thread.
const STREAMS_PER_POOL: usize = 8;

struct Entry {
    pool: u64,
    state: Box<dyn Any>,
}

thread_local! {
    static CACHE: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

/// What one thread remembers about one pool whose free lists are `L`s and whose block cache
/// is a `C`.
pub(crate) struct Local<L, C> {
    chunk_gen: u64,
    chunks: Option<Arc<ChunkTable>>,
    streams: Vec<(StreamId, Weak<L>)>,
    /// The thread's block cache for the pool, once made.
    pub cache: Option<C>,
}

impl<L, C> Local<L, C> {
    /// The cached list of stream `id`, if it is still alive.
    pub fn stream(&mut self, id: StreamId) -> Option<Arc<L>> {
        let i = self.streams.iter().position(|(s, _)| *s == id)?;
        match self.streams[i].1.upgrade() {
            Some(list) => {
                if i != 0 {
                    self.streams[..=i].rotate_right(1);
                }
                Some(list)
            }
            None => {
                self.streams.remove(i);
                None
            }
        }
    }

    /// Remembers `list` as the list of stream `id`.
    pub fn remember_stream(&mut self, id: StreamId, list: &Arc<L>) {
        self.streams.retain(|(s, _)| *s != id);
        if self.streams.len() >= STREAMS_PER_POOL {
            self.streams.pop();
        }
        self.streams.insert(0, (id, Arc::downgrade(list)));
    }

    /// Forgets stream `id`.
    pub fn forget_stream(&mut self, id: StreamId) {
        self.streams.retain(|(s, _)| *s != id);
    }

    /// The chunk table, refreshed with `load` when `gen` differs from the snapshot's.
    pub fn chunks(&mut self, gen: u64, load: impl FnOnce() -> Arc<ChunkTable>) -> &ChunkTable {
        if self.chunk_gen != gen || self.chunks.is_none() {
            self.chunk_gen = gen;
            self.chunks = Some(load());
        }
        self.chunks.get_or_insert_with(Default::default)
    }
}

/// Runs `f` on this thread's cache for pool `pool`. Returns `None` when the cache cannot be
/// used: during thread teardown, or when called from inside another `with` (the pool never
/// nests them, but an upstream or stream implementation could call back into a pool).
pub(crate) fn with<L: 'static, C: 'static, R>(
    pool: u64,
    f: impl FnOnce(&mut Local<L, C>) -> R,
) -> Option<R> {
    CACHE
        .try_with(|cache| {
            let mut entries = cache.try_borrow_mut().ok()?;
            let i = match entries.iter().position(|e| e.pool == pool) {
                Some(i) => i,
                None => {
                    if entries.len() >= POOLS_PER_THREAD {
                        entries.pop();
                    }
                    entries.push(Entry {
                        pool,
                        state: Box::new(Local::<L, C> {
                            chunk_gen: 0,
                            chunks: None,
                            streams: Vec::new(),
                            cache: None,
                        }),
                    });
                    entries.len() - 1
                }
            };
            if i != 0 {
                entries[..=i].rotate_right(1);
            }
            let local = entries[0].state.downcast_mut::<Local<L, C>>()?;
            Some(f(local))
        })
        .ok()
        .flatten()
}
