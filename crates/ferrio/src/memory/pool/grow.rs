//! The pool's upstream side: taking chunks from the upstream under the limit (one grower at a
//! time, the bytes reserved before the call), and the fresh list where the rest of a new chunk
//! waits for any stream. It may not touch the streams' own lists, only the fresh one.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::blocks::{Chunk, FreeBlock};
use super::super::order::{StreamId, StreamOrder};
use super::super::stream_list::StreamList;
use super::super::upstream::Upstream;
use super::{read, write, Block, PoolResource};
use crate::error::{Error, Result};

/// Why the pool could not grow.
pub(super) enum NoGrowth {
    Limit,
    Upstream(Error),
}

impl<U: Upstream, S: StreamOrder> PoolResource<U, S> {
    /// Hands out the last `bytes` of `b`, a chunk just grown, on `own` and puts the rest in
    /// the fresh list, where every stream takes from it without ordering. Kept out of the
    /// grower's own list so that the grower's frees never merge into it: a merged block would
    /// carry the grower's `seq`, and the next stream to take from it would have to wait on
    /// the device for the grower's work.
    pub(super) fn place_grown(
        &self,
        own: &StreamList<S>,
        b: FreeBlock,
        bytes: usize,
    ) -> Result<Block> {
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
    pub(super) fn add_fresh(&self, b: FreeBlock) -> Result<()> {
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

    /// Takes a new chunk of at least `bytes` from the upstream: `grow_bytes` if that fits
    /// under the limit, else what room is left, else exactly `bytes`.
    pub(super) fn grow(&self, bytes: usize) -> Result<Chunk, NoGrowth> {
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
    pub(super) fn grow_exactly(&self, bytes: usize) -> Result<Chunk, NoGrowth> {
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
}
