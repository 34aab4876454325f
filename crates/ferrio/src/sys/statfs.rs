//! `statfs(2)`: the file system type of a path, for when `/proc/self/mountinfo` does not say.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The file system magic number (`f_type`) of the file system holding `path`.
///
/// Magic numbers are 32-bit values (see `linux/magic.h`); `f_type` is a signed word whose
/// width differs between architectures, so it is truncated to its low 32 bits on purpose.
pub(crate) fn fs_magic(path: &Path) -> io::Result<u32> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let mut buf = MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call, and `buf` is writable
    // memory of exactly `size_of::<libc::statfs>()` bytes.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every byte of `buf` was zeroed, which is a valid `statfs` (plain integers), and the
    // successful call filled it in.
    let buf = unsafe { buf.assume_init() };
    Ok(buf.f_type as u32)
}

/// Whether `path` lies on a file system whose files make their content as they are read, so
/// that their size does not say what they hold: procfs and cgroup files report 0, sysfs
/// attributes 4096 whatever they hold (`/sys/class/net/lo/address`: 18 bytes). Such files are
/// read to their end, as `cp` and `cat` do.
pub(crate) fn content_is_generated(path: &Path) -> bool {
    const GENERATED: [u32; 8] = [
        0x9fa0,      // PROC_SUPER_MAGIC
        0x6265_6572, // SYSFS_MAGIC
        0x6462_6720, // DEBUGFS_MAGIC
        0x7472_6163, // TRACEFS_MAGIC
        0x6265_6570, // CONFIGFS_MAGIC
        0x7363_6673, // SECURITYFS_MAGIC
        0x0027_e0eb, // CGROUP_SUPER_MAGIC
        0x6367_7270, // CGROUP2_SUPER_MAGIC
    ];
    fs_magic(path).is_ok_and(|m| GENERATED.contains(&m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_is_tmpfs() {
        let Ok(magic) = fs_magic(Path::new("/dev/shm")) else {
            eprintln!("skipped: /dev/shm is not available");
            return;
        };
        assert_eq!(magic, 0x0102_1994, "TMPFS_MAGIC");
    }

    #[test]
    fn proc_and_sys_make_their_content_and_tmp_does_not() {
        for (path, generated) in [("/proc/self/status", true), ("/sys/kernel", true)] {
            if Path::new(path).exists() {
                assert_eq!(content_is_generated(Path::new(path)), generated, "{path}");
            }
        }
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(!content_is_generated(dir.path()));
        assert!(!content_is_generated(Path::new("/nonexistent/ferrio")));
    }

    #[test]
    fn missing_path_is_an_error() {
        let err = fs_magic(Path::new("/nonexistent/ferrio/statfs")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn nul_byte_is_invalid_input() {
        let err = fs_magic(Path::new("a\0b")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
