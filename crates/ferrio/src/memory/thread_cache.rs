//! A thread's cache of blocks it freed, per stream ([`ThreadCache`]): the fast path of
//! threads that share a stream. A block freed on stream S waits here and goes to the next
//! allocation of the same size on S by the same thread, touching no shared lock; it never
//! goes to another stream from here (stream order: it is only safe on S without an event).
//!
//! Bounded per stream by count and bytes; when full, its oldest half goes to the stream's
//! list. Everything goes back to the lists when the thread exits (this type's `Drop`), when
//! the pool drains caches (detach, consolidate, before reporting out of memory) and when a
//! thread's cache forgets a stream for a newer one. It knows the lists and the blocks, not
//! the pool: the pool's accounting of cached blocks lives in `pool.rs`.
//!
//! Each cache is behind its own mutex, taken by its thread on every cached call and by other
//! threads only when the pool drains or counts caches, so it is normally uncontended. Lock
//! order: a cache's lock may be held while taking a list's lock, never the other way round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::blocks::{ChunkId, FreeBlock};
use super::order::{StreamId, StreamOrder};
use super::stream_list::{lock, StreamList};

/// Blocks larger than this are never cached: they are rare, and would fill a cache alone.
pub(super) const MAX_BLOCK_BYTES: usize = 1 << 20;
/// Most blocks a thread keeps of one size for one stream.
const MAX_PER_SIZE: usize = 16;
/// Most sizes a thread keeps blocks of for one stream.
const MAX_SIZES: usize = 16;
/// Most bytes a thread keeps for one stream.
const MAX_BYTES: usize = 4 << 20;
/// Streams a thread keeps blocks for, per pool; the least recently cached is flushed beyond.
const STREAMS: usize = 4;

/// One cached block.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    pub(super) addr: usize,
    pub(super) size: usize,
    pub(super) chunk: ChunkId,
}

/// Cached blocks of one size, oldest first.
struct Bin {
    size: usize,
    blocks: Vec<(usize, ChunkId)>,
}

impl Bin {
    /// Takes the oldest half of the blocks out.
    fn shed(&mut self) -> Vec<Cached> {
        let n = self.blocks.len().div_ceil(2);
        let size = self.size;
        self.blocks
            .drain(..n)
            .map(|(addr, chunk)| Cached { addr, size, chunk })
            .collect()
    }
}

/// A thread's blocks and counters for one stream.
pub(super) struct StreamCache<S: StreamOrder> {
    pub(super) id: StreamId,
    /// Weak: a cache never keeps a list (and its event) alive. While this entry exists the
    /// list counts it in `cache_entries` and is not pruned, so the upgrade succeeds as long
    /// as the pool lives.
    list: Weak<StreamList<S>>,
    /// One bin per size, in the order the sizes were first cached.
    bins: Vec<Bin>,
    pub(super) bytes: usize,
    /// Allocations and frees served here, not yet added to the list's counters.
    pub(super) allocations: u64,
    pub(super) frees: u64,
    /// In-use change made here, not yet added to the list's `in_use`.
    pub(super) in_use: isize,
    /// The part of `in_use` not yet added to the pool-wide total.
    pub(super) unflushed: isize,
}

impl<S: StreamOrder> StreamCache<S> {
    /// Takes a cached block of exactly `bytes`, the most recently freed one.
    pub(super) fn take(&mut self, bytes: usize) -> Option<usize> {
        let bin = self.bins.iter_mut().find(|b| b.size == bytes)?;
        let (addr, _) = bin.blocks.pop()?;
        self.bytes -= bytes;
        self.allocations += 1;
        Some(addr)
    }

    /// Caches a freed block, unless the same block is already cached (a double free: its
    /// address is returned). Past the cache's bounds, the oldest blocks go to the list.
    pub(super) fn put(&mut self, b: Cached) -> Result<(), usize> {
        let i = match self.bins.iter().position(|x| x.size == b.size) {
            Some(i) => i,
            None => {
                if self.bins.len() >= MAX_SIZES {
                    let old = self.bins.remove(0);
                    let size = old.size;
                    let gone: Vec<Cached> = (old.blocks.iter())
                        .map(|&(addr, chunk)| Cached { addr, size, chunk })
                        .collect();
                    self.bytes -= gone.len() * size;
                    self.return_to_list(gone, false);
                }
                self.bins.push(Bin {
                    size: b.size,
                    blocks: Vec::new(),
                });
                self.bins.len() - 1
            }
        };
        let bin = &mut self.bins[i];
        if bin.blocks.iter().any(|&(addr, _)| addr == b.addr) {
            return Err(b.addr);
        }
        bin.blocks.push((b.addr, b.chunk));
        self.bytes += b.size;
        self.frees += 1;
        let mut gone = Vec::new();
        if bin.blocks.len() > MAX_PER_SIZE {
            gone = bin.shed();
        }
        if self.bytes > MAX_BYTES {
            for bin in &mut self.bins {
                gone.extend(bin.shed());
            }
        }
        if !gone.is_empty() {
            self.bytes -= gone.iter().map(|b| b.size).sum::<usize>();
            self.return_to_list(gone, false);
        }
        Ok(())
    }

    /// The cached blocks.
    pub(super) fn blocks(&self) -> impl Iterator<Item = Cached> + '_ {
        self.bins.iter().flat_map(|bin| {
            bin.blocks.iter().map(|&(addr, chunk)| Cached {
                addr,
                size: bin.size,
                chunk,
            })
        })
    }

    /// Moves every block and every counter to the stream's list and lets the list go.
    fn retire(mut self) {
        let all: Vec<Cached> = self.blocks().collect();
        self.bins.clear();
        self.bytes = 0;
        self.return_to_list(all, true);
    }

    /// Puts `blocks` in the list, stamped as one new free there (later than each block's
    /// real free, so the list's event covers them once it is recorded after this). With
    /// `last`, also adds this entry's counters to the list's and stops counting as its entry.
    fn return_to_list(&mut self, blocks: Vec<Cached>, last: bool) {
        let Some(list) = self.list.upgrade() else {
            // The pool is gone (it drains caches before dropping its lists): nothing to do.
            return;
        };
        let mut st = list.lock();
        debug_assert!(!st.removed, "a list with cache entries was pruned");
        if !blocks.is_empty() {
            let seq = st.next_seq();
            for b in blocks {
                // An overlap here is a double free that went unseen (the first copy was
                // already in the list): dropping the second copy hands the block out once.
                let _ = st.free.insert(FreeBlock {
                    addr: b.addr,
                    size: b.size,
                    chunk: b.chunk,
                    seq,
                });
            }
        }
        if last {
            st.allocations += std::mem::take(&mut self.allocations);
            st.frees += std::mem::take(&mut self.frees);
            st.in_use += std::mem::take(&mut self.in_use);
            st.unflushed += std::mem::take(&mut self.unflushed);
            st.cache_entries -= 1;
        }
    }
}

/// What a cache's lock guards.
pub(super) struct CacheState<S: StreamOrder> {
    /// Set by the pool's `Drop`: the lists are going away, nothing may be flushed to them.
    dead: bool,
    /// Most recently added first.
    pub(super) streams: Vec<StreamCache<S>>,
}

impl<S: StreamOrder> CacheState<S> {
    /// The entry of stream `id`, if this thread caches for it (never after the pool died).
    pub(super) fn stream(&mut self, id: StreamId) -> Option<&mut StreamCache<S>> {
        if self.dead {
            return None;
        }
        self.streams.iter_mut().find(|e| e.id == id)
    }

    /// Starts caching for the stream of `list` (unless it does already, or the list is
    /// detached or pruned), flushing the oldest stream's entry if there are too many.
    pub(super) fn add_stream(&mut self, list: &Arc<StreamList<S>>) {
        if self.dead || self.streams.iter().any(|e| e.id == list.id) {
            return;
        }
        if self.streams.len() >= STREAMS {
            if let Some(old) = self.streams.pop() {
                old.retire();
            }
        }
        {
            let mut st = list.lock();
            // A detached stream's blocks must reach its list (a detach drains caches after
            // marking the list detached), so a detached list gets no new entry.
            if st.removed || st.stream.is_none() {
                return;
            }
            st.cache_entries += 1;
        }
        self.streams.insert(
            0,
            StreamCache {
                id: list.id,
                list: Arc::downgrade(list),
                bins: Vec::new(),
                bytes: 0,
                allocations: 0,
                frees: 0,
                in_use: 0,
                unflushed: 0,
            },
        );
    }

    /// Moves the blocks and counters of every entry `which` accepts to their lists.
    pub(super) fn retire(&mut self, which: impl Fn(StreamId) -> bool) {
        let mut i = 0;
        while i < self.streams.len() {
            if which(self.streams[i].id) {
                self.streams.remove(i).retire();
            } else {
                i += 1;
            }
        }
    }

    /// Forgets everything without touching the lists (the pool is being dropped).
    pub(super) fn kill(&mut self) {
        self.dead = true;
        self.streams.clear();
    }
}

/// One thread's cache for one pool. The pool's registry and the thread (through
/// [`CacheOwner`]) each hold it.
pub(crate) struct ThreadCache<S: StreamOrder> {
    state: Mutex<CacheState<S>>,
    /// Set once its thread has let it go (and flushed it): the registry may forget it.
    orphan: AtomicBool,
}

impl<S: StreamOrder> ThreadCache<S> {
    /// An empty cache.
    pub(super) fn new() -> Self {
        ThreadCache {
            state: Mutex::new(CacheState {
                dead: false,
                streams: Vec::new(),
            }),
            orphan: AtomicBool::new(false),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, CacheState<S>> {
        lock(&self.state)
    }

    /// Whether its thread has let it go.
    pub(super) fn is_orphan(&self) -> bool {
        self.orphan.load(Ordering::Relaxed)
    }
}

/// The thread's hold on its cache, kept in the thread's `local` entry for the pool. Dropped
/// when the thread exits (or forgets the pool): the blocks go back to their lists.
pub(crate) struct CacheOwner<S: StreamOrder>(pub(super) Arc<ThreadCache<S>>);

impl<S: StreamOrder> Drop for CacheOwner<S> {
    /// Only lists are touched, under this cache's lock, and never dropped here: while the
    /// cache is not dead the pool is not dropping (its `Drop` marks every registered cache
    /// dead, under the same lock, before it lets its lists go), and a list with cache
    /// entries is never pruned; so each list is still in the pool's map.
    fn drop(&mut self) {
        let mut st = self.0.lock();
        if !st.dead {
            st.retire(|_| true);
        }
        self.0.orphan.store(true, Ordering::Relaxed);
    }
}
