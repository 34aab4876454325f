//! What the reports print about this process and machine: CPU time used (own and waited-for
//! children's, for CPU-seconds per GiB) and the space free on a file system (to size a benchmark
//! file); and the open-file limit the command line raises for itself. These few libc calls are
//! the command line's own; the library keeps its syscalls to itself.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value and `getrusage` only writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is writable and `who` is RUSAGE_SELF or RUSAGE_CHILDREN.
    unsafe { libc::getrusage(who, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Raises this process's soft limit on open files to its hard limit, as `ulimit -n` could, so
/// that `ferrio read` of a few thousand files does not stop at the usual soft limit of 1024
/// (each file is opened, and so checked, before any is read). The command line owns its
/// process, so it raises the limit whole, at start; the library leaves its host's limits alone,
/// except that `ferrio.safetensors` raises the soft one as far as a sharded checkpoint it is
/// asked to open needs (its shards stay open together). Best effort.
pub(crate) fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the valid, exclusive `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0
        || limit.rlim_cur >= limit.rlim_max
    {
        return;
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: `setrlimit` reads one valid `rlimit`; a soft limit up to the hard one is allowed.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
}

/// CPU time (user + system) this process has used, in seconds.
pub(crate) fn process_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

/// CPU time (user + system) of this process's children that have been waited for, in seconds.
pub(crate) fn children_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_CHILDREN)
}

/// Bytes available to unprivileged users on the file system holding `path`.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    statvfs(path).map(|st| st.f_bavail * st.f_frsize)
}

/// Bytes this process may write on the file system holding `path`: what unprivileged users
/// may, and for root also the blocks the file system reserves for it; `None` where it does not
/// say.
pub(crate) fn writable_bytes(path: &Path) -> Option<u64> {
    // SAFETY: `geteuid` has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // A file system that reports no blocks at all (a FUSE one without `statfs`) says nothing
    // about its room.
    statvfs(path).filter(|st| st.f_blocks > 0).map(|st| {
        let blocks = if root { st.f_bfree } else { st.f_bavail };
        blocks * st.f_frsize
    })
}

/// A zero-filled byte buffer of `len` bytes, or an error where the memory cannot be had (where
/// `vec![0; len]` would abort the process, leaving its temporary files behind).
pub(crate) fn zeroed(len: usize) -> anyhow::Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len)?;
    // SAFETY: `layout` has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        anyhow::bail!(
            "cannot allocate {} of memory for the buffer",
            ferrio::config::format_size(len as u64)
        );
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` bytes (alignment
    // 1), all of them initialised (zeroed); the Vec takes ownership with that capacity.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

fn statvfs(path: &Path) -> Option<libc::statvfs> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero `statvfs` is a valid value for this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` is writable.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st)
}
