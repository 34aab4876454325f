//! A forked child builds its own worker pools (issue 14): after the parent has used a device's
//! pool, reads in the child complete, through a file it opens and through one the parent opened,
//! and the child's statistics show only its own pools.
//!
//! The fork runs in a fresh copy of this test binary that runs one test only, so that no other
//! test's thread holds a lock at the moment of the fork; both that copy and the forked child
//! run under a deadline and are killed past it, so a regression fails instead of hanging.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::common::{data, disk_dir, make_file};

/// Set in the environment of the copy of this binary that forks: a file it writes once its
/// checks have passed (so the outer test knows the inner one ran, not was filtered out).
const INNER: &str = "FERRIO_TEST_FORK_INNER";

/// How long the forked child may take; the copy of the binary gets twice as long, so that it
/// is the one that kills a hung child (a child outliving its killed parent would be orphaned).
const DEADLINE: Duration = Duration::from_secs(30);

const MIB: usize = 1 << 20;

/// Waits for `child` up to `limit`; kills it past that and says so.
fn wait_with_deadline(
    mut child: Child,
    limit: Duration,
) -> Result<std::process::ExitStatus, String> {
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {limit:?}: killed (a hang)"));
            }
            Err(e) => return Err(format!("waiting for the child: {e}")),
        }
    }
}

/// Forks; the child runs `child` (a panic is exit code 20) and leaves with `_exit`, never
/// returning into the test harness. Returns the child's pid, in the parent.
///
/// # Safety
/// No other thread of this process may hold, at the fork, a lock that `child` needs, beyond
/// those the test is about.
unsafe fn fork_child(child: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the caller's promise; the child leaves below, without returning.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(20);
        // SAFETY: ends the child at once, running no destructor or exit handler of the parent's.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// The wait status of the forked child `pid` once it ends; `None` if it still runs after
/// `limit` (a hang: it is killed and reaped).
fn reap_within(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let t0 = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is writable.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(status);
        }
        if t0.elapsed() > limit {
            // SAFETY: `pid` is our child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for the forked child `pid` (see [`reap_within`]) and checks it exited with 0.
fn assert_child_passed(pid: libc::pid_t, what: &str) {
    let status = reap_within(pid, DEADLINE)
        .unwrap_or_else(|| panic!("{what} hung: killed after {DEADLINE:?}"));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what} failed: wait status {status:#x} (exit code {})",
        libc::WEXITSTATUS(status)
    );
}

#[test]
fn a_forked_child_reads_through_its_own_pools() {
    run_inner("it::fork::inner_fork_and_read_in_the_child");
}

/// What the forked child checks; returns the exit code (0: all well).
fn in_child(
    parent_file: &ferrio::File,
    path: &std::path::Path,
    want: &[u8],
    pending: ferrio::IoFuture<Vec<u8>>,
) -> i32 {
    // A read the parent started before the fork runs on the parent's threads only: waiting for
    // it here fails at once instead of hanging.
    if pending.wait().is_ok() {
        return 9;
    }
    let mut buf = vec![0u8; MIB];
    // A file the parent opened (its handle points at the parent's pool).
    match parent_file.read_at(&mut buf, 0) {
        Ok(n) if n == MIB && buf == want => {}
        _ => return 10,
    }
    // A file the child opens.
    buf.fill(0);
    let Ok(f) = ferrio::File::open(path, "r") else {
        return 11;
    };
    match f.read_at(&mut buf, 0) {
        Ok(n) if n == MIB && buf == want => {}
        _ => return 12,
    }
    // Only the child's own pools, counting only the child's two reads.
    let read: u64 = ferrio::stats().iter().map(|p| p.bytes_read).sum();
    if read != 2 * MIB as u64 {
        return 13;
    }
    if ferrio::pool::total_threads() == 0 || f.pool().stats().bytes_read != 2 * MIB as u64 {
        return 14;
    }
    0
}

#[test]
#[ignore = "run by a_forked_child_reads_through_its_own_pools in a process of its own"]
fn inner_fork_and_read_in_the_child() {
    let Some(passed) = std::env::var_os(INNER) else {
        return;
    };
    let dir = disk_dir();
    let bytes = data(2 * MIB, 14);
    let path = make_file(dir.path(), "big.bin", &bytes);
    let file = ferrio::File::open(&path, "r").expect("open");
    let mut buf = vec![0u8; MIB];
    // More than a request run inline: it goes to the pool and starts its threads.
    assert_eq!(file.read_at(&mut buf, 0).expect("read in the parent"), MIB);
    assert!(
        file.pool().stats().threads > 0,
        "the parent's pool has threads"
    );
    let want = &bytes[..MIB];
    let pending = file.pread(vec![0u8; 2 * MIB], 0);

    // The child takes the pending read; the parent keeps its own copy of it.
    let pending = std::cell::Cell::new(Some(pending));
    // SAFETY: this process runs one test on one thread, and ferrio's workers hold no lock
    // the child's reads need.
    let pid = unsafe { fork_child(|| in_child(&file, &path, want, pending.take().unwrap())) };
    assert_child_passed(pid, "the forked child's reads");
    // The parent's pool still serves the parent.
    let (n, got) = pending.take().expect("the parent's read").into_buffer();
    assert_eq!(n.expect("the read started before the fork"), 2 * MIB);
    assert_eq!(got, bytes);
    assert_eq!(file.read_at(&mut buf, MIB as u64).expect("read after"), MIB);
    assert_eq!(buf, bytes[MIB..]);
    std::fs::write(passed, b"").expect("say the checks passed");
}

/// Runs the ignored test `inner` in a copy of this binary (so that only its threads are there at
/// the fork) under a deadline, and checks that it ran and passed.
fn run_inner(inner: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = disk_dir();
    let passed = dir.path().join("passed");
    let child = Command::new(exe)
        .args([
            inner,
            "--exact",
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(INNER, &passed)
        .spawn()
        .expect("start a copy of the test binary");
    let status =
        wait_with_deadline(child, 2 * DEADLINE).unwrap_or_else(|e| panic!("the forking test: {e}"));
    assert!(status.success(), "the forking test failed: {status}");
    assert!(passed.exists(), "the forking test did not run");
}

/// A file of 2 MiB (`bytes`) opened to read with `O_DIRECT` (`direct_read=on`), whose direct
/// descriptor is not made yet, and whether direct I/O works there (asked through another handle).
fn direct_file(dir: &std::path::Path, seed: u64) -> (Vec<u8>, ferrio::File, bool) {
    let bytes = data(2 * MIB, seed);
    let path = make_file(dir, "late.bin", &bytes);
    let file = ferrio::File::options()
        .cache(ferrio::CacheMode::Keep)
        .direct_read(ferrio::DirectMode::On)
        .open(&path, "r")
        .expect("open");
    let here = ferrio::File::open(&path, "r")
        .expect("open")
        .direct_support()
        .is_available();
    (bytes, file, here)
}

/// What a forked process checks of a direct read of [`direct_file`]: its bytes, and that
/// direct I/O is found as the opener found it. The exit code (0: all well).
fn read_directly(file: &ferrio::File, bytes: &[u8], here: bool) -> i32 {
    let mut buf = vec![0u8; bytes.len()];
    match file.read_at(&mut buf, 0) {
        Ok(n) if n == bytes.len() && buf == bytes => {}
        _ => return 10,
    }
    if file.direct_support().is_available() != here {
        return 11;
    }
    0
}

/// Starts a thread that asks `file` about direct I/O, which makes its direct descriptor, held
/// `delay_ms` first by the testing hook; returns it once the thread is inside (200 ms later).
fn make_direct_descriptor_slowly(
    file: &ferrio::File,
    delay_ms: u64,
) -> std::thread::JoinHandle<bool> {
    ferrio::file::DIRECT_OPEN_DELAY_MS.store(delay_ms, std::sync::atomic::Ordering::SeqCst);
    let asking = file.clone();
    let asker = std::thread::spawn(move || asking.direct_support().is_available());
    std::thread::sleep(Duration::from_millis(200));
    asker
}

/// In a forked process: no more waiting in the making of direct descriptors.
fn no_direct_open_delay() {
    ferrio::file::DIRECT_OPEN_DELAY_MS.store(0, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn a_forked_child_opens_its_own_direct_descriptor_if_the_parents_was_half_opened() {
    run_inner("it::fork::inner_fork_while_the_direct_descriptor_is_opened");
}

/// A parent thread is opening a file's `O_DIRECT` descriptor (at its first direct read, held
/// there for a second by the testing hook) when the parent forks: the child's direct read of
/// the inherited handle must not wait for a thread it does not have.
#[test]
#[ignore = "run by a_forked_child_opens_its_own_direct_descriptor_if_the_parents_was_half_opened"]
fn inner_fork_while_the_direct_descriptor_is_opened() {
    let Some(passed) = std::env::var_os(INNER) else {
        return;
    };
    let dir = disk_dir();
    let (bytes, file, here) = direct_file(dir.path(), 15);
    let asker = make_direct_descriptor_slowly(&file, 1000);

    // SAFETY: the other thread of this process sleeps in ferrio, holding no lock but the one
    // this test is about.
    let pid = unsafe {
        fork_child(|| {
            no_direct_open_delay();
            read_directly(&file, &bytes, here)
        })
    };
    assert_child_passed(pid, "the forked child's direct read");
    assert_eq!(asker.join().expect("the asking thread"), here);
    let mut buf = vec![0u8; bytes.len()];
    assert_eq!(
        file.read_at(&mut buf, 0).expect("read in the parent"),
        bytes.len()
    );
    assert!(buf == bytes);
    std::fs::write(passed, b"").expect("say the checks passed");
}

#[test]
fn a_grandchild_opens_its_own_direct_descriptor_if_its_parents_was_half_opened() {
    run_inner("it::fork::inner_grandchild_while_the_childs_direct_descriptor_is_opened");
}

/// The opener never makes the file's `O_DIRECT` descriptor; its forked child starts making its
/// own on a thread (held there for a second by the testing hook) and forks again meanwhile: the
/// grandchild's direct read must not wait for a thread it does not have.
#[test]
#[ignore = "run by a_grandchild_opens_its_own_direct_descriptor_if_its_parents_was_half_opened"]
fn inner_grandchild_while_the_childs_direct_descriptor_is_opened() {
    let Some(passed) = std::env::var_os(INNER) else {
        return;
    };
    let dir = disk_dir();
    let (bytes, file, here) = direct_file(dir.path(), 16);
    let in_child = || {
        let asker = make_direct_descriptor_slowly(&file, 1000);
        // SAFETY: the child's other thread sleeps in ferrio, holding no lock but the one this
        // test is about.
        let grandchild = unsafe {
            fork_child(|| {
                no_direct_open_delay();
                read_directly(&file, &bytes, here)
            })
        };
        let code = match reap_within(grandchild, Duration::from_secs(10)) {
            None => 30, // the grandchild hung
            Some(status) if libc::WIFEXITED(status) => libc::WEXITSTATUS(status),
            Some(_) => 31,
        };
        if code != 0 {
            return code;
        }
        if asker.join().ok() != Some(here) {
            return 32;
        }
        0
    };
    // SAFETY: this process runs one test on one thread; ferrio's workers hold no lock the
    // child needs.
    let pid = unsafe { fork_child(in_child) };
    assert_child_passed(
        pid,
        "the child and its grandchild's direct read (30: it hung)",
    );
    std::fs::write(passed, b"").expect("say the checks passed");
}

/// Two handles to write through, with 1 MiB tasks: `w.bin` (mode `w+`) and `log.bin` (`a`).
fn write_handles(dir: &std::path::Path) -> (ferrio::File, ferrio::File) {
    let s = super::common::settings(ferrio::DirectMode::Off, false, MIB as u64);
    let file = ferrio::File::options()
        .settings(s.clone())
        .open(dir.join("w.bin"), "w+")
        .expect("open");
    let log = ferrio::File::options()
        .settings(s)
        .open(dir.join("log.bin"), "a")
        .expect("open for appends");
    (file, log)
}

/// Two threads writing and appending through [`write_handles`] without pause, until stopped.
struct BusyWriters {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyWriters {
    fn start(file: &ferrio::File, log: &ferrio::File, seed: u64) -> BusyWriters {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..2u64)
            .map(|i| {
                let (file, log, stop) = (file.clone(), log.clone(), stop.clone());
                let chunk = data(4 * MIB, seed + i);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        file.write_at(&chunk, i * 4 * MIB as u64)
                            .expect("a busy write");
                        log.write_at(&chunk[..64 << 10], 0).expect("a busy append");
                    }
                })
            })
            .collect();
        BusyWriters { stop, threads }
    }

    /// Stops the threads; whether every write of theirs succeeded.
    fn stop(self) -> bool {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.into_iter().all(|t| t.join().is_ok())
    }
}

/// Forks `rounds` times, a few ms apart, while [`BusyWriters`] run; each new process writes and
/// appends once through the handles and must end within 2 s. Returns how many hung and how
/// many ended otherwise than with exit code 0.
fn fork_and_write(rounds: u64, file: &ferrio::File, log: &ferrio::File) -> (u32, u32) {
    let (mut hung, mut failed) = (0, 0);
    for round in 0..rounds {
        std::thread::sleep(Duration::from_millis(5 + round % 7));
        // SAFETY: the process's other threads are ferrio's and the busy writers; the locks they
        // may hold at the fork are what the tests are about.
        let pid = unsafe {
            fork_child(|| {
                let ok = file.write_at(b"from a forked process", 0).is_ok()
                    && log.write_at(b"a forked process's line\n", 0).is_ok();
                i32::from(!ok)
            })
        };
        match reap_within(pid, Duration::from_secs(2)) {
            Some(status) if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => {}
            Some(_) => failed += 1,
            None => hung += 1,
        }
    }
    (hung, failed)
}

#[test]
fn a_forked_child_writes_while_the_parent_was_writing_at_the_fork() {
    run_inner("it::fork::inner_fork_while_writing_and_write_in_the_child");
}

/// The parent writes and appends through one handle from other threads without pause, and
/// forks again and again: each child writes and appends through the inherited handle and must
/// end within 2 s (so 20 rounds stay inside the outer deadline): a lock that a parent thread
/// held at the fork must not stop it.
#[test]
#[ignore = "run by a_forked_child_writes_while_the_parent_was_writing_at_the_fork"]
fn inner_fork_while_writing_and_write_in_the_child() {
    let Some(passed) = std::env::var_os(INNER) else {
        return;
    };
    let dir = disk_dir();
    let (file, log) = write_handles(dir.path());
    let busy = BusyWriters::start(&file, &log, 30);
    let (hung, failed) = fork_and_write(20, &file, &log);
    assert!(busy.stop(), "a write of the parent's busy threads failed");
    assert_eq!(hung, 0, "{hung} of 20 forked children hung in a write");
    assert_eq!(failed, 0, "{failed} of 20 forked children's writes failed");
    std::fs::write(passed, b"").expect("say the checks passed");
}

#[test]
fn a_grandchild_writes_while_its_parent_was_writing_at_the_fork() {
    run_inner("it::fork::inner_grandchild_while_the_child_writes");
}

/// As `inner_fork_while_writing_and_write_in_the_child`, one generation down: a forked child
/// writes and appends through the opener's handles from two threads without pause and forks
/// again and again; each grandchild writes and appends through the same handles and must end
/// within 2 s: a lock the child's threads held at the fork must not stop it.
#[test]
#[ignore = "run by a_grandchild_writes_while_its_parent_was_writing_at_the_fork"]
fn inner_grandchild_while_the_child_writes() {
    let Some(passed) = std::env::var_os(INNER) else {
        return;
    };
    let dir = disk_dir();
    let (file, log) = write_handles(dir.path());
    let in_child = || {
        let busy = BusyWriters::start(&file, &log, 40);
        let (hung, failed) = fork_and_write(10, &file, &log);
        let busy_ok = busy.stop();
        match (hung, failed, busy_ok) {
            (0, 0, true) => 0,
            (0, 0, false) => 21,              // a busy write of the child failed
            (0, _, _) => 20,                  // a grandchild's writes failed
            (hung, _, _) => 30 + hung as i32, // 31..40: that many of 10 grandchildren hung
        }
    };
    // SAFETY: this process runs one test on one thread; ferrio's workers hold no lock the
    // child needs.
    let pid = unsafe { fork_child(in_child) };
    assert_child_passed(
        pid,
        "the writing child and its grandchildren (31-40: that many hung, 20: a write failed)",
    );
    std::fs::write(passed, b"").expect("say the checks passed");
}
