//! Residency and dropping pages.

use ferrio::pagecache;

use super::common::{data, disk_dir, make_file};

#[test]
fn residency_follows_reads_and_drops() {
    let dir = disk_dir();
    let p = make_file(dir.path(), "f", &data(8 << 20, 9));
    let _ = std::fs::read(&p).unwrap();
    let hot = pagecache::residency(&p, 0, None).unwrap();
    assert_eq!(hot.range_bytes, 8 << 20);
    assert!(hot.share() > 0.9, "just read: {hot:?}");
    pagecache::drop_file(&p).unwrap();
    let cold = pagecache::residency(&p, 0, None).unwrap();
    assert!(cold.share() < 0.1, "after drop: {cold:?}");
    let part = pagecache::residency(&p, 1 << 20, Some(1 << 20)).unwrap();
    assert_eq!(part.range_bytes, 1 << 20);
    let past = pagecache::residency(&p, 100 << 20, Some(10)).unwrap();
    assert_eq!(past.range_bytes, 0);
    assert!(pagecache::residency(&dir.path().join("missing"), 0, None).is_err());
}

#[test]
fn mincore_fallback_agrees_with_cachestat() {
    use std::os::fd::AsFd;
    let dir = disk_dir();
    let p = make_file(dir.path(), "f", &data(4 << 20, 10));
    let _ = std::fs::read(&p).unwrap();
    let f = std::fs::File::open(&p).unwrap();
    let m = ferrio::sys::mincore_resident(f.as_fd(), 0, 4 << 20).unwrap();
    match ferrio::sys::cachestat(f.as_fd(), 0, 4 << 20) {
        Ok(cs) => assert_eq!(cs.cached, m),
        Err(e) => eprintln!("skipped comparison: cachestat unavailable ({e})"),
    }
    assert_eq!(m, 1024);
}

#[test]
fn drop_system_cache_needs_root() {
    match pagecache::drop_system_cache() {
        Ok(()) => assert!(ferrio::sys::is_root()),
        Err(e) => assert!(!ferrio::sys::is_root(), "root but failed: {e}"),
    }
}

#[test]
fn a_fifo_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid C string naming a path in this test's directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    // Without the check each call would wait for a writer, forever.
    for err in [
        pagecache::residency(&fifo, 0, None)
            .map(|_| ())
            .unwrap_err(),
        pagecache::drop_file(&fifo).unwrap_err(),
    ] {
        assert!(err.to_string().contains("is a FIFO"), "{err}");
    }
}

#[test]
fn a_block_devices_residency_covers_the_whole_device() {
    use std::io::Read;
    let lfs = match super::common::LoopFs::new(24) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop device: {why}");
            return;
        }
    };
    let dev = std::path::Path::new(lfs.device());
    // `fstat` says 0 bytes for a device: its residency was that of an empty range.
    let r = pagecache::residency(dev, 0, None).unwrap();
    assert_eq!(r.range_bytes, 24 << 20, "{r:?}");
    let mut head = vec![0u8; 4 << 20];
    std::fs::File::open(dev)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    let r = pagecache::residency(dev, 0, Some(4 << 20)).unwrap();
    assert_eq!(r.range_bytes, 4 << 20);
    assert!(r.share() > 0.9, "just read: {r:?}");
}
