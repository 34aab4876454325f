//! Every raw syscall ferrio makes, wrapped so that callers get `io::Result` and never see `errno`.
//!
//! This module owns file descriptors' syscalls (open, fcntl, pread/pwrite loops, statx,
//! cachestat, fadvise, mincore, sync, the block-device size ioctl), the id of the running
//! process, and NUMA placement and CPU affinity (`numa.rs`). Nothing here knows about tasks, pools or settings.

mod copy;
pub mod numa;
mod process;
pub(crate) mod statfs;

pub use copy::{
    copy_file_range, copy_unsupported, futimens, lutimens, seek_data, seek_hole, umask, Timestamp,
};
pub use process::process_id;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `open(2)` with `O_CLOEXEC` added; retried on `EINTR`.
pub fn open(path: &Path, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    loop {
        // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
        match cvt(fd) {
            // SAFETY: `fd` was just returned by open(2) and is owned by nobody else.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `fstat(2)`.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value for this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the duration of the call and `st` is writable.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// Reads into `buf` at `offset` until it is full or end of file; retries `EINTR` and partial
/// reads. Returns the bytes read (short only at end of file).
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes for the whole call.
pub unsafe fn pread_full(
    fd: BorrowedFd<'_>,
    buf: *mut u8,
    len: usize,
    offset: u64,
) -> io::Result<usize> {
    // SAFETY: forwarded from this function's contract.
    let (done, outcome) = unsafe { pread_until(fd, buf, len, offset, |_| false) };
    outcome.map(|()| done)
}

/// Reads into `buf` at `offset` through a descriptor opened with `O_DIRECT`: as [`pread_full`],
/// but it also stops where a transfer ends at an offset that is not a multiple of `align`
/// (the file's last partial block, or a file system that splits transfers), because a direct
/// read cannot go on from there. Returns the bytes read, and how it stopped: `Ok` when full, at
/// end of file or at such an offset; the error otherwise (the bytes read before it are counted).
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes for the whole call.
pub unsafe fn pread_direct(
    fd: BorrowedFd<'_>,
    buf: *mut u8,
    len: usize,
    offset: u64,
    align: u64,
) -> (usize, io::Result<()>) {
    let align = align.max(1);
    // SAFETY: forwarded from this function's contract.
    unsafe { pread_until(fd, buf, len, offset, |at| at % align != 0) }
}

/// The `pread` loop under [`pread_full`] and [`pread_direct`]: reads until `buf` is full, end of
/// file, an error, or `stop(file offset reached)` says so after a transfer. Returns the bytes
/// read and the error that ended it, if any.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes for the whole call.
unsafe fn pread_until(
    fd: BorrowedFd<'_>,
    buf: *mut u8,
    len: usize,
    offset: u64,
    stop: impl Fn(u64) -> bool,
) -> (usize, io::Result<()>) {
    let mut done = 0usize;
    while done < len {
        let want = (len - done).min(MAX_IO);
        // SAFETY: the caller guarantees `buf..buf+len` is writable; `done + want <= len`.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf.add(done).cast(),
                want,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return (done, Err(e));
        }
        if n == 0 {
            break;
        }
        done += n as usize;
        if done < len && stop(offset + done as u64) {
            break;
        }
    }
    (done, Ok(()))
}

/// Writes all of `buf` at `offset`; retries `EINTR` and partial writes.
///
/// # Safety
/// `buf` must be valid for reads of `len` bytes for the whole call.
pub unsafe fn pwrite_full(
    fd: BorrowedFd<'_>,
    buf: *const u8,
    len: usize,
    offset: u64,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let want = (len - done).min(MAX_IO);
        // SAFETY: the caller guarantees `buf..buf+len` is readable; `done + want <= len`.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                buf.add(done).cast(),
                want,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write returned 0 bytes",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Linux transfers at most this much in one read/write call.
const MAX_IO: usize = 0x7fff_f000;

/// Direct-I/O alignment the file system reports through `statx(STATX_DIOALIGN)`:
/// `(memory alignment, file offset alignment)`, or `None` where the kernel or file system does
/// not say (or says direct I/O is unsupported).
pub fn dio_align(fd: BorrowedFd<'_>) -> Option<(u32, u32)> {
    // SAFETY: an all-zero `statx` is a valid value for this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: `fd` is open, the path is an empty C string used with AT_EMPTY_PATH, `stx` is
    // writable.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if r != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    if stx.stx_dio_mem_align == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

/// Page-cache state of a file range, in pages, from `cachestat(2)` (Linux 6.5+).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages of the range in the page cache.
    pub cached: u64,
    /// Cached pages that are dirty.
    pub dirty: u64,
    /// Pages under writeback.
    pub writeback: u64,
}

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct RawCachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// The `cachestat` syscall number: the same on every architecture that has it (generic table).
const SYS_CACHESTAT: libc::c_long = 451;

/// `cachestat(2)` of `[offset, offset+len)`; `ENOSYS` on kernels before 6.5.
pub fn cachestat(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<CacheStat> {
    let range = CachestatRange { off: offset, len };
    let mut out = RawCachestat::default();
    // SAFETY: both structs match the kernel's layout (five/two u64s) and outlive the call.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut RawCachestat,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(CacheStat {
        cached: out.nr_cache,
        dirty: out.nr_dirty,
        writeback: out.nr_writeback,
    })
}

/// Counts the resident pages of `[offset, offset+len)` with `mmap` + `mincore` (the fallback for
/// kernels without `cachestat`). The range must lie inside the file.
pub fn mincore_resident(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let page = page_size() as u64;
    let start = offset / page * page;
    let map = FileMapping::new(fd, start, (offset + len - start) as usize)?;
    let mut vec = vec![0u8; map.len.div_ceil(page as usize)];
    // SAFETY: `map` is our mapping and `vec` has one byte per page of it.
    if unsafe { libc::mincore(map.addr, map.len, vec.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64)
}

/// A read-only shared mapping of `len` bytes of a file from `offset` (page-aligned), unmapped on
/// drop. Only handed to the kernel's questions and advice (`mincore`, `madvise`); never read
/// through here.
struct FileMapping {
    addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is only passed to syscalls, which are safe from any thread; the pointer is
// never dereferenced.
unsafe impl Send for FileMapping {}
// SAFETY: as above: nothing reads or writes through the pointer.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    fn new(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<FileMapping> {
        // SAFETY: a new read-only shared mapping of an open file, checked against MAP_FAILED; no
        // memory of ours is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FileMapping { addr, len })
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping `new` made, which nothing else references.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// A read-only shared mapping of a file that is never read through: it only lets the kernel be
/// asked to read chosen ranges of the file into the page cache ([`PopulateMap::populate`]).
///
/// The mapping is advised `MADV_HUGEPAGE` and `MADV_RANDOM`, so that each page fault reads the
/// one 2 MiB-aligned block around it, as one huge folio where the file system keeps them, and
/// nothing more: the caller, not the kernel's readahead, decides how many reads are in flight.
pub struct PopulateMap(FileMapping);

/// The block each fault of a [`PopulateMap`] reads: a PMD-sized huge page.
pub const POPULATE_BLOCK: u64 = 2 << 20;

/// The first kernel whose faults on a `MADV_HUGEPAGE` file mapping read the whole 2 MiB block
/// around them (Linux 5.18, with large folios in the page cache). Before it a fault under
/// `MADV_RANDOM` read one 4 KiB page, which would make a populate crawl.
pub const POPULATE_KERNEL: (u32, u32) = (5, 18);

/// The running kernel's version, major and minor (`/proc/sys/kernel/osrelease`).
pub fn kernel_version() -> Option<(u32, u32)> {
    static VERSION: std::sync::OnceLock<Option<(u32, u32)>> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        parse_kernel_version(&std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?)
    })
}

/// `"6.18.44-fc-v595"` → `(6, 18)`.
fn parse_kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

impl PopulateMap {
    /// Maps the first `len` bytes of `fd` (its size now). Fails on kernels before
    /// [`POPULATE_KERNEL`] (`Unsupported`) and where the kernel cannot advise huge pages for
    /// file mappings (`EINVAL`): there a fault would read a single page.
    pub fn new(fd: BorrowedFd<'_>, len: u64) -> io::Result<PopulateMap> {
        if kernel_version().is_none_or(|v| v < POPULATE_KERNEL) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "faults read whole huge-page blocks only from Linux 5.18",
            ));
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let map = FileMapping::new(fd, 0, len)?;
        for advice in [libc::MADV_HUGEPAGE, libc::MADV_RANDOM] {
            // SAFETY: advice on exactly our own mapping (dropped, so unmapped, on failure).
            if unsafe { libc::madvise(map.addr, map.len, advice) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(PopulateMap(map))
    }

    /// Reads `[offset, offset+len)` of the file into the page cache, in whole 2 MiB blocks, one
    /// after the other (`MADV_POPULATE_READ`), and unmaps them again (`MADV_DONTNEED`, which on a
    /// file mapping leaves the page cache as it is). Bytes past the mapping are skipped. An error
    /// (a file cut short under the mapping reads as `EFAULT`) changes nothing: a read that
    /// follows reports the file's real state.
    pub fn populate(&self, offset: u64, len: usize) -> io::Result<()> {
        let map = &self.0;
        let start = offset / POPULATE_BLOCK * POPULATE_BLOCK;
        let end = offset
            .saturating_add(len as u64)
            .div_ceil(POPULATE_BLOCK)
            .saturating_mul(POPULATE_BLOCK)
            .min(map.len as u64);
        if start >= end {
            return Ok(());
        }
        // SAFETY: `start < end <= map.len`, so the range lies inside our mapping.
        let at = unsafe { map.addr.add(start as usize) };
        let n = (end - start) as usize;
        // SAFETY: advice on a range of our own mapping; neither call touches memory of ours.
        let r = unsafe { libc::madvise(at, n, libc::MADV_POPULATE_READ) };
        let err = (r != 0).then(io::Error::last_os_error);
        // SAFETY: as above.
        unsafe { libc::madvise(at, n, libc::MADV_DONTNEED) };
        err.map_or(Ok(()), Err)
    }
}

/// `posix_fadvise(POSIX_FADV_DONTNEED)`: asks the kernel to drop the clean cached pages of a range
/// (`len` 0 means to end of file).
pub fn fadvise_dontneed(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe {
        libc::posix_fadvise(
            fd.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// `posix_fadvise(POSIX_FADV_RANDOM)` on the whole file: no readahead through this descriptor, so
/// a buffered read brings in only the bytes asked for.
pub fn fadvise_random(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// `fdatasync(2)`.
pub fn fdatasync(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor.
    cvt(unsafe { libc::fdatasync(fd.as_raw_fd()) }).map(|_| ())
}

/// What closing `fd` would report, found by closing a duplicate of it: every `close(2)` of an
/// open file runs the file system's flush, which is where NFS, FUSE and other network file
/// systems report that written data did not reach storage (`EIO`, `ENOSPC`, `EDQUOT`). `fd`
/// itself stays open for whoever still uses it. A file system without such a flush returns `Ok`,
/// and so does a process with no descriptor to spare for the duplicate (`EMFILE`, `ENFILE`:
/// nothing can be learnt then, and the close itself has not failed) or a close interrupted by a
/// signal (`EINTR`: the descriptor is freed, and its flush's outcome cannot be known).
pub fn close_checked(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `F_DUPFD_CLOEXEC` makes a new descriptor of the open `fd`; nothing else owns it.
    let copy = match cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) }) {
        Ok(copy) => copy,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => return Ok(()),
        Err(e) => return Err(e),
    };
    // SAFETY: `copy` was just made and is closed exactly once, here. Linux frees the descriptor
    // whatever `close` returns, so it is never closed again.
    match cvt(unsafe { libc::close(copy) }) {
        Err(e) if e.raw_os_error() != Some(libc::EINTR) => Err(e),
        _ => Ok(()),
    }
}

/// `sync(2)`: flushes every file system's dirty data.
pub fn sync() {
    // SAFETY: sync(2) has no preconditions and cannot fail.
    unsafe { libc::sync() };
}

/// `ftruncate(2)`.
pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }).map(|_| ())
}

/// The system's page size in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(any(test, feature = "testing"))]
/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Why this process may not write `path` (`faccessat(W_OK, AT_EACCESS)`: the effective user,
/// so root may write any file, as the kernel lets it): `None` where it may, else the kernel's
/// refusal (`EACCES`, `EPERM`, or `EROFS` on a read-only file system).
pub fn write_refused(path: &Path) -> io::Result<Option<io::Error>> {
    let c = c_path(path)?;
    // SAFETY: `c` is a valid C string; faccessat only reads it.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if rc == 0 {
        return Ok(None);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => Ok(Some(e)),
        _ => Err(e),
    }
}

/// Grows this process's table of file descriptors now to at least `entries` slots (as far as
/// `RLIMIT_NOFILE` lets it), so that opening that many descriptors later never grows it.
///
/// The kernel grows the table as descriptors are opened, doubling it; in a process of several
/// threads each growth first waits for an RCU grace period (9-25 ms measured on the dev VM and
/// the GPU machines), and every thread that opens a descriptor meanwhile waits too. With one
/// thread a growth costs nothing. The table never shrinks. Best effort: on any failure the
/// table stays as it was.
pub fn reserve_descriptors(entries: u32) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the valid, exclusive `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    let slots = u64::from(entries).min(limit.rlim_cur);
    let Ok(highest) = libc::c_int::try_from(slots.saturating_sub(1)) else {
        return;
    };
    if highest < 1 {
        return;
    }
    // A descriptor of our own to copy: the caller's 0, 1 and 2 may be closed.
    let Ok(root) = open(Path::new("/"), libc::O_PATH | libc::O_DIRECTORY, 0) else {
        return;
    };
    // SAFETY: `F_DUPFD_CLOEXEC` copies the open `root` to the lowest free descriptor at or
    // above `highest`; it never replaces an open descriptor.
    let copy = unsafe { libc::fcntl(root.as_raw_fd(), libc::F_DUPFD_CLOEXEC, highest) };
    if copy >= 0 {
        // SAFETY: `copy` was just made by `fcntl` and nothing else owns it.
        drop(unsafe { OwnedFd::from_raw_fd(copy) });
    }
}

/// The value of one field of `/proc/self/status` (`"Threads"`, `"Umask"`, ...), trimmed, or
/// `None` where the file or the field cannot be read.
pub(crate) fn process_status(field: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        let value = l.strip_prefix(field)?.strip_prefix(':')?;
        Some(value.trim().to_string())
    })
}

/// How many threads this process has (`Threads:` in `/proc/self/status`), or `None` where that
/// cannot be read.
pub fn thread_count() -> Option<usize> {
    process_status("Threads")?.parse().ok()
}

/// Whether a process with this id exists on this machine (`kill(pid, 0)`; a process of another
/// user counts as existing).
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(any(test, feature = "testing"))]
/// Bytes available to unprivileged users on the file system holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let c = c_path(path).ok()?;
    // SAFETY: an all-zero `statvfs` is a valid value for this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` is writable.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// `fallocate(2)` mode 0: allocates `[offset, offset+len)` and extends the file size to cover it.
pub fn fallocate(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    loop {
        // SAFETY: plain syscall on an open descriptor.
        let r = unsafe {
            libc::fallocate(fd.as_raw_fd(), 0, offset as libc::off_t, len as libc::off_t)
        };
        match cvt(r) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Turns `O_NONBLOCK` on or off for the open file description behind `fd` (`fcntl(2)`).
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_status_flag(fd, libc::O_NONBLOCK, on)
}

/// Turns `O_DIRECT` on or off for the open file description behind `fd` (`fcntl(2)`; fails
/// with `EINVAL` where the file system has no direct I/O).
pub fn set_direct(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_status_flag(fd, libc::O_DIRECT, on)
}

/// Sets or clears one file status flag of the open file description behind `fd`.
fn set_status_flag(fd: BorrowedFd<'_>, flag: libc::c_int, on: bool) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let want = if on { flags | flag } else { flags & !flag };
    if want != flags {
        // SAFETY: plain syscall on an open descriptor; F_SETFL takes an int argument.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, want) })?;
    }
    Ok(())
}

/// `_IOR(0x12, 114, size_t)`, which libc does not name. The kernel declares the argument as
/// `size_t` although it writes a `u64`, so the encoded size is the pointer width.
const BLKGETSIZE64: u64 = {
    // Direction "read" sits at bit 30 on most architectures, at bit 29 (with a 3-bit field) on
    // these; the size field is 14 bits wide, or 13 on these.
    #[cfg(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    ))]
    let read_dir: u64 = 2 << 29;
    #[cfg(not(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    )))]
    let read_dir: u64 = 2 << 30;
    read_dir | ((std::mem::size_of::<usize>() as u64) << 16) | (0x12 << 8) | 114
};

/// The size in bytes of the block device open at `fd` (`ioctl(BLKGETSIZE64)`); `fstat` reports
/// 0 for block devices.
pub fn block_device_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at `size`, live and
    // writable for the call; a descriptor that is not a block device fails with ENOTTY.
    cvt(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            BLKGETSIZE64 as libc::Ioctl,
            &mut size as *mut u64,
        )
    })?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;

    use super::*;

    /// A file of `blocks` populate blocks and a few bytes more, dropped from the page cache;
    /// `None` where the drop does not take (a file system that keeps its pages).
    fn cold_file(blocks: u64) -> Option<tempfile::NamedTempFile> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let len = (blocks * POPULATE_BLOCK) as usize + 100;
        f.write_all(&vec![7u8; len]).unwrap();
        f.as_file().sync_all().unwrap();
        fadvise_dontneed(f.as_file().as_fd(), 0, 0).unwrap();
        let fd = f.as_file().as_fd();
        if mincore_resident(fd, 0, len as u64).unwrap() > 0 {
            eprintln!("skipped: this file system keeps the pages after POSIX_FADV_DONTNEED");
            return None;
        }
        Some(f)
    }

    /// The size of this process's descriptor table (`FDSize` in `/proc/self/status`).
    fn descriptor_table_size() -> u64 {
        process_status("FDSize").unwrap().parse().unwrap()
    }

    #[test]
    fn the_thread_count_sees_a_new_thread() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let parked = std::thread::spawn(move || rx.recv());
        let with = thread_count().expect("thread count");
        // The test's own thread and the parked one at least.
        assert!(with >= 2, "{with} threads");
        tx.send(()).unwrap();
        parked.join().unwrap().unwrap();
    }

    #[test]
    fn reserving_descriptors_grows_the_table_and_leaves_nothing_open() {
        let before = descriptor_table_size();
        let limit = {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: writes one `rlimit` into the valid `l`.
            assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
            l.rlim_cur
        };
        // Well above what the tests hold at once, within the limit.
        let want = (before * 4).min(limit).min(1 << 16);
        reserve_descriptors(want as u32);
        assert!(
            descriptor_table_size() >= want,
            "table of {} slots, asked for {want} (it had {before})",
            descriptor_table_size()
        );
        // The copy made to grow it is closed again: nothing open near the top.
        let high = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .filter(|&fd| fd >= want - 1)
            .count();
        assert_eq!(high, 0);
        // Asking again, or for less, changes nothing.
        let grown = descriptor_table_size();
        reserve_descriptors(want as u32);
        reserve_descriptors(1);
        assert_eq!(descriptor_table_size(), grown);
    }

    #[test]
    fn populate_reads_the_blocks_asked_for_and_no_more() {
        let Some(f) = cold_file(4) else { return };
        let fd = f.as_file().as_fd();
        let len = f.as_file().metadata().unwrap().len();
        let map = PopulateMap::new(fd, len).unwrap();
        // A range inside the second block brings in that whole block, not its neighbours.
        map.populate(POPULATE_BLOCK + 4096, 8192).unwrap();
        let block = POPULATE_BLOCK;
        assert_eq!(mincore_resident(fd, block, block).unwrap() * 4096, block);
        assert_eq!(mincore_resident(fd, 0, block).unwrap(), 0);
        assert_eq!(mincore_resident(fd, 2 * block, len - 2 * block).unwrap(), 0);
        // The last, partial block, and a range past the mapping (skipped).
        map.populate(len - 10, 10).unwrap();
        assert!(mincore_resident(fd, len - 10, 10).unwrap() > 0);
        map.populate(len + block, 10).unwrap();
    }

    #[test]
    fn populate_past_a_cut_file_is_an_error_not_a_crash() {
        let Some(f) = cold_file(4) else { return };
        let fd = f.as_file().as_fd();
        let map = PopulateMap::new(fd, f.as_file().metadata().unwrap().len()).unwrap();
        f.as_file().set_len(POPULATE_BLOCK).unwrap();
        let e = map.populate(2 * POPULATE_BLOCK, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        map.populate(0, 4096).unwrap();
    }

    #[test]
    fn kernel_versions_parse() {
        assert_eq!(parse_kernel_version("6.18.44-fc-v595\n"), Some((6, 18)));
        assert_eq!(parse_kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_kernel_version("5.14.0-427.el9.x86_64"), Some((5, 14)));
        assert_eq!(parse_kernel_version("6.1"), Some((6, 1)));
        assert_eq!(parse_kernel_version("garbage"), None);
        assert!((5, 15) < POPULATE_KERNEL && (6, 1) > POPULATE_KERNEL);
        assert!(kernel_version().is_some(), "this kernel's version");
    }

    #[test]
    fn populate_map_of_an_empty_file_is_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert!(PopulateMap::new(f.as_file().as_fd(), 0).is_err());
    }
}
