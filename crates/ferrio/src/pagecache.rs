//! The page cache: how much of a file is resident, dropping one file's pages, dropping the
//! whole system cache.

use std::os::fd::AsFd;
use std::path::Path;

use crate::error::{Error, Op, Result};
use crate::sys;

/// Page-cache residency of a file range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Residency {
    /// Bytes of the range (clipped to the file) that are in the page cache, in whole pages.
    pub cached_bytes: u64,
    /// Cached bytes that are dirty (written, not yet on the device).
    pub dirty_bytes: u64,
    /// Bytes in the range, clipped to the file's size.
    pub range_bytes: u64,
}

impl Residency {
    /// Share of the range that is cached, 0..=1 (1 for an empty range).
    pub fn share(&self) -> f64 {
        if self.range_bytes == 0 {
            1.0
        } else {
            (self.cached_bytes as f64 / self.range_bytes as f64).min(1.0)
        }
    }
}

/// Opens `path` to read, refusing at once what is not a regular file or block device (a FIFO's
/// plain `open` would wait for a writer).
fn open_read(path: &Path) -> Result<std::fs::File> {
    crate::file::open_checked(path, libc::O_RDONLY | libc::O_CLOEXEC)
        .map(std::fs::File::from)
        .map_err(|source| Error::Open {
            path: path.to_path_buf(),
            mode: "r".into(),
            source,
        })
}

/// Residency of `[offset, offset+len)` of the file at `path` (`len` None: to end of file),
/// from `cachestat(2)` where the kernel has it, else `mmap` + `mincore`.
pub fn residency(path: &Path, offset: u64, len: Option<u64>) -> Result<Residency> {
    let f = open_read(path)?;
    let meta = f
        .metadata()
        .map_err(|e| Error::io(Op::Stat, path, 0, 0, e))?;
    // `fstat` says 0 bytes for a block device; the device says how much it holds.
    let size = if std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()) {
        sys::block_device_size(f.as_fd()).map_err(|e| Error::io(Op::Stat, path, 0, 0, e))?
    } else {
        meta.len()
    };
    let end = len.map_or(size, |l| offset.saturating_add(l).min(size));
    let range_bytes = end.saturating_sub(offset);
    if range_bytes == 0 {
        return Ok(Residency {
            cached_bytes: 0,
            dirty_bytes: 0,
            range_bytes: 0,
        });
    }
    let page = sys::page_size() as u64;
    let fd = f.as_fd();
    let io_err = |e| Error::io(Op::PageCache, path, offset, range_bytes, e);
    let (cached_pages, dirty_pages) = match sys::cachestat(fd, offset, range_bytes) {
        Ok(cs) => (cs.cached, cs.dirty),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => (
            sys::mincore_resident(fd, offset, range_bytes).map_err(io_err)?,
            0,
        ),
        Err(e) => return Err(io_err(e)),
    };
    Ok(Residency {
        cached_bytes: (cached_pages * page).min(range_bytes),
        dirty_bytes: (dirty_pages * page).min(range_bytes),
        range_bytes,
    })
}

/// Drops the file's pages from the page cache: flushes dirty pages (`fdatasync`), then
/// `POSIX_FADV_DONTNEED`. Needs no privileges. Pages mapped or locked by a process may stay.
pub fn drop_file(path: &Path) -> Result<()> {
    let f = open_read(path)?;
    match sys::fdatasync(f.as_fd()) {
        // A file that cannot be synced (procfs makes its content up) has nothing to write back.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        other => other.map_err(|e| Error::io(Op::Sync, path, 0, 0, e))?,
    }
    sys::fadvise_dontneed(f.as_fd(), 0, 0).map_err(|e| Error::io(Op::PageCache, path, 0, 0, e))
}

/// Drops the whole system's clean page cache (`sync`, then `3` into `/proc/sys/vm/drop_caches`).
/// Needs root; fails with a permission error otherwise.
pub fn drop_system_cache() -> Result<()> {
    sys::sync();
    let path = Path::new("/proc/sys/vm/drop_caches");
    std::fs::write(path, b"3\n").map_err(|e| Error::io(Op::PageCache, path, 0, 2, e))
}
