//! `ferrio write` as a user runs it: empty files, targets checked before any is touched, and
//! nothing new left behind after Ctrl-C or a full disk.

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{interrupt_and_time, LoopFs};

fn ferrio() -> Command {
    common::ferrio()
}

fn run(args: &[&Path]) -> Output {
    ferrio().args(args).output().expect("run ferrio")
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn size_zero_creates_an_empty_file() {
    let d = tmp();
    let f = d.path().join("empty");
    let o = run(&[Path::new("write"), Path::new("--size"), Path::new("0"), &f]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(fs::metadata(&f).unwrap().len(), 0);
}

#[test]
fn every_target_is_checked_before_any_is_touched() {
    let d = tmp();
    let existing = d.path().join("existing.bin");
    fs::write(&existing, b"keep me").unwrap();
    let fresh = d.path().join("fresh");
    let size = [Path::new("write"), Path::new("--size"), Path::new("1MiB")];
    for bad in [d.path().join("nodir/x"), d.path().to_path_buf()] {
        let o = run(&[&size[..], &[&existing, &fresh, &bad]].concat());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(&*bad.to_string_lossy()), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(fs::read(&existing).unwrap(), b"keep me", "{err}");
        assert!(!fresh.exists(), "{err}");
    }
}

#[test]
fn ctrl_c_removes_the_file_it_created() {
    let d = tmp();
    let f = d.path().join("new");
    let mut child = ferrio()
        .args([
            "write",
            "--threads",
            "1",
            "--task-size",
            "4KiB",
            "--direct-write",
            "off",
            "--size",
            "2GiB",
        ])
        .arg(&f)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !f.exists() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let (status, took) = interrupt_and_time(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130));
    assert!(
        took < Duration::from_secs(2),
        "exited {took:?} after Ctrl-C"
    );
    assert!(!f.exists(), "the interrupted write left {}", f.display());
}

#[test]
fn a_write_too_big_for_the_disk_is_refused_before_any_file_is_touched() {
    let lfs = match LoopFs::new(32) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop file system: {why}");
            return;
        }
    };
    let mnt = lfs.mnt();
    let size = [Path::new("write"), Path::new("--size"), Path::new("64MiB")];
    let new = mnt.join("new");
    let o = run(&[&size[..], &[&new]].concat());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no room") && err.contains("64.00 MiB needed"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!new.exists(), "a refused write left {}", new.display());

    // An existing file is counted as the room it frees, and is left whole when that is not
    // enough: it used to be truncated first, then the write failed.
    let old = mnt.join("old");
    fs::write(&old, vec![7u8; 8 << 20]).unwrap();
    let o = run(&[&size[..], &[&old]].concat());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the files to overwrite hold 8.00 MiB"),
        "{err}"
    );
    assert_eq!(
        fs::read(&old).unwrap(),
        vec![7u8; 8 << 20],
        "the old file changed"
    );

    // Two files that fit one at a time but not together: neither is touched.
    let small = [Path::new("write"), Path::new("--size"), Path::new("12MiB")];
    let (a, b) = (mnt.join("a"), mnt.join("b"));
    let o = run(&[&small[..], &[&a, &b, &old]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!a.exists() && !b.exists());
    assert_eq!(fs::read(&old).unwrap(), vec![7u8; 8 << 20]);
    // Overwriting the old file with as much as it holds fits.
    let same = [Path::new("write"), Path::new("--size"), Path::new("8MiB")];
    let o = run(&[&same[..], &[&old]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(fs::metadata(&old).unwrap().len(), 8 << 20);
}

#[test]
fn a_fifo_or_device_is_refused_before_any_target_is_touched() {
    let d = tmp();
    let fifo = d.path().join("fifo");
    let null = d.path().join("null");
    let mut targets = vec![fifo.clone()];
    let make = |p: &Path, mode: libc::mode_t, dev: libc::dev_t| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a valid C string naming a path in this test's directory.
        unsafe { libc::mknod(c.as_ptr(), mode, dev) == 0 }
    };
    assert!(make(&fifo, libc::S_IFIFO | 0o644, 0), "mkfifo");
    // The null device (1:3) needs root to make.
    if make(&null, libc::S_IFCHR | 0o666, libc::makedev(1, 3)) {
        targets.push(null);
    } else {
        eprintln!("character device part skipped: mknod needs root");
    }
    // Refused before any target is opened: a file named first keeps its bytes.
    let existing = d.path().join("existing");
    fs::write(&existing, b"keep me").unwrap();
    for t in &targets {
        let o = run(&[
            Path::new("write"),
            Path::new("--size"),
            Path::new("1MiB"),
            &existing,
            t,
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("only regular files and block devices"),
            "{err}"
        );
        assert!(err.contains(&*t.to_string_lossy()), "{err}");
        assert!(!err.contains("overwritten"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(fs::read(&existing).unwrap(), b"keep me", "{err}");
    }
}

#[test]
fn a_size_larger_than_a_block_device_is_refused_before_writing() {
    let d = tmp();
    let img = d.path().join("img");
    fs::write(&img, vec![0x5a; 4 << 20]).unwrap();
    let loop_dev = match common::LoopDevice::attach(&img) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dev = loop_dev.path.clone();
    let o = run(&[
        Path::new("write"),
        Path::new("--size"),
        Path::new("8MiB"),
        Path::new(&dev),
    ]);
    drop(loop_dev);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("more than the device holds (4.00 MiB)"),
        "{err}"
    );
    assert!(!err.contains("overwritten"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        fs::read(&img).unwrap().iter().all(|&b| b == 0x5a),
        "the device was written"
    );
}
