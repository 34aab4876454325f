//! Where the pool gets its memory from: the [`Upstream`] trait and the plain host upstream.
//!
//! Device memory (`cuMemAlloc`) and pinned host memory (`cuMemHostAlloc`) upstreams live with
//! the CUDA implementation (see `memory/cuda.rs`); this file holds the trait and
//! [`HostUpstream`], which uses the Rust global allocator and is what the tests run on.

use std::alloc::Layout;
use std::fmt;

use crate::error::{Error, Result};

/// What kind of memory an upstream hands out (for messages and statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// GPU memory (`cuMemAlloc`); not addressable from the host.
    Device,
    /// Page-locked host memory (`cuMemHostAlloc`); addressable from host and device.
    Pinned,
    /// Ordinary pageable host memory.
    Host,
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemoryKind::Device => "device",
            MemoryKind::Pinned => "pinned host",
            MemoryKind::Host => "host",
        })
    }
}

/// A source of large chunks of memory for a [`PoolResource`](super::PoolResource).
///
/// The pool asks for few, large chunks (see `PoolOptions::grow_bytes`) and returns each one
/// exactly once, when the pool is dropped. It never holds one of its own locks while calling
/// an upstream, so an upstream may block (as `cuMemAlloc` does).
pub trait Upstream: Send + Sync {
    /// The kind of memory handed out.
    fn kind(&self) -> MemoryKind;

    /// Allocates `bytes` bytes (never 0) whose address is a multiple of `align` (a power of
    /// two). Returns the address. Running out of memory is [`Error::OutOfMemory`].
    fn allocate(&self, bytes: usize, align: usize) -> Result<usize>;

    /// Returns a chunk.
    ///
    /// # Safety
    /// `addr` must have been returned by [`allocate`](Upstream::allocate) on this upstream
    /// with the same `bytes` and `align`, not returned before, and nothing may use the memory
    /// afterwards (for device memory: no pending device work either).
    unsafe fn deallocate(&self, addr: usize, bytes: usize, align: usize) -> Result<()>;
}

/// Plain host memory from the Rust global allocator, aligned as asked.
///
/// Used by the tests and the host-side benchmark; real workloads use device or pinned memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostUpstream;

impl HostUpstream {
    fn layout(bytes: usize, align: usize) -> Result<Layout> {
        Layout::from_size_align(bytes, align).map_err(|e| {
            Error::InvalidArgument(format!(
                "host allocation of {bytes} bytes aligned to {align}: {e}"
            ))
        })
    }
}

impl Upstream for HostUpstream {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<usize> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "host upstream asked for 0 bytes".to_string(),
            ));
        }
        let layout = Self::layout(bytes, align)?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory(format!(
                "host allocator refused {bytes} bytes aligned to {align}"
            )));
        }
        Ok(ptr as usize)
    }

    unsafe fn deallocate(&self, addr: usize, bytes: usize, align: usize) -> Result<()> {
        let layout = Self::layout(bytes, align)?;
        // SAFETY: the caller guarantees `addr` came from `allocate` with this size and
        // alignment (hence this layout) and is returned once.
        unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_upstream_aligns_and_returns() {
        let up = HostUpstream;
        for align in [8usize, 256, 4096] {
            let addr = up.allocate(1000, align).unwrap();
            assert_eq!(addr % align, 0, "aligned to {align}");
            // SAFETY: just allocated with the same size and alignment.
            unsafe { up.deallocate(addr, 1000, align).unwrap() };
        }
    }

    #[test]
    fn host_upstream_rejects_bad_requests() {
        assert!(matches!(
            HostUpstream.allocate(0, 8),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            HostUpstream.allocate(8, 3),
            Err(Error::InvalidArgument(_))
        ));
    }
}
