//! Syscalls that copying needs: `copy_file_range`, data/hole seeking for sparse files, setting
//! times without following symlinks, and the process umask.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

use super::{c_path, cvt, MAX_IO};

/// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off` inside the kernel
/// (`copy_file_range(2)`), looping over partial copies and `EINTR`. Returns the bytes copied:
/// fewer than `len` only when the source ends first.
///
/// Fails with `EXDEV`, `ENOSYS`, `EOPNOTSUPP` or `EINVAL` where the kernel or file system cannot
/// do it (see [`copy_unsupported`]); the caller then copies through user memory.
pub fn copy_file_range(
    src: BorrowedFd<'_>,
    src_off: u64,
    dst: BorrowedFd<'_>,
    dst_off: u64,
    len: u64,
) -> io::Result<u64> {
    let mut done = 0u64;
    while done < len {
        let mut off_in = (src_off + done) as libc::loff_t;
        let mut off_out = (dst_off + done) as libc::loff_t;
        let want = (len - done).min(MAX_IO as u64) as usize;
        // SAFETY: both descriptors are open for the call; the offsets are our own locals, which
        // the kernel updates and which outlive the call.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                want,
                0,
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
            break;
        }
        done += n as u64;
    }
    Ok(done)
}

/// Whether a `copy_file_range` error means "not possible here" (copy through user memory
/// instead) rather than a real I/O failure.
pub fn copy_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL)
    )
}

/// `lseek(SEEK_DATA)`: the first offset at or after `offset` that holds data, `None` when only a
/// hole (or nothing) follows. File systems without hole tracking report all of a file as data.
pub fn seek_data(fd: BorrowedFd<'_>, offset: u64) -> io::Result<Option<u64>> {
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), offset as libc::off_t, libc::SEEK_DATA) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(r as u64))
}

/// `lseek(SEEK_HOLE)`: the first offset at or after `offset` inside a hole (the end of the file
/// counts as a hole).
pub fn seek_hole(fd: BorrowedFd<'_>, offset: u64) -> io::Result<u64> {
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), offset as libc::off_t, libc::SEEK_HOLE) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// A point in time as `stat` gives it: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp {
    /// Whole seconds since the epoch (negative before 1970).
    pub secs: i64,
    /// Nanoseconds, 0..1e9.
    pub nanos: i64,
}

fn timespecs(atime: Timestamp, mtime: Timestamp) -> [libc::timespec; 2] {
    let ts = |t: Timestamp| libc::timespec {
        tv_sec: t.secs as libc::time_t,
        tv_nsec: t.nanos as _,
    };
    [ts(atime), ts(mtime)]
}

/// Sets the access and modification times of an open file (`futimens(2)`).
pub fn futimens(fd: BorrowedFd<'_>, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
    let times = timespecs(atime, mtime);
    // SAFETY: `times` is an array of two valid timespecs that outlives the call.
    cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(|_| ())
}

/// Sets the access and modification times of `path` itself, not of what a symlink points to
/// (`utimensat(AT_SYMLINK_NOFOLLOW)`).
pub fn lutimens(path: &Path, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
    let c = c_path(path)?;
    let times = timespecs(atime, mtime);
    // SAFETY: `c` is a NUL-terminated string and `times` two valid timespecs; both outlive the
    // call.
    cvt(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(|_| ())
}

/// The process umask, read from `/proc/self/status` (Linux 4.7+) so that no thread's file
/// creation races a set-and-restore; `0o022` when it cannot be read.
pub fn umask() -> u32 {
    super::process_status("Umask")
        .and_then(|v| u32::from_str_radix(&v, 8).ok())
        .unwrap_or(0o022)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn data_and_holes_of_a_sparse_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sparse");
        let f = std::fs::File::create(&p).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 4096], 1 << 20).unwrap();
        f.set_len(4 << 20).unwrap();
        let first = seek_data(f.as_fd(), 0).unwrap();
        let Some(first) = first else {
            panic!("a file with data has a data offset");
        };
        // File systems without hole tracking report offset 0; ext4/xfs/btrfs report the block.
        assert!(first == 0 || first == 1 << 20, "{first}");
        let hole = seek_hole(f.as_fd(), first).unwrap();
        assert!(hole > first && hole <= 4 << 20, "{hole}");
        assert_eq!(seek_data(f.as_fd(), 4 << 20).unwrap(), None, "past the end");
    }

    #[test]
    fn copy_file_range_copies_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"hello, copy").unwrap();
        let src = std::fs::File::open(&a).unwrap();
        let dst = std::fs::File::create(dir.path().join("b")).unwrap();
        match copy_file_range(src.as_fd(), 7, dst.as_fd(), 0, 100) {
            Ok(n) => {
                assert_eq!(n, 4, "short at end of source");
                assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), b"copy");
            }
            Err(e) if copy_unsupported(&e) => eprintln!("skipped: copy_file_range: {e}"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn times_are_set_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let t = Timestamp {
            secs: 1_000_000_000,
            nanos: 123_456_789,
        };
        lutimens(&link, t, t).unwrap();
        use std::os::unix::fs::MetadataExt;
        let lm = std::fs::symlink_metadata(&link).unwrap();
        assert_eq!((lm.mtime(), lm.mtime_nsec()), (t.secs, t.nanos));
        let tm = std::fs::metadata(&target).unwrap();
        assert_ne!(tm.mtime(), t.secs, "the target is untouched");
        let f = std::fs::File::open(&target).unwrap();
        futimens(f.as_fd(), t, t).unwrap();
        let tm = std::fs::metadata(&target).unwrap();
        assert_eq!((tm.mtime(), tm.mtime_nsec()), (t.secs, t.nanos));
        assert!(umask() <= 0o777);
    }
}
