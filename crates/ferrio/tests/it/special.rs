//! Files that are not plain regular files: FIFOs, sockets and character devices are refused
//! without blocking, block devices report their size, size-0 procfs files are copied to their
//! end, and zero-length GPU requests complete without looking at the address.

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use ferrio::copy::{copy, CopyOptions};
use ferrio::cuda::DevicePtr;
use ferrio::{Error, File};

use super::common::{data, disk_dir, make_file};

/// Runs `f` on its own thread and gives its result, or fails the test if it has not returned in
/// a few seconds (a blocking `open` would otherwise hang the suite).
fn within_seconds<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

/// Asserts that opening `path` with every mode fails at once, naming the path and `kind`.
fn assert_refused(path: &Path, kind: &'static str) {
    for mode in ["r", "r+", "w", "a"] {
        let p = path.to_path_buf();
        let e = within_seconds(&format!("open({}, {mode})", p.display()), move || {
            File::open(&p, mode)
        })
        .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Open { .. }), "{mode}: {e:?}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains(kind), "{mode}: {text}");
    }
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = disk_dir();
    let p = dir.path().join("p");
    mkfifo(&p);
    assert_refused(&p, "is a FIFO");
    // The FIFO is still a FIFO: nothing was created or replaced in its place.
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&p).unwrap().file_type().is_fifo());
}

#[test]
fn a_character_device_and_a_socket_are_refused() {
    assert_refused(Path::new("/dev/null"), "is a character device");
    let dir = disk_dir();
    let s = dir.path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&s).unwrap();
    let p = s.clone();
    let e = within_seconds("open(socket)", move || File::open(&p, "r")).unwrap_err();
    // A socket cannot be opened at all (ENXIO), so the check never sees it; the error still
    // names the path.
    assert!(e.to_string().contains("sock"), "{e}");
}

#[test]
fn a_regular_file_still_blocks_normally_after_open() {
    // The descriptor was opened non-blocking to inspect it; regular files get blocking back.
    let dir = disk_dir();
    let bytes = data(1 << 20, 7);
    let p = make_file(dir.path(), "f", &bytes);
    let f = File::open(&p, "r").unwrap();
    let flags = unsafe_getfl(&f);
    assert_eq!(flags & libc::O_NONBLOCK, 0);
    let mut back = vec![0u8; bytes.len()];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), bytes.len());
    assert!(back == bytes);
}

fn unsafe_getfl(f: &File) -> libc::c_int {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL on a descriptor the file keeps open.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) }
}

#[test]
fn a_size_zero_proc_file_is_copied_to_its_end() {
    let src = Path::new("/proc/self/status");
    if std::fs::metadata(src).map_or(true, |m| m.len() != 0) {
        eprintln!("skipped: /proc/self/status does not report size 0 here");
        return;
    }
    let dir = disk_dir();
    let dst = dir.path().join("status");
    let report = copy([src], &dst, &CopyOptions::new()).unwrap();
    report.check().unwrap();
    let out = std::fs::read(&dst).unwrap();
    assert!(!out.is_empty(), "copied 0 bytes");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("Name:"), "{text}");
    assert!(text.contains("\nPid:"), "{text}");
    assert_eq!(report.bytes, out.len() as u64);
}

#[test]
fn a_size_zero_proc_file_is_copied_to_its_end_with_read_write() {
    let src = Path::new("/proc/cpuinfo");
    if std::fs::metadata(src).map_or(true, |m| m.len() != 0) {
        eprintln!("skipped: /proc/cpuinfo does not report size 0 here");
        return;
    }
    let dir = disk_dir();
    let dst = dir.path().join("cpuinfo");
    let options = CopyOptions::new()
        .method(ferrio::CopyMethod::ReadWrite)
        .verify(true);
    copy([src], &dst, &options).unwrap().check().unwrap();
    let out = std::fs::read(&dst).unwrap();
    assert!(
        String::from_utf8_lossy(&out).contains("processor"),
        "{out:?}"
    );
}

/// A loop device over a file of `bytes` bytes, detached on drop.
struct LoopDev(String);

impl LoopDev {
    fn new(backing: &Path) -> Result<LoopDev, String> {
        if !ferrio::sys::is_root() {
            return Err("needs root (losetup)".into());
        }
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(backing)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(LoopDev(
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        ))
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn a_block_device_has_its_size_and_reads_its_bytes() {
    let dir = disk_dir();
    let bytes = data(3 << 20, 11);
    let img = make_file(dir.path(), "img", &bytes);
    let dev = match LoopDev::new(&img) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: a loop device: {why}");
            return;
        }
    };
    let f = File::open(&dev.0, "r").unwrap();
    assert_eq!(f.len().unwrap(), bytes.len() as u64);
    let mut back = vec![0u8; bytes.len()];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), bytes.len());
    assert!(back == bytes);
}

#[test]
fn a_zero_length_device_request_completes_without_looking_at_the_address() {
    let dir = disk_dir();
    let p = make_file(dir.path(), "f", b"some bytes");
    let f = File::open(&p, "r+").unwrap();
    // SAFETY: a zero-length range touches no memory.
    let read = unsafe { f.pread_device(DevicePtr(0), 0, 0) }.wait();
    assert_eq!(read.unwrap(), 0);
    // SAFETY: as above.
    let wrote = unsafe { f.pwrite_device(DevicePtr(0), 0, 4) }.wait();
    assert_eq!(wrote.unwrap(), 0);
    assert_eq!(std::fs::read(&p).unwrap(), b"some bytes");
    // A non-empty request still checks the address (and needs CUDA).
    // SAFETY: the call fails before any transfer: address 0 is not device memory.
    assert!(unsafe { f.pread_device(DevicePtr(0), 1, 0) }
        .wait()
        .is_err());
}
