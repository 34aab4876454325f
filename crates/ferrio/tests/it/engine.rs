//! Round trips, end of file, append, many threads, futures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrio::{DirectMode, File, Settings};
use proptest::prelude::*;

use super::common::{data, disk_dir, make_file, settings, POISON};

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_round_trips(
        file_len in 0usize..3 << 20,
        offset in 0u64..3 << 20,
        len in 0usize..3 << 20,
        task_size in prop::sample::select(vec![1u64, 4096, 65536, 100_000, 1 << 20, 4 << 20]),
        threads in 1usize..6,
        seed in any::<u64>(),
    ) {
        let dir = disk_dir();
        let content = data(file_len, seed);
        let path = make_file(dir.path(), "f", &content);
        let mut s = Settings::default();
        s.task_size = task_size.max(512);
        s.threads_per_device = threads;
        let f = File::options().settings(s).open(&path, "r+").unwrap();
        // Read: a short count exactly at end of file.
        let mut buf = vec![POISON; len];
        let n = f.read_at(&mut buf, offset).unwrap();
        let start = (offset as usize).min(file_len);
        let expect = &content[start..(start + len).min(file_len)];
        prop_assert_eq!(n, expect.len());
        prop_assert_eq!(&buf[..n], expect);
        prop_assert!(buf[n..].iter().all(|&b| b == POISON), "bytes past EOF untouched");
        // Write, then read back with std.
        let patch = data(len, seed ^ 1);
        prop_assert_eq!(f.write_at(&patch, offset).unwrap(), len);
        let mut model = content.clone();
        let end = offset as usize + len;
        if len > 0 && model.len() < end { model.resize(end, 0); }
        model[offset as usize..offset as usize + len].copy_from_slice(&patch);
        let on_disk = std::fs::read(&path).unwrap();
        prop_assert_eq!(on_disk.len(), model.len());
        prop_assert!(on_disk == model, "file differs after write");
    }
}

#[test]
fn reads_at_and_past_eof_are_short_not_errors() {
    let dir = disk_dir();
    let content = data(10_000, 7);
    let path = make_file(dir.path(), "f", &content);
    let f = File::open(&path, "r").unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(f.read_at(&mut buf, 8_000).unwrap(), 2_000);
    assert_eq!(&buf[..2_000], &content[8_000..]);
    assert_eq!(f.read_at(&mut buf, 10_000).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, 1 << 40).unwrap(), 0);
    assert_eq!(f.read_at(&mut [], 5).unwrap(), 0, "zero length");
}

#[test]
fn append_mode_writes_at_the_end_and_in_order_of_calls() {
    let dir = disk_dir();
    let path = make_file(dir.path(), "log", b"head:");
    let f = File::open(&path, "a").unwrap();
    let a = data(5 << 20, 1);
    let b = data(3 << 20, 2);
    f.write_at(&a, 0).unwrap();
    f.write_at(&b, 12345).unwrap(); // offsets are ignored in append mode
    let got = std::fs::read(&path).unwrap();
    assert_eq!(&got[..5], b"head:");
    assert_eq!(&got[5..5 + a.len()], &a[..]);
    assert_eq!(&got[5 + a.len()..], &b[..]);
    assert!(f.read_at(&mut [0u8; 4], 0).is_err(), "mode a is write-only");
    let g = File::open(&path, "a+").unwrap();
    let mut head = [0u8; 5];
    assert_eq!(g.read_at(&mut head, 0).unwrap(), 5);
    assert_eq!(&head, b"head:");
}

#[test]
fn appends_go_after_what_others_appended_as_with_o_append() {
    use std::io::Write;
    let dir = disk_dir();
    let path = make_file(dir.path(), "log", b"head:");
    let f = File::open(&path, "a").unwrap();
    let g = File::open(&path, "a").unwrap();
    let mut std_file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_at(b"f1;", 0).unwrap();
    std_file.write_all(b"std;").unwrap();
    g.write_at(b"g1;", 0).unwrap();
    let big = data(3 << 20, 3);
    f.write_at(&big, 0).unwrap();
    std_file.write_all(b"end").unwrap();
    let mut want = b"head:f1;std;g1;".to_vec();
    want.extend_from_slice(&big);
    want.extend_from_slice(b"end");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        want,
        "no append lost or overwritten"
    );
    // Truncated by someone else: the next append starts at the new end, leaving no hole.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(2)
        .unwrap();
    f.write_at(b"!", 0).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"he!");
}

#[test]
fn modes_create_truncate_and_refuse() {
    let dir = disk_dir();
    let p = dir.path().join("new");
    assert!(File::open(&p, "r").is_err(), "r needs an existing file");
    assert!(File::open(&p, "r+").is_err(), "r+ needs an existing file");
    let w = File::open(&p, "w").unwrap();
    w.write_at(b"hello world", 0).unwrap();
    assert!(w.read_at(&mut [0u8; 3], 0).is_err(), "w is write-only");
    let w2 = File::open(&p, "w+").unwrap();
    assert_eq!(w2.len().unwrap(), 0, "w+ truncates");
    w2.write_at(b"abc", 0).unwrap();
    let mut b = [0u8; 3];
    w2.read_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"abc");
    let r = File::open(&p, "rb").unwrap();
    let e = r.write_at(b"x", 0).unwrap_err();
    assert!(e.to_string().contains("does not allow write"), "{e}");
    assert!(File::open(&p, "rw").unwrap_err().to_string().contains("r+"));
}

#[test]
fn many_threads_share_one_file() {
    let dir = disk_dir();
    let content = data(16 << 20, 3);
    let path = make_file(dir.path(), "f", &content);
    let mut s = Settings::default();
    s.task_size = 256 << 10;
    let f = File::options().settings(s).open(&path, "r+").unwrap();
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let f = f.clone();
            let content = &content;
            scope.spawn(move || {
                for i in 0..20u64 {
                    let off = (t * 1_000_003 + i * 77_777) % (15 << 20);
                    let len = ((t + 1) * (i + 1) * 13_001) as usize % (1 << 20) + 1;
                    let mut buf = vec![0u8; len];
                    let n = f.read_at(&mut buf, off).unwrap();
                    assert_eq!(&buf[..n], &content[off as usize..off as usize + n]);
                    assert_eq!(n, len);
                }
            });
        }
    });
    // Concurrent writers to disjoint ranges.
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let f = f.clone();
            scope.spawn(move || {
                let chunk = data(2 << 20, 100 + t);
                f.write_at(&chunk, t * (2 << 20)).unwrap();
            });
        }
    });
    let got = std::fs::read(&path).unwrap();
    for t in 0..8u64 {
        let s = (t * (2 << 20)) as usize;
        assert!(
            got[s..s + (2 << 20)] == data(2 << 20, 100 + t)[..],
            "writer {t}"
        );
    }
}

#[test]
fn futures_wait_poll_timeout_callback_and_wait_all() {
    let dir = disk_dir();
    let content = data(9 << 20, 4);
    let path = make_file(dir.path(), "f", &content);
    let f = File::options().task_size(1 << 20).open(&path, "r").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let fut = f.pread(vec![0u8; 9 << 20], 0);
    let c = Arc::clone(&calls);
    fut.on_done(move |r| {
        assert_eq!(r.unwrap(), 9 << 20);
        c.fetch_add(1, Ordering::SeqCst);
    });
    assert!(fut.wait_timeout(Duration::from_secs(30)));
    assert!(fut.is_done());
    assert_eq!(fut.bytes(), 9 << 20);
    assert_eq!(fut.try_result().unwrap().unwrap(), 9 << 20);
    let (r, buf) = fut.into_buffer();
    assert_eq!(r.unwrap(), 9 << 20);
    assert!(buf == content);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // A callback registered after completion runs at once.
    let done = f.pread(vec![0u8; 10], 0);
    let _ = done.wait_timeout(Duration::from_secs(30));
    let c = Arc::clone(&calls);
    done.on_done(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let futs: Vec<_> = (0..4)
        .map(|i| f.pread(vec![0u8; 1 << 20], i << 20))
        .collect();
    assert_eq!(ferrio::wait_all(futs).unwrap(), 4 << 20);
}

#[test]
fn a_cancel_before_the_outcome_is_known_always_ends_cancelled_and_one_after_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let content = data(1 << 20, 3);
    let path = make_file(dir.path(), "f", &content);
    let f = File::options()
        .settings(settings(DirectMode::Off, false, 1 << 20))
        .open(&path, "r")
        .unwrap();
    // One task: once it runs, nothing is left to skip, yet a cancel that comes before it has
    // reported still makes the outcome a cancel (never a success after `cancel` said true).
    for _ in 0..50 {
        let fut = f.pread(vec![0u8; 1 << 20], 0);
        let asked = fut.cancel();
        let (result, _) = fut.into_buffer();
        if asked {
            assert!(
                matches!(result, Err(ferrio::Error::Cancelled)),
                "{result:?}"
            );
        } else {
            assert_eq!(result.unwrap(), 1 << 20);
        }
    }
    let fut = f.pread(vec![0u8; 1 << 20], 0);
    while !fut.is_done() {
        std::thread::yield_now();
    }
    assert!(!fut.cancel(), "a finished read cannot be cancelled");
    let (result, buf) = fut.into_buffer();
    assert_eq!(result.unwrap(), 1 << 20);
    assert_eq!(buf, content);
}

#[test]
fn a_cancelled_request_does_not_wait_its_turn_behind_other_requests() {
    // A file system of its own (tmpfs) gives a pool of its own, here of one thread, so the order
    // in which tasks run is deterministic and no other test shares the pool.
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("skipped: no /dev/shm for a pool of its own");
        return;
    };
    let content = data(4 << 20, 9);
    let path = make_file(dir.path(), "f", &content);
    let mut s = settings(DirectMode::Off, false, 4096);
    s.threads_per_device = 1;
    let f = File::options().settings(s).open(&path, "r").unwrap();
    // 64 requests of 1024 tasks each share the pool round-robin with `mine`.
    let load: Arc<Vec<_>> = Arc::new((0..64).map(|_| f.pread(vec![0u8; 4 << 20], 0)).collect());
    let mine = f.pread(vec![0u8; 4 << 20], 0);
    mine.cancel();
    let at_cancel: u64 = load.iter().map(|l| l.bytes()).sum();
    // How far the load got when `mine` resolved, measured on the worker that resolved it.
    let (tx, rx) = std::sync::mpsc::channel();
    let observed = Arc::clone(&load);
    mine.on_done(move |_| {
        let done: u64 = observed.iter().map(|l| l.bytes()).sum();
        let _ = tx.send(done);
    });
    let (result, _) = mine.into_buffer();
    let load_done = rx.recv().unwrap() - at_cancel;
    let load_total = 64u64 * (4 << 20);
    assert!(
        matches!(result, Err(ferrio::Error::Cancelled)),
        "{result:?}"
    );
    // Skipping its tasks one turn at a time would let all but the last round of the load run
    // first; claimed at once, it resolves within the first two rounds.
    assert!(
        load_done < load_total / 10,
        "{load_done} of {load_total} load bytes ran between the cancel and its resolution"
    );
    for l in load.iter() {
        while !l.wait_timeout(Duration::from_secs(1)) {}
    }
}

#[test]
fn dropping_a_future_waits_for_its_tasks() {
    let dir = disk_dir();
    let content = data(8 << 20, 5);
    let path = make_file(dir.path(), "f", &content);
    let f = File::options()
        .task_size(64 << 10)
        .open(&path, "r")
        .unwrap();
    let mut buf = vec![0u8; 8 << 20];
    {
        // SAFETY: the future is dropped (which waits) before `buf` is touched again.
        let fut = unsafe { f.pread_raw(buf.as_mut_ptr(), buf.len(), 0) };
        drop(fut);
    }
    assert!(buf == content, "every task finished before drop returned");
}

#[test]
fn per_call_task_size_and_one_global_pool() {
    let dir = disk_dir();
    let content = data(3 << 20, 6);
    let path = make_file(dir.path(), "f", &content);
    let mut s = Settings::default();
    s.per_device_pools = false;
    s.direct_read = DirectMode::Off;
    let f = File::options().settings(s).open(&path, "r").unwrap();
    assert_eq!(f.pool().key(), "global");
    let small = f.with_task_size(4096);
    assert_eq!(small.task_size(), 4096);
    let before = f.pool().stats().tasks;
    let mut buf = vec![0u8; 3 << 20];
    small.read_at(&mut buf, 0).unwrap();
    assert!(buf == content);
    assert!(
        f.pool().stats().tasks - before >= 768,
        "split into 4 KiB tasks"
    );
    assert!(ferrio::stats().iter().any(|p| p.key == "global"));
}

#[test]
fn settings_in_scope_apply_to_files_opened_there() {
    let dir = disk_dir();
    let path = make_file(dir.path(), "f", &data(100, 8));
    let _g = Settings::scope(settings(DirectMode::On, true, 8192));
    let f = File::open(&path, "r").unwrap();
    assert_eq!(f.task_size(), 8192);
    assert_eq!(f.direct_read(), DirectMode::On);
}
