//! Direct-I/O facts: the alignment a file needs for `O_DIRECT`, and how much of a range the page
//! cache holds. Whether a task uses `O_DIRECT` is decided by [`crate::policy`], not here.
//!
//! Alignment comes from the file system, not a constant: `statx(STATX_DIOALIGN)` where the
//! kernel has it, else the device's logical block size from sysfs, else the page size. The
//! page cache is asked through `cachestat(2)`, else `mincore`.

use std::os::fd::BorrowedFd;

use crate::sys;

/// How `O_DIRECT` can be used on one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectSupport {
    /// `O_DIRECT` works with these alignments.
    Available {
        /// Required alignment of memory addresses, in bytes.
        mem_align: u32,
        /// Required alignment of file offsets and lengths, in bytes.
        offset_align: u32,
        /// Where the alignment came from: `statx`, `sysfs` or `page size`.
        source: &'static str,
    },
    /// `O_DIRECT` cannot be used; every byte goes through the page cache.
    Unsupported {
        /// Why (the file system refused it, or it was turned off for this file).
        reason: String,
    },
}

impl DirectSupport {
    /// Whether `O_DIRECT` can be used.
    pub fn is_available(&self) -> bool {
        matches!(self, DirectSupport::Available { .. })
    }
}

impl std::fmt::Display for DirectSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirectSupport::Available { mem_align, offset_align, source } => write!(
                f,
                "yes (file offsets aligned to {offset_align} B, memory to {mem_align} B; from {source})"
            ),
            DirectSupport::Unsupported { reason } => write!(f, "no ({reason})"),
        }
    }
}

/// Finds the alignment for an `O_DIRECT` descriptor `fd` of a file on device `dev`.
pub(crate) fn discover(fd: BorrowedFd<'_>, dev: libc::dev_t) -> DirectSupport {
    if let Some((mem, off)) = sys::dio_align(fd) {
        return DirectSupport::Available {
            mem_align: mem,
            offset_align: off,
            source: "statx",
        };
    }
    if let Some(lbs) = logical_block_size(dev) {
        return DirectSupport::Available {
            mem_align: lbs,
            offset_align: lbs,
            source: "sysfs",
        };
    }
    let page = sys::page_size() as u32;
    DirectSupport::Available {
        mem_align: page,
        offset_align: page,
        source: "page size",
    }
}

/// `queue/logical_block_size` of the device (or, for a partition, of its disk).
fn logical_block_size(dev: libc::dev_t) -> Option<u32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return None;
    }
    let base = format!("/sys/dev/block/{major}:{minor}");
    for p in [
        format!("{base}/queue/logical_block_size"),
        format!("{base}/../queue/logical_block_size"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&p) {
            if let Ok(v) = s.trim().parse::<u32>() {
                if v.is_power_of_two() {
                    return Some(v);
                }
            }
        }
    }
    None
}

/// A task counts as cached when at least this share of it is resident.
pub(crate) const AUTO_RESIDENT_SHARE: f64 = 0.5;

/// What three one-page probes of a range found in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The first, middle and last page are all cached.
    Cached,
    /// None of them is.
    Cold,
    /// Some are, or the kernel cannot say cheaply: count the whole range.
    Mixed,
}

/// Probes the first, middle and last page of `[offset, offset+len)`. Counting a whole 4 MiB
/// range costs the kernel a walk over up to 1024 cache entries per task, which on the H200 cut
/// hot file-to-GPU rates by about 40% and doubled their CPU time (benchmarks/RESULTS.md); three
/// one-page questions cost almost nothing, and ranges are rarely half cached.
pub(crate) fn probe(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Probe {
    if len == 0 {
        return Probe::Cached;
    }
    let page = sys::page_size() as u64;
    let mut cached = 0;
    for p in [offset, offset + len / 2, offset + len - 1] {
        match sys::cachestat(fd, p / page * page, page) {
            Ok(cs) if cs.cached > 0 => cached += 1,
            Ok(_) => {}
            // No cachestat (kernels before 6.5): count the range with the fallback.
            Err(_) => return Probe::Mixed,
        }
    }
    match cached {
        0 => Probe::Cold,
        3 => Probe::Cached,
        _ => Probe::Mixed,
    }
}

/// Share (0..=1) of `[offset, offset+len)` in the page cache; `None` if the kernel cannot say.
pub(crate) fn resident_share(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Option<f64> {
    if len == 0 {
        return Some(1.0);
    }
    let page = sys::page_size() as u64;
    let first = offset / page;
    let pages = (offset + len).div_ceil(page) - first;
    let cached = match sys::cachestat(fd, offset, len) {
        Ok(cs) => cs.cached,
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            let size = sys::fstat(fd).ok()?.st_size as u64;
            let end = (offset + len).min(size);
            if end <= offset {
                return Some(1.0);
            }
            sys::mincore_resident(fd, offset, end - offset).ok()?
        }
        Err(_) => return None,
    };
    Some(cached as f64 / pages as f64)
}
