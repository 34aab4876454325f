//! Indexed free blocks of one stream, and the table of upstream chunks.
//!
//! Pure data structures: no locks, no streams, no upstream calls. A [`FreeBlocks`] finds the
//! best fit in O(log n) through an index by `(size, addr)` and its neighbours through an
//! index by `addr`; it merges a freed block with its neighbours only when they came from the
//! same upstream chunk, so a chunk can always be handed back to the upstream whole.

use std::collections::{BTreeMap, BTreeSet};

/// Which upstream allocation a block lies in. Never reused within a pool.
pub(crate) type ChunkId = u64;

/// A free range of pool memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FreeBlock {
    /// First byte.
    pub addr: usize,
    /// Length in bytes (a multiple of the pool's alignment).
    pub size: usize,
    /// The chunk the block lies in.
    pub chunk: ChunkId,
    /// The owning list's free counter when the block was freed: an event recorded on the
    /// owning stream when the counter was `>= seq` orders every stream after this free.
    pub seq: u64,
}

impl FreeBlock {
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.addr + self.size
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    size: usize,
    chunk: ChunkId,
    seq: u64,
}

/// A freed range overlaps one that is already free: a double free or a wrong size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overlap {
    /// The free block it collides with.
    pub addr: usize,
    /// Its size.
    pub size: usize,
}

/// The free blocks of one stream.
#[derive(Debug, Default)]
pub(crate) struct FreeBlocks {
    by_addr: BTreeMap<usize, Entry>,
    by_size: BTreeSet<(usize, usize)>,
    bytes: usize,
}

impl FreeBlocks {
    /// Number of free blocks.
    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    /// Total free bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Size of the largest block (0 if none).
    pub fn largest(&self) -> usize {
        self.by_size.last().map_or(0, |&(size, _)| size)
    }

    fn remove(&mut self, addr: usize) -> Option<FreeBlock> {
        let e = self.by_addr.remove(&addr)?;
        self.by_size.remove(&(e.size, addr));
        self.bytes -= e.size;
        Some(FreeBlock {
            addr,
            size: e.size,
            chunk: e.chunk,
            seq: e.seq,
        })
    }

    fn put(&mut self, b: FreeBlock) {
        self.by_addr.insert(
            b.addr,
            Entry {
                size: b.size,
                chunk: b.chunk,
                seq: b.seq,
            },
        );
        self.by_size.insert((b.size, b.addr));
        self.bytes += b.size;
    }

    /// Adds a free block, merging it with free neighbours of the same chunk. The merged
    /// block keeps the newest `seq` of its parts, so it is handed to another stream only
    /// once all of them are ordered.
    pub fn insert(&mut self, b: FreeBlock) -> Result<(), Overlap> {
        debug_assert!(b.size > 0);
        let left = self
            .by_addr
            .range(..=b.addr)
            .next_back()
            .map(|(&a, e)| (a, *e));
        let right = self.by_addr.range(b.addr..).next().map(|(&a, e)| (a, *e));
        if let Some((a, e)) = left {
            if a + e.size > b.addr {
                return Err(Overlap {
                    addr: a,
                    size: e.size,
                });
            }
        }
        if let Some((a, e)) = right {
            if b.end() > a {
                return Err(Overlap {
                    addr: a,
                    size: e.size,
                });
            }
        }
        let merge_left = left.filter(|(a, e)| a + e.size == b.addr && e.chunk == b.chunk);
        let merge_right = right.filter(|(a, e)| b.end() == *a && e.chunk == b.chunk);
        let (right_size, right_seq) = match merge_right {
            Some((a, e)) => {
                self.by_addr.remove(&a);
                self.by_size.remove(&(e.size, a));
                self.bytes -= e.size;
                (e.size, e.seq)
            }
            None => (0, 0),
        };
        match merge_left {
            // Grow the left neighbour in place: its address key stays.
            Some((a, e)) => {
                let size = e.size + b.size + right_size;
                self.by_size.remove(&(e.size, a));
                self.by_size.insert((size, a));
                if let Some(entry) = self.by_addr.get_mut(&a) {
                    entry.size = size;
                    entry.seq = e.seq.max(b.seq).max(right_seq);
                }
                self.bytes += b.size + right_size;
            }
            None => self.put(FreeBlock {
                size: b.size + right_size,
                seq: b.seq.max(right_seq),
                ..b
            }),
        }
        Ok(())
    }

    /// Cuts `size` bytes from the end of the smallest block of at least `size` bytes and
    /// returns them; the front of the block stays free under the same key (one index update
    /// instead of a remove and an insert in each index).
    pub fn carve_best_fit(&mut self, size: usize) -> Option<FreeBlock> {
        let &(_, addr) = self.by_size.range((size, 0)..).next()?;
        self.carve(addr, size)
    }

    /// Cuts `size` bytes from the end of the free block at `addr` (which must hold at least
    /// `size` bytes) and returns them; the front stays free with its `seq`.
    pub fn carve(&mut self, addr: usize, size: usize) -> Option<FreeBlock> {
        let found = self.by_addr.get(&addr)?.size;
        if found < size {
            return None;
        }
        if found == size {
            return self.remove(addr);
        }
        let rest = found - size;
        let entry = self.by_addr.get_mut(&addr)?;
        entry.size = rest;
        let cut = FreeBlock {
            addr: addr + rest,
            size,
            chunk: entry.chunk,
            seq: entry.seq,
        };
        self.by_size.remove(&(found, addr));
        self.by_size.insert((rest, addr));
        self.bytes -= size;
        Some(cut)
    }

    /// The address of the smallest block of at least `size` bytes with `seq <= max_seq`,
    /// looking at no more than `probes` candidates.
    pub fn find_fit_before(&self, size: usize, max_seq: u64, probes: usize) -> Option<usize> {
        self.by_size
            .range((size, 0)..)
            .take(probes)
            .map(|&(_, addr)| addr)
            .find(|addr| self.by_addr.get(addr).is_some_and(|e| e.seq <= max_seq))
    }

    /// The newest `seq` among the blocks (0 if none).
    pub fn newest_seq(&self) -> u64 {
        self.by_addr.values().map(|e| e.seq).max().unwrap_or(0)
    }

    /// Removes every block.
    pub fn drain(&mut self) -> Vec<FreeBlock> {
        self.by_size.clear();
        self.bytes = 0;
        std::mem::take(&mut self.by_addr)
            .into_iter()
            .map(|(addr, e)| FreeBlock {
                addr,
                size: e.size,
                chunk: e.chunk,
                seq: e.seq,
            })
            .collect()
    }

    /// The blocks in address order.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = FreeBlock> + '_ {
        self.by_addr.iter().map(|(&addr, e)| FreeBlock {
            addr,
            size: e.size,
            chunk: e.chunk,
            seq: e.seq,
        })
    }
}

/// One upstream allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// Never reused within a pool.
    pub id: ChunkId,
    /// Address returned by the upstream.
    pub addr: usize,
    /// Bytes asked of the upstream.
    pub size: usize,
}

impl Chunk {
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.addr + self.size
    }
}

/// Every chunk of a pool, sorted by address. Replaced as a whole (copy on write) when the pool
/// grows, so readers can keep a snapshot without a lock.
#[derive(Clone, Debug, Default)]
pub(crate) struct ChunkTable {
    chunks: Vec<Chunk>,
}

impl ChunkTable {
    /// A new table with `chunk` added.
    pub fn with(&self, chunk: Chunk) -> ChunkTable {
        let mut chunks = self.chunks.clone();
        let at = chunks.partition_point(|c| c.addr < chunk.addr);
        chunks.insert(at, chunk);
        ChunkTable { chunks }
    }

    /// The chunk that holds all of `[addr, addr + size)`, if one does.
    pub fn find(&self, addr: usize, size: usize) -> Option<&Chunk> {
        let i = self
            .chunks
            .partition_point(|c| c.addr <= addr)
            .checked_sub(1)?;
        let c = &self.chunks[i];
        (addr.checked_add(size)? <= c.end()).then_some(c)
    }

    /// The chunks in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Chunk> + '_ {
        self.chunks.iter()
    }

    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(addr: usize, size: usize, chunk: ChunkId, seq: u64) -> FreeBlock {
        FreeBlock {
            addr,
            size,
            chunk,
            seq,
        }
    }

    #[test]
    fn merges_neighbours_of_one_chunk_only() {
        let mut f = FreeBlocks::default();
        f.insert(b(0, 100, 1, 1)).unwrap();
        f.insert(b(200, 100, 1, 2)).unwrap();
        // Chunk 2 starts right where chunk 1's last block ends: not merged.
        f.insert(b(300, 50, 2, 3)).unwrap();
        assert_eq!(f.len(), 3);
        f.insert(b(100, 100, 1, 4)).unwrap();
        let all: Vec<_> = f.iter().collect();
        assert_eq!(all, vec![b(0, 300, 1, 4), b(300, 50, 2, 3)]);
        assert_eq!(f.bytes(), 350);
        assert_eq!(f.largest(), 300);
    }

    #[test]
    fn carve_cuts_from_the_end_of_the_best_fit() {
        let mut f = FreeBlocks::default();
        f.insert(b(0, 1024, 1, 3)).unwrap();
        f.insert(b(4096, 512, 1, 4)).unwrap();
        assert_eq!(f.carve_best_fit(256), Some(b(4096 + 256, 256, 1, 4)));
        assert_eq!(f.carve_best_fit(256), Some(b(4096, 256, 1, 4)));
        assert_eq!(f.carve_best_fit(768), Some(b(256, 768, 1, 3)));
        assert_eq!(f.bytes(), 256);
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![b(0, 256, 1, 3)]);
        assert_eq!(f.carve_best_fit(512), None);
        // Freed again, the pieces merge back into one block.
        f.insert(b(256, 768, 1, 9)).unwrap();
        assert_eq!(f.iter().collect::<Vec<_>>(), vec![b(0, 1024, 1, 9)]);
        assert_eq!(f.largest(), 1024);
    }

    #[test]
    fn detects_overlap() {
        let mut f = FreeBlocks::default();
        f.insert(b(100, 100, 1, 1)).unwrap();
        assert_eq!(
            f.insert(b(150, 10, 1, 2)),
            Err(Overlap {
                addr: 100,
                size: 100
            })
        );
        assert!(f.insert(b(50, 51, 1, 2)).is_err());
        assert!(f.insert(b(199, 2, 1, 2)).is_err());
        assert!(f.insert(b(100, 100, 1, 2)).is_err());
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn best_fit_prefers_smallest_then_lowest() {
        let mut f = FreeBlocks::default();
        f.insert(b(0, 512, 1, 1)).unwrap();
        f.insert(b(1024, 256, 1, 1)).unwrap();
        f.insert(b(2048, 256, 1, 1)).unwrap();
        assert_eq!(f.carve_best_fit(256), Some(b(1024, 256, 1, 1)));
        assert_eq!(f.carve_best_fit(300), Some(b(212, 300, 1, 1)));
        assert_eq!(f.carve_best_fit(300), None);
        assert_eq!(f.carve_best_fit(212), Some(b(0, 212, 1, 1)));
        assert_eq!(f.carve_best_fit(1), Some(b(2303, 1, 1, 1)));
    }

    #[test]
    fn fit_before_skips_newer_blocks() {
        let mut f = FreeBlocks::default();
        f.insert(b(0, 256, 1, 5)).unwrap();
        f.insert(b(1024, 512, 1, 2)).unwrap();
        assert_eq!(f.find_fit_before(100, 3, 8), Some(1024));
        assert_eq!(
            f.find_fit_before(100, 3, 1),
            None,
            "probes bound the search"
        );
        assert_eq!(
            f.carve(1024, 256),
            Some(b(1280, 256, 1, 2)),
            "cut from the end"
        );
        assert_eq!(f.carve(1024, 512), None, "only 256 bytes left there");
        assert_eq!(f.carve(1000, 1), None, "no block at that address");
        assert_eq!(
            f.find_fit_before(100, 3, 8),
            Some(1024),
            "the front keeps its seq"
        );
        assert_eq!(f.carve(1024, 256), Some(b(1024, 256, 1, 2)));
        assert_eq!(f.find_fit_before(100, 3, 8), None);
        assert_eq!(f.bytes(), 256);
        assert_eq!(f.newest_seq(), 5);
    }

    #[test]
    fn chunk_table_finds_containing_chunk() {
        let t = ChunkTable::default()
            .with(Chunk {
                id: 2,
                addr: 1000,
                size: 100,
            })
            .with(Chunk {
                id: 1,
                addr: 0,
                size: 100,
            });
        assert_eq!(t.find(0, 100).map(|c| c.id), Some(1));
        assert_eq!(t.find(1050, 50).map(|c| c.id), Some(2));
        assert_eq!(t.find(1050, 51), None);
        assert_eq!(t.find(100, 1), None);
        assert_eq!(t.find(usize::MAX, 2), None);
        assert_eq!(t.len(), 2);
    }

    proptest! {
        /// Freeing every piece of a chunk set, in any order, gives back exactly the chunks.
        #[test]
        fn any_free_order_coalesces_to_chunks(
            pieces in proptest::collection::vec(1usize..8, 1..40),
            cut in 1usize..40,
            order in proptest::collection::vec(any::<u32>(), 40),
        ) {
            // Pieces laid end to end; a chunk boundary after piece `cut`.
            let cut = cut.min(pieces.len());
            let mut blocks = Vec::new();
            let mut addr = 0;
            for (i, &p) in pieces.iter().enumerate() {
                let chunk = if i < cut { 1 } else { 2 };
                blocks.push(b(addr, p * 16, chunk, i as u64));
                addr += p * 16;
            }
            let total = addr;
            let boundary: usize = pieces[..cut].iter().sum::<usize>() * 16;
            let mut keyed: Vec<_> = blocks.into_iter().zip(order.iter().copied()).collect();
            keyed.sort_by_key(|(_, k)| *k);
            let mut f = FreeBlocks::default();
            for (blk, _) in keyed {
                f.insert(blk).unwrap();
            }
            let got: Vec<(usize, usize, ChunkId)> = f.iter().map(|x| (x.addr, x.size, x.chunk)).collect();
            let mut want = vec![(0, boundary, 1)];
            if boundary < total {
                want.push((boundary, total - boundary, 2));
            }
            prop_assert_eq!(got, want);
            prop_assert_eq!(f.bytes(), total);
        }
    }
}
