//! Direct-I/O facts: the alignment a file needs for `O_DIRECT`, and how much of a range the page
//! cache holds. Whether a task uses `O_DIRECT` is decided by [`crate::policy`], not here.
//!
//! Alignment comes from the file system, not a constant: `statx(STATX_DIOALIGN)` where the
//! kernel has it, else the device's logical block size from sysfs, else the page size. The
//! page cache is asked through `cachestat(2)`, else `mincore`. [`measure_writes`] times a
//! device's buffered writes against its direct ones, for the write policy.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::buffer::AlignedBuf;
use crate::policy::WriteProbe;
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

/// Finds the alignment `O_DIRECT` transfers of the file open as `fd` (on device `dev`) need; `fd`
/// itself need not be opened `O_DIRECT` (`statx` reports it for the file).
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

/// Bytes of one write of [`measure_writes`]; each way is timed over [`WRITE_PROBE_ROUNDS`] of
/// them, so the probe writes 16 MiB in all (half of it to the device).
const WRITE_PROBE_BYTES: usize = 4 << 20;

/// Writes of each kind in [`measure_writes`], alternating.
const WRITE_PROBE_ROUNDS: u64 = 2;

/// Times writes through the page cache against `O_DIRECT` writes on the file system of
/// directory `dir`, which must be on device `dev` (that of the file the verdict is for), in an
/// unnamed temporary file (`O_TMPFILE`: nothing is left behind, and its cached pages are
/// dropped unwritten when it is closed). The space is allocated first, as a direct write that
/// extends a file does (`File::extend_for_direct_write`). `None` where the file system has no
/// `O_TMPFILE` or no direct I/O, is full, or is another device's.
pub(crate) fn measure_writes(dir: &Path, dev: libc::dev_t) -> Option<WriteProbe> {
    let fd = sys::open(dir, libc::O_TMPFILE | libc::O_RDWR, 0o600).ok()?;
    let fd = fd.as_fd();
    if sys::fstat(fd).ok()?.st_dev != dev {
        return None;
    }
    let total = WRITE_PROBE_BYTES as u64 * WRITE_PROBE_ROUNDS * 2;
    sys::fallocate(fd, 0, total).ok()?;
    let align = sys::dio_align(fd).map_or(sys::page_size(), |(mem, _)| mem as usize);
    let mut buf = AlignedBuf::new(WRITE_PROBE_BYTES, align.max(sys::page_size()))?;
    // Fault the source in before any clock runs.
    buf.as_mut_slice().fill(0x5a);
    let mut times = [Duration::ZERO; 2];
    for round in 0..WRITE_PROBE_ROUNDS * 2 {
        let direct = round % 2 == 1;
        sys::set_direct(fd, direct).ok()?;
        let started = Instant::now();
        // SAFETY: `buf` holds WRITE_PROBE_BYTES initialised bytes and outlives the call.
        unsafe { sys::pwrite_full(fd, buf.as_mut_ptr(), WRITE_PROBE_BYTES, round * WRITE_PROBE_BYTES as u64) }
            .ok()?;
        times[direct as usize] += started.elapsed();
    }
    let rate = |t: Duration| (WRITE_PROBE_BYTES as u64 * WRITE_PROBE_ROUNDS) as f64 / t.as_secs_f64().max(1e-9);
    Some(WriteProbe {
        buffered: rate(times[0]),
        direct: rate(times[1]),
    })
}
