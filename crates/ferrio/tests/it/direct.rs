//! Direct I/O: every offset/size/policy/over-read combination, byte for byte, reads and writes,
//! ranges ending at and past end of file, unaligned memory, fallback where O_DIRECT is refused,
//! and coherence between direct and buffered access.

use ferrio::{pagecache, DirectMode, DirectSupport, File};

use super::common::{data, disk_dir, make_file, settings, POISON};

const OFFSETS: [u64; 7] = [0, 1, 511, 512, 4095, 4096, 4097];
const SIZES: [usize; 6] = [1, 511, 4096, 4097, 3 * 4096 + 5, (10 << 20) + 3];
const POLICIES: [DirectMode; 3] = [DirectMode::Off, DirectMode::On, DirectMode::Auto];
/// Not a multiple of any alignment, so the last block of the file is partial.
const FILE_LEN: usize = (12 << 20) + 777;

/// Offsets to try for one (offset mod alignment, size): inside the file, and so that the range
/// ends exactly at end of file, and so that it crosses it.
fn offsets(off_mod: u64, size: usize) -> Vec<u64> {
    let mut v = vec![(1 << 20) + off_mod];
    let at_eof = FILE_LEN as u64 - size as u64;
    v.push(at_eof);
    v.push(at_eof + size as u64 / 2 + off_mod);
    v.push(FILE_LEN as u64 + off_mod); // past EOF
    v
}

#[test]
fn read_matrix() {
    let dir = disk_dir();
    let content = data(FILE_LEN, 11);
    let path = make_file(dir.path(), "f", &content);
    for policy in POLICIES {
        for overread in [false, true] {
            let f = File::options()
                .settings(settings(policy, overread, 1 << 20))
                .open(&path, "r")
                .unwrap();
            for off_mod in OFFSETS {
                for size in SIZES {
                    for offset in offsets(off_mod, size) {
                        if policy == DirectMode::Auto && offset % 3 == 0 {
                            pagecache::drop_file(&path).unwrap(); // cold: the direct path
                        }
                        // One byte of slack so the destination can be unaligned memory too.
                        let mut buf = vec![POISON; size + 1];
                        let mem_skew = (offset % 2) as usize;
                        let dst = &mut buf[mem_skew..mem_skew + size];
                        let n = f.read_at(dst, offset).unwrap();
                        let start = (offset as usize).min(FILE_LEN);
                        let want = &content[start..(start + size).min(FILE_LEN)];
                        let ctx =
                            format!("{policy} overread={overread} offset={offset} size={size}");
                        assert_eq!(n, want.len(), "{ctx}");
                        assert!(dst[..n] == *want, "{ctx}: wrong bytes");
                        assert!(
                            dst[n..].iter().all(|&b| b == POISON),
                            "{ctx}: wrote past EOF"
                        );
                    }
                }
            }
            if policy != DirectMode::Off {
                assert!(
                    f.direct_support().is_available(),
                    "direct I/O fell back: {:?}",
                    f.direct_support()
                );
            }
        }
    }
}

#[test]
fn write_matrix() {
    let dir = disk_dir();
    let base = data(FILE_LEN, 12);
    for policy in POLICIES {
        for overread in [false, true] {
            let path = make_file(dir.path(), &format!("w-{policy}-{overread}"), &base);
            let mut model = base.clone();
            let f = File::options()
                .settings(settings(policy, overread, 1 << 20))
                .open(&path, "r+")
                .unwrap();
            for (i, off_mod) in OFFSETS.into_iter().enumerate() {
                for (j, size) in SIZES.into_iter().enumerate() {
                    for offset in offsets(off_mod, size) {
                        if policy == DirectMode::Auto && (i + j) % 2 == 0 {
                            pagecache::drop_file(&path).unwrap();
                        }
                        let patch = data(size + 1, (offset << 8) ^ size as u64);
                        let skew = (offset % 2) as usize;
                        let src = &patch[skew..skew + size];
                        assert_eq!(f.write_at(src, offset).unwrap(), size);
                        let end = offset as usize + size;
                        if model.len() < end {
                            model.resize(end, 0);
                        }
                        model[offset as usize..end].copy_from_slice(src);
                    }
                }
            }
            // Bytes outside every written range are untouched; the file is exactly the model.
            let got = std::fs::read(&path).unwrap();
            assert_eq!(got.len(), model.len(), "{policy} overread={overread}");
            assert!(got == model, "{policy} overread={overread}: file differs");
            if policy != DirectMode::Off {
                assert!(
                    f.direct_support().is_available(),
                    "{:?}",
                    f.direct_support()
                );
            }
        }
    }
}

#[test]
fn direct_and_buffered_access_stay_coherent() {
    let dir = disk_dir();
    let path = make_file(dir.path(), "f", &data(8 << 20, 13));
    let direct = File::options()
        .settings(settings(DirectMode::On, false, 1 << 20))
        .open(&path, "r+")
        .unwrap();
    let buffered = File::options()
        .settings(settings(DirectMode::Off, false, 1 << 20))
        .open(&path, "r+")
        .unwrap();
    // Buffered write (stays dirty in the cache), direct read sees it.
    let a = data(3 << 20, 14);
    buffered.write_at(&a, 4096).unwrap();
    let mut got = vec![0u8; 3 << 20];
    direct.read_at(&mut got, 4096).unwrap();
    assert!(got == a, "direct read after buffered write");
    // Read into the cache, direct write, buffered read sees the new bytes.
    let mut warm = vec![0u8; 8 << 20];
    buffered.read_at(&mut warm, 0).unwrap();
    let b = data(2 << 20, 15);
    direct.write_at(&b, 1 << 20).unwrap();
    buffered.read_at(&mut got[..2 << 20], 1 << 20).unwrap();
    assert!(got[..2 << 20] == b[..], "buffered read after direct write");
}

#[test]
fn tmpfs_refuses_direct_and_falls_back() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let content = data(3 << 20, 16);
    let path = make_file(dir.path(), "f", &content);
    let f = File::options()
        .settings(settings(DirectMode::On, true, 1 << 20))
        .open(&path, "r+")
        .unwrap();
    match f.direct_support() {
        DirectSupport::Unsupported { reason } => assert!(reason.contains("refused"), "{reason}"),
        // Kernels from 6.6 on accept O_DIRECT on tmpfs; then it must simply work.
        DirectSupport::Available { .. } => eprintln!("note: this kernel's tmpfs accepts O_DIRECT"),
    }
    let mut buf = vec![0u8; 3 << 20];
    assert_eq!(f.read_at(&mut buf[1..], 1).unwrap(), (3 << 20) - 1);
    assert!(buf[1..] == content[1..]);
    f.write_at(&content[..5000], 7).unwrap();
    let got = std::fs::read(&path).unwrap();
    assert!(got[7..5007] == content[..5000]);
}

#[test]
fn direct_reads_never_write_past_end_of_file_into_the_buffer() {
    let dir = disk_dir();
    let len = 3 * 4096 + 100;
    let content = data(len, 17);
    let path = make_file(dir.path(), "f", &content);
    for overread in [false, true] {
        let f = File::options()
            .settings(settings(DirectMode::On, overread, 1 << 20))
            .open(&path, "r")
            .unwrap();
        for offset in [0u64, 4096, 512] {
            pagecache::drop_file(&path).unwrap();
            // Page-aligned memory, so the direct read lands in it without scratch.
            let mut buf = ferrio::AlignedBuf::new(8 * 4096, 4096).unwrap();
            buf.as_mut_slice().fill(POISON);
            let n = f.read_at(buf.as_mut_slice(), offset).unwrap();
            assert_eq!(n, len - offset as usize);
            assert!(buf.as_slice()[..n] == content[offset as usize..]);
            let past = &buf.as_slice()[n..];
            assert!(
                past.iter().all(|&b| b == POISON),
                "overread={overread} offset={offset}: {} bytes past EOF were overwritten",
                past.iter().filter(|&&b| b != POISON).count()
            );
        }
    }
}

#[test]
fn a_parallel_direct_write_past_the_end_preallocates_once_and_writes_exactly() {
    let d = disk_dir();
    let path = make_file(d.path(), "grow", b"head");
    let f = File::options()
        .settings(settings(DirectMode::On, false, 1 << 20))
        .open(&path, "r+")
        .unwrap();
    if !matches!(f.direct_support(), DirectSupport::Available { .. }) {
        eprintln!("skipped: no O_DIRECT here");
        return;
    }
    // A hole between the old end and the write stays a hole; the new range is exact.
    let at = 3 << 20;
    let bytes = data((6 << 20) + 4096, 41);
    assert_eq!(f.write_at(&bytes, at).unwrap(), bytes.len());
    assert_eq!(f.len().unwrap(), at + bytes.len() as u64);
    let back = std::fs::read(&path).unwrap();
    assert_eq!(&back[..4], b"head");
    assert!(back[4..at as usize].iter().all(|&b| b == 0));
    assert!(back[at as usize..] == bytes[..], "written bytes differ");
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
    assert!(
        allocated < at + bytes.len() as u64,
        "the hole before the write was filled: {allocated} bytes allocated"
    );
}

#[test]
fn a_direct_write_too_big_for_the_disk_fails_before_writing_anything() {
    let lfs = match super::common::LoopFs::new(48) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop file system: {why}");
            return;
        }
    };
    let mnt = lfs.mount_point();
    let path = make_file(&mnt, "target", b"old content");
    // Leave about 4 MiB free, then write 16 MiB directly, 1 MiB per task.
    let free = ferrio::sys::free_bytes(&mnt).unwrap();
    File::options()
        .open(mnt.join("filler"), "w")
        .unwrap()
        .allocate(free.saturating_sub(4 << 20))
        .unwrap();
    let f = File::options()
        .settings(settings(DirectMode::On, false, 1 << 20))
        .open(&path, "r+")
        .unwrap();
    if !matches!(f.direct_support(), DirectSupport::Available { .. }) {
        eprintln!("skipped: no O_DIRECT on the loop file system");
        return;
    }
    let bytes = data(16 << 20, 43);
    let e = f.write_at(&bytes, 4096).unwrap_err();
    assert_eq!(
        e.os_error().and_then(|e| e.raw_os_error()),
        Some(libc::ENOSPC),
        "{e}"
    );
    assert!(e.to_string().contains("No space left"), "{e}");
    assert_eq!(e.path(), Some(path.as_path()), "names the file: {e}");
    // Nothing of the new data landed: the write failed before its first task, and the file
    // is as long as it was (the failed preallocation had moved its end as far as it got, and
    // appends then landed after that run of zeros).
    assert_eq!(std::fs::read(&path).unwrap(), b"old content");
    let appending = File::options()
        .settings(settings(DirectMode::On, false, 1 << 20))
        .open(&path, "a")
        .unwrap();
    assert!(appending.write_at(&bytes, 0).is_err());
    appending.write_at(b" tail", 0).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"old content tail");
}

#[test]
fn a_cancelled_write_past_the_end_leaves_the_file_as_long_as_it_was() {
    let d = disk_dir();
    let path = make_file(d.path(), "grow", b"head");
    let f = File::options()
        .settings(settings(DirectMode::On, false, 1 << 20))
        .open(&path, "r+")
        .unwrap();
    if !matches!(f.direct_support(), DirectSupport::Available { .. }) {
        eprintln!("skipped: no O_DIRECT here");
        return;
    }
    // 64 tasks: a cancel at once finds most of them not yet started. The write had moved the
    // end to 64 MiB before its first task, and a cancel left it there, zeros and all.
    let mut cancelled = 0;
    for _ in 0..5 {
        let fut = f.pwrite(data(64 << 20, 44), 4096);
        let asked = fut.cancel();
        let (result, _) = fut.into_buffer();
        if asked {
            assert!(
                matches!(result, Err(ferrio::Error::Cancelled)),
                "{result:?}"
            );
            assert_eq!(
                f.len().unwrap(),
                4,
                "a cancelled write left the file longer"
            );
            cancelled += 1;
        } else {
            assert_eq!(result.unwrap(), 64 << 20);
            f.set_len(4).unwrap();
        }
    }
    assert!(cancelled > 0, "no write was cancelled in time");
}

#[test]
fn a_cancelled_extending_write_leaves_another_writes_bytes_alone() {
    let d = disk_dir();
    let path = make_file(d.path(), "grow", b"");
    // Small tasks, so that A is still running when B is done; small sizes, so that a disk
    // shared with other tests does not run out (a CI disk once did at 128 MiB).
    let f = File::options()
        .settings(settings(DirectMode::On, false, 64 << 10))
        .open(&path, "r+")
        .unwrap();
    if !matches!(f.direct_support(), DirectSupport::Available { .. }) {
        eprintln!("skipped: no O_DIRECT here");
        return;
    }
    // A moves the end to 32 MiB; B writes inside that range while A runs and succeeds; A is
    // cancelled. Putting the end back to 0 took B's bytes with it, though B had succeeded.
    let mut cancelled = 0;
    for _ in 0..10 {
        f.set_len(0).unwrap();
        let a = f.pwrite(data(16 << 20, 45), 16 << 20);
        let b = f.pwrite(data(1 << 20, 46), 0);
        let (b_result, _) = b.into_buffer();
        assert_eq!(b_result.unwrap(), 1 << 20);
        if a.cancel() {
            cancelled += 1;
        }
        let _ = a.into_buffer();
        let back = std::fs::read(&path).unwrap();
        assert!(
            back.len() >= 1 << 20,
            "B's bytes were cut off: {} left",
            back.len()
        );
        assert!(
            back[..1 << 20] == data(1 << 20, 46)[..],
            "B's bytes changed"
        );
    }
    assert!(cancelled > 0, "A was never cancelled while it ran");
}

/// How many of this process's descriptors are open on `p`.
fn descriptors_on(p: &std::path::Path) -> usize {
    descriptors_naming(&p.canonicalize().unwrap())
}

/// How many of this process's descriptors `/proc/self/fd` shows as `target` (a deleted file's
/// name ends in " (deleted)" there).
fn descriptors_naming(target: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|shown| shown == target)
        .count()
}

#[test]
fn a_file_read_through_the_page_cache_holds_one_descriptor() {
    use ferrio::CacheMode;
    let dir = disk_dir();
    let content = data(3 << 20, 12);
    let p = make_file(dir.path(), "one", &content);
    let kept = File::options()
        .cache(CacheMode::Keep)
        .open(&p, "r")
        .unwrap();
    let mut buf = vec![POISON; content.len()];
    assert_eq!(kept.read_at(&mut buf, 0).unwrap(), content.len());
    assert!(buf == content);
    assert_eq!(
        descriptors_on(&p),
        1,
        "a kept file's reads need no O_DIRECT descriptor"
    );
    // Asking about direct I/O opens the direct descriptor, where the file system gives one.
    let available = kept.direct_support().is_available();
    assert_eq!(descriptors_on(&p), 1 + available as usize);
    drop(kept);
    // The descriptors close with the last clone, which a worker may hold a moment longer.
    let t0 = std::time::Instant::now();
    while descriptors_on(&p) > 0 && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(descriptors_on(&p), 0);
    // A file whose cold reads bypass the cache opens it at its first read, which uses it
    // (until then one descriptor each: a sharded checkpoint opens every file first).
    let bypassed = File::options()
        .cache(CacheMode::Bypass)
        .open(&p, "r")
        .unwrap();
    assert_eq!(descriptors_on(&p), 1);
    ferrio::pagecache::drop_file(&p).unwrap(); // cold: the direct path
    buf.fill(POISON);
    assert_eq!(bypassed.read_at(&mut buf, 0).unwrap(), content.len());
    assert!(buf == content);
    assert_eq!(descriptors_on(&p), 1 + available as usize);
}

#[test]
fn a_direct_descriptor_opened_late_is_of_the_file_opened_even_when_its_path_is_gone() {
    use ferrio::CacheMode;
    let dir = disk_dir();
    let content = data((2 << 20) + 5, 13);
    let p = make_file(dir.path(), "late", &content);
    let f = File::options()
        .cache(CacheMode::Keep)
        .direct_read(DirectMode::On)
        .open(&p, "r")
        .unwrap();
    // The path now names another file, and then nothing: the direct descriptor opened at the
    // first read must still be the file that was opened.
    std::fs::rename(&p, dir.path().join("moved")).unwrap();
    make_file(dir.path(), "late", &data(content.len(), 14));
    std::fs::remove_file(dir.path().join("moved")).unwrap();
    let mut buf = vec![POISON; content.len()];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), content.len());
    assert!(buf == content, "read another file's bytes");
    // Both descriptors are on the opened file, now unlinked; none on the file at the path. (A
    // reopen by path would have found another file there, and given up direct I/O.)
    let here = File::open(&p, "r").unwrap().direct_support().is_available();
    let available = f.direct_support().is_available();
    assert_eq!(available, here, "{:?}", f.direct_support());
    let available = available as usize;
    let gone = format!(
        "{} (deleted)",
        dir.path().canonicalize().unwrap().join("moved").display()
    );
    assert_eq!(
        descriptors_naming(std::path::Path::new(&gone)),
        1 + available
    );
    assert_eq!(descriptors_on(&p), 0);
}

#[test]
fn a_file_written_through_the_page_cache_holds_one_descriptor() {
    use ferrio::policy::WriteProbe;
    use ferrio::CacheMode;
    let dir = disk_dir();
    let content = data(4 << 20, 16);
    let here = File::open(make_file(dir.path(), "probe", b"x"), "r")
        .unwrap()
        .direct_support()
        .is_available();
    // Buffered twice as fast as direct on this "device", and the other way round.
    let prefers = |buffered: f64| WriteProbe {
        buffered: buffered * (1u64 << 30) as f64,
        direct: (1u64 << 30) as f64,
    };
    for (name, cache, probe, direct_writes) in [
        ("keep", CacheMode::Keep, prefers(2.0), false),
        ("auto-buffered", CacheMode::Auto, prefers(2.0), false),
        ("auto-direct", CacheMode::Auto, prefers(0.25), true),
    ] {
        let p = dir.path().join(name);
        let f = File::options()
            .cache(cache)
            .assume_write_probe(probe)
            .open(&p, "w")
            .unwrap();
        assert_eq!(f.write_at(&content, 0).unwrap(), content.len());
        let two = direct_writes && here;
        assert_eq!(descriptors_on(&p), 1 + two as usize, "{name}");
        drop(f);
        assert!(std::fs::read(&p).unwrap() == content, "{name}");
    }
}
