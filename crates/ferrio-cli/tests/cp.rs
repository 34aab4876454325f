//! `ferrio cp` as a user runs it: trees, JSON summary, exit codes, Ctrl-C and a full disk.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::LoopFs;

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

/// Pseudo-random bytes: a 1 MiB random-looking block repeated, each copy stamped with its index.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut block = vec![0u8; (1 << 20).min(len.max(1))];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
    let mut out = Vec::with_capacity(len);
    let mut i = 0u64;
    while out.len() < len {
        let n = (len - out.len()).min(block.len());
        out.extend_from_slice(&block[..n]);
        let stamp = i.to_le_bytes();
        let at = out.len() - n;
        let k = n.min(8);
        out[at..at + k].copy_from_slice(&stamp[..k]);
        i += 1;
    }
    out
}

/// Asserts that `b` is a copy of `a` (kinds, link targets, bytes, names).
fn assert_same_tree(a: &Path, b: &Path) {
    let (ma, mb) = (
        fs::symlink_metadata(a).unwrap(),
        fs::symlink_metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display())),
    );
    assert_eq!(ma.file_type(), mb.file_type(), "{}", b.display());
    if ma.file_type().is_symlink() {
        assert_eq!(fs::read_link(a).unwrap(), fs::read_link(b).unwrap());
    } else if ma.is_file() {
        assert!(
            fs::read(a).unwrap() == fs::read(b).unwrap(),
            "{}",
            b.display()
        );
    } else {
        let names = |d: &Path| {
            let mut v: Vec<_> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(a), names(b), "{}", b.display());
        for n in names(a) {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    }
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().contains(".ferrio-") {
            out.push(e.path());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(temp_files(&e.path()));
        }
    }
    out
}

#[test]
fn cp_copies_a_tree_and_reports_json() {
    let d = tmp();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::write(src.join("a/b/big"), bytes(9 << 20, 1)).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    fs::write(src.join("sp ace ✓\nnl"), b"odd name").unwrap();
    std::os::unix::fs::symlink("a/b/big", src.join("link")).unwrap();
    let dst = d.path().join("dst");
    let o = ferrio()
        .args(["cp", "-r", "--json"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["files"], 3);
    assert_eq!(v["symlinks"], 1);
    assert_eq!(v["bytes"], (9 << 20) + 8);
    assert!(v["seconds"].as_f64().unwrap() > 0.0);
    let devices = v["devices"].as_array().unwrap();
    let read: u64 = devices
        .iter()
        .map(|d| d["bytes_read"].as_u64().unwrap())
        .sum();
    let written: u64 = devices
        .iter()
        .map(|d| d["bytes_written"].as_u64().unwrap())
        .sum();
    assert_eq!((read, written), ((9 << 20) + 8, (9 << 20) + 8));
    assert!(devices[0]["pool"].as_str().is_some_and(|p| !p.is_empty()));
    assert!(devices[0]["read_mib_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["errors"].as_array().unwrap().is_empty());
    assert_same_tree(&src, &dst);

    // Human output names the pools; -L copies what the link points to; --verify counts.
    let dst2 = d.path().join("dst2");
    let o = ferrio()
        .args(["cp", "-r", "-L", "--verify"])
        .arg(&src)
        .arg(&dst2)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("copied 4 files")
            && text.contains("4 verified")
            && text.contains("read from"),
        "{text}"
    );
    assert!(fs::symlink_metadata(dst2.join("link")).unwrap().is_file());
    assert!(temp_files(d.path()).is_empty());
}

#[test]
fn cp_usage_errors_exit_2_and_copy_nothing() {
    let d = tmp();
    let dir = d.path().join("dir");
    fs::create_dir(&dir).unwrap();
    let f = d.path().join("f");
    fs::write(&f, b"x").unwrap();
    let out = d.path().join("out");
    let nope = d.path().join("nope");
    for (args, needle) in [
        (vec![dir.as_path(), out.as_path()], "recursive"),
        (vec![nope.as_path(), out.as_path()], "nope"),
        (vec![f.as_path(), dir.as_path(), f.as_path()], "directory"),
    ] {
        let mut full: Vec<&Path> = vec![Path::new("cp")];
        full.extend(args);
        let o = run(&full);
        assert_eq!(o.status.code(), Some(2), "{full:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
    assert!(!out.exists());
    let o = run(&[Path::new("cp"), Path::new("only-one")]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn zero_files_windows_or_window_bytes_are_refused() {
    let d = tmp();
    let f = d.path().join("f");
    fs::write(&f, b"x").unwrap();
    let out = d.path().join("out");
    for (flag, needle) in [
        ("--files", "at least 1"),
        ("--windows", "at least 1"),
        ("--window", "at least 1 byte"),
    ] {
        let o = ferrio()
            .args(["cp", flag, "0"])
            .arg(&f)
            .arg(&out)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(flag) && stderr(&o).contains(needle),
            "{}",
            stderr(&o)
        );
        assert!(!out.exists());
    }
}

#[test]
fn a_source_given_twice_is_copied_once_and_hard_links_each() {
    let d = tmp();
    let a = d.path().join("a");
    fs::write(&a, b"x").unwrap();
    let b = d.path().join("b");
    fs::hard_link(&a, &b).unwrap();
    let dir = d.path().join("dir");
    fs::create_dir(&dir).unwrap();
    let again = d.path().join(".").join("a");
    let o = ferrio()
        .args(["cp", "--json"])
        .args([&a, &again, &b, &dir])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("given more than once"),
        "{}",
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["files"], 2, "{v}");
    assert_eq!(fs::read(dir.join("a")).unwrap(), b"x");
    assert_eq!(fs::read(dir.join("b")).unwrap(), b"x");
}

#[test]
fn cp_preserve_keeps_mode_and_mtime() {
    let d = tmp();
    let f = d.path().join("f");
    fs::write(&f, bytes(100_000, 2)).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o604)).unwrap();
    let when = std::time::UNIX_EPOCH + Duration::new(1_200_000_000, 987_654_321);
    fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(when)
        .unwrap();
    let o = run(&[Path::new("cp"), Path::new("-p"), &f, &d.path().join("g")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = fs::metadata(d.path().join("g")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o604);
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_200_000_000, 987_654_321));
    assert_eq!(fs::read(d.path().join("g")).unwrap(), bytes(100_000, 2));
}

#[test]
fn ctrl_c_during_cp_leaves_no_partial_file_and_exits_130() {
    signal_mid_copy(libc::SIGINT, 130);
}

#[test]
fn sigterm_during_cp_leaves_no_partial_file_and_exits_143() {
    // What `kill` and `timeout` send: left to the default action it would leave the temporary
    // file (a copy's worth of space) until the next copy into that directory.
    signal_mid_copy(libc::SIGTERM, 143);
}

#[test]
fn sighup_during_cp_leaves_no_partial_file_and_exits_129() {
    // What a closed terminal or a dropped SSH session sends.
    signal_mid_copy(libc::SIGHUP, 129);
}

#[test]
fn a_sighup_ignored_from_the_start_stays_ignored() {
    // `nohup ferrio cp ...`: the copy goes on through the hangup and completes.
    let d = tmp();
    let src = d.path().join("big");
    fs::write(&src, bytes(64 << 20, 5)).unwrap();
    let dst = d.path().join("copy");
    let mut child = slow_copy(&src, &dst, &[], (libc::SIGHUP, libc::SIG_IGN))
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while temp_files(d.path()).is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(fs::read(&dst).unwrap() == bytes(64 << 20, 5));
}

#[test]
fn a_copy_in_another_pid_namespace_keeps_its_temporary_file() {
    // Two containers with one host name sharing a volume: the process id in the other's
    // temporary name means nothing here, and its file is not a dead copy's. Its copy lost its
    // file to this one's sweep and failed at the rename.
    const PID: u32 = 77_777;
    if !common::is_root() || Path::new(&format!("/proc/{PID}")).exists() {
        eprintln!("skipped: needs root (unshare) and no process {PID} here");
        return;
    }
    let d = tmp();
    let src = d.path().join("big");
    fs::write(&src, bytes(128 << 20, 6)).unwrap();
    let shared = d.path().join("shared");
    fs::create_dir(&shared).unwrap();
    // In a new process id namespace, the copy runs as process PID (the next id after
    // `ns_last_pid`), one that does not exist out here.
    let script = format!(
        "echo {} > /proc/sys/kernel/ns_last_pid && \"$0\" cp --threads 1 --task-size 64KiB \
         --method read-write --verify \"$1\" \"$2\"",
        PID - 1
    );
    let spawned = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script])
        .arg(env!("CARGO_BIN_EXE_ferrio"))
        .arg(&src)
        .arg(&shared)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(other) = spawned else {
        eprintln!("skipped: unshare cannot run");
        return;
    };
    let t0 = Instant::now();
    while temp_files(&shared).is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let names = temp_files(&shared);
    if names.is_empty() {
        let o = other.wait_with_output().unwrap();
        eprintln!("skipped: the namespaced copy did not start: {}", stderr(&o));
        return;
    }
    assert!(
        names[0]
            .to_string_lossy()
            .contains(&format!("ferrio-{PID}-")),
        "{names:?}"
    );
    // A copy here, into the same directory, sweeps what dead copies left.
    let small = d.path().join("small");
    fs::write(&small, b"small").unwrap();
    let o = run(&[Path::new("cp"), &small, &shared.join("other")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = other.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(fs::read(shared.join("big")).unwrap() == bytes(128 << 20, 6));
}

/// `ferrio cp SRC DST EXTRA...` on one thread in small tasks through memory (slow enough to be
/// caught mid-copy), started with `action` (`SIG_DFL`, `SIG_IGN`) for signal `number`.
fn slow_copy(
    src: &Path,
    dst: &Path,
    extra: &[&str],
    (number, action): (libc::c_int, libc::sighandler_t),
) -> Command {
    let mut cmd = ferrio();
    cmd.args(["cp", "--threads", "1", "--task-size", "64KiB"])
        .args(["--method", "read-write"])
        .args(extra)
        .arg(src)
        .arg(dst)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            libc::signal(number, action);
            Ok(())
        });
    }
    cmd
}

/// Sends `signal` to a copy under way; it must exit with `code` and leave nothing behind.
fn signal_mid_copy(signal: libc::c_int, code: i32) {
    let d = tmp();
    let src = d.path().join("big");
    fs::write(&src, bytes(384 << 20, 3)).unwrap();
    let out = d.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("big"), b"old content").unwrap();
    // A verify makes it slower still. The copy starts with the signal's default action, as
    // from a terminal: a test run under `nohup` would otherwise hand it an ignored SIGHUP, which
    // the copy rightly keeps ignoring.
    let mut child = slow_copy(&src, &out, &["--verify"], (signal, libc::SIG_DFL))
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while temp_files(&out).is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(!temp_files(&out).is_empty(), "the copy never started");
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(code), "{status:?}");
    assert!(temp_files(&out).is_empty(), "left {:?}", temp_files(&out));
    assert_eq!(
        fs::read(out.join("big")).unwrap(),
        b"old content",
        "the old destination is untouched"
    );
}

#[test]
fn ctrl_c_during_cp_r_leaves_no_new_directory() {
    let d = tmp();
    let tree = d.path().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("sub").join("big"), bytes(384 << 20, 4)).unwrap();
    let out = d.path().join("out");
    let mut child = ferrio()
        .args(["cp", "-r", "--threads", "1", "--task-size", "64KiB"])
        .args(["--method", "read-write", "--verify"])
        .arg(&tree)
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sub = out.join("sub");
    let t0 = Instant::now();
    while temp_files(&sub).is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(!temp_files(&sub).is_empty(), "the copy never started");
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
    // The directories it made held only the interrupted file: none is left.
    assert!(!out.exists(), "left {}", out.display());
}

#[test]
fn a_rerun_removes_the_temporary_file_of_a_killed_cp() {
    let d = tmp();
    let src = d.path().join("big");
    fs::write(&src, bytes(256 << 20, 4)).unwrap();
    let out = d.path().join("out");
    fs::create_dir(&out).unwrap();
    let mut child = ferrio()
        .args([
            "cp",
            "--threads",
            "1",
            "--task-size",
            "64KiB",
            "--method",
            "read-write",
        ])
        .arg(&src)
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while temp_files(&out).is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    child.wait().unwrap();
    let left = temp_files(&out);
    assert_eq!(left.len(), 1, "SIGKILL leaves the temporary file: {left:?}");
    // A temporary name of a live process (this test's) and a file of the user's are kept.
    let live = out.join(format!(".other.ferrio-{}-x", std::process::id()));
    fs::write(&live, b"not ours to remove").unwrap();
    let o = run(&[Path::new("cp"), &src, &out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !left[0].exists(),
        "the re-run removes {}",
        left[0].display()
    );
    assert!(live.exists());
    assert!(fs::read(out.join("big")).unwrap() == bytes(256 << 20, 4));
}

#[test]
fn cp_refuses_to_replace_a_file_the_user_may_not_write() {
    let d = tmp();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let src = d.path().join("src");
    fs::write(&src, b"new").unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o644)).unwrap();
    let dst = d.path().join("dst");
    fs::write(&dst, b"protected").unwrap();
    fs::set_permissions(&dst, fs::Permissions::from_mode(0o444)).unwrap();
    let root = common::is_root();
    let o = if root {
        // Root may write anything (as with cp); the rule is checked as an unprivileged user, who
        // owns the read-only file in a directory everyone may write.
        let c = std::ffi::CString::new(dst.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a valid C string naming a file this test created.
        let rc = unsafe { libc::chown(c.as_ptr(), 65534, 65534) };
        assert_eq!(rc, 0);
        match Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_ferrio"))
            .arg("cp")
            .arg(&src)
            .arg(&dst)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                eprintln!("skipped: running as root and setpriv is unavailable ({e})");
                return;
            }
        }
    } else {
        run(&[Path::new("cp"), &src, &dst])
    };
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("may not write"), "{}", stderr(&o));
    assert_eq!(fs::read(&dst).unwrap(), b"protected");
    assert!(temp_files(d.path()).is_empty());
}

#[test]
fn cp_onto_a_full_disk_exits_1_naming_the_destination() {
    let lfs = match LoopFs::new(32) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop file system: {why}");
            return;
        }
    };
    let mnt = lfs.mnt();
    let keep = mnt.join("keep");
    fs::write(&keep, b"old content").unwrap();
    let src = lfs.dir.path().join("big");
    fs::write(&src, bytes(48 << 20, 4)).unwrap();
    let o = run(&[Path::new("cp"), &src, &keep]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("No space left") && err.contains("keep"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(fs::read(&keep).unwrap(), b"old content");
    assert!(temp_files(&mnt).is_empty(), "left {:?}", temp_files(&mnt));
}

/// Makes a special file at `p` with `mknod(2)` (`mode` holds its kind and permissions).
fn mknod(p: &Path, mode: libc::mode_t, dev: libc::dev_t) -> bool {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid C string naming a path in this test's directory.
    unsafe { libc::mknod(c.as_ptr(), mode, dev) == 0 }
}

#[test]
fn cp_never_replaces_a_device_or_fifo_with_a_file() {
    let d = tmp();
    let src = d.path().join("src");
    fs::write(&src, b"data").unwrap();
    let fifo = d.path().join("fifo");
    assert!(mknod(&fifo, libc::S_IFIFO | 0o644, 0), "mkfifo");
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let mut targets = vec![(fifo.clone(), "FIFO"), (link, "FIFO")];
    // The null device (1:3) needs root to make; a FIFO shows the same rule without it.
    let null = d.path().join("null");
    if mknod(&null, libc::S_IFCHR | 0o666, libc::makedev(1, 3)) {
        targets.push((null.clone(), "character device"));
    } else {
        eprintln!("character device part skipped: mknod needs root");
    }
    for (dst, kind) in &targets {
        let o = run(&[Path::new("cp"), &src, dst]);
        assert_eq!(o.status.code(), Some(1), "{dst:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(kind), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    if targets.len() == 3 {
        assert!(fs::symlink_metadata(&null)
            .unwrap()
            .file_type()
            .is_char_device());
    }
    assert!(temp_files(d.path()).is_empty());
}

#[test]
fn cp_r_into_itself_through_a_bind_mount_is_refused() {
    if !common::is_root() {
        eprintln!("skipped: needs root (mount --bind)");
        return;
    }
    let d = tmp();
    let (dir, view) = (d.path().join("dir"), d.path().join("view"));
    fs::create_dir(&dir).unwrap();
    fs::create_dir(&view).unwrap();
    fs::write(dir.join("f"), b"x").unwrap();
    let bound = Command::new("mount")
        .arg("--bind")
        .arg(&dir)
        .arg(&view)
        .status()
        .is_ok_and(|s| s.success());
    if !bound {
        eprintln!("skipped: mount --bind failed");
        return;
    }
    // `view` is `dir` under another name: `cp -r dir view/` would copy dir into dir/dir.
    let o = run(&[Path::new("cp"), Path::new("-r"), &dir, &view]);
    let _ = Command::new("umount").arg(&view).status();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("into itself"), "{}", stderr(&o));
    assert!(!dir.join("dir").exists(), "copied into itself");
}

#[test]
fn a_sysfs_attribute_is_copied_to_its_end() {
    // sysfs says 4096 bytes for an attribute, whatever it holds.
    let src = Path::new("/sys/class/net/lo/address");
    let Ok(want) = fs::read(src) else {
        eprintln!("skipped: {} is not readable here", src.display());
        return;
    };
    let d = tmp();
    let dst = d.path().join("address");
    let o = run(&[Path::new("cp"), src, &dst]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(fs::read(&dst).unwrap(), want);
}

#[test]
fn a_proc_file_copied_is_written_on_the_destination_s_pool() {
    let d = tmp();
    let f = d.path().join("f");
    fs::write(&f, b"x").unwrap();
    let writer = |src: &Path, name: &str| -> serde_json::Value {
        let o = run(&[
            Path::new("cp"),
            Path::new("--json"),
            src,
            &d.path().join(name),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let w: Vec<_> = v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["bytes_written"].as_u64() > Some(0))
            .map(|p| p["pool"].clone())
            .collect();
        assert_eq!(w.len(), 1, "{v}");
        w[0].clone()
    };
    assert_eq!(
        writer(Path::new("/proc/self/status"), "status"),
        writer(&f, "g")
    );
}

#[test]
fn a_read_only_file_system_is_named_as_such_and_its_file_kept() {
    let lfs = match LoopFs::new(16) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop file system: {why}");
            return;
        }
    };
    let mnt = lfs.mnt();
    let dst = mnt.join("dst");
    fs::write(&dst, b"old").unwrap();
    let remount = |opt: &str| {
        Command::new("mount")
            .args(["-o", &format!("remount,{opt}")])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(remount("ro"), "remount read-only");
    let d = tmp();
    let src = d.path().join("src");
    fs::write(&src, b"new").unwrap();
    let o = run(&[Path::new("cp"), &src, &dst]);
    let w = ferrio()
        .args(["write", "--size", "1MiB"])
        .arg(mnt.join("w"))
        .output()
        .expect("run ferrio");
    assert!(remount("rw"), "remount read-write");
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("read-only file system"), "{err}");
    assert_eq!(fs::read(&dst).unwrap(), b"old");
    let err = stderr(&w);
    assert_eq!(w.status.code(), Some(2), "{err}");
    assert!(err.contains("read-only file system"), "{err}");
}

/// A destination URL no copy could write to is bad input, said once before the tree is walked
/// (not once per file, with exit 1).
#[test]
fn a_destination_url_that_cannot_be_written_fails_once_up_front() {
    let dir = tmp();
    let tree = dir.path().join("t");
    fs::create_dir(&tree).unwrap();
    for i in 0..5 {
        fs::write(tree.join(format!("f{i}")), b"x").unwrap();
    }
    for (dest, says) in [
        ("https://127.0.0.1:9/p/", "read-only"),
        ("s3://", "bad object URL"),
        ("s3://bucket/a?b/", "percent-encode"),
    ] {
        let o = ferrio()
            .args(["cp", "-r"])
            .arg(&tree)
            .arg(dest)
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .output()
            .expect("run ferrio");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{dest}: {err}");
        assert!(err.contains(says), "{dest}: {err}");
        assert_eq!(
            err.lines().count(),
            1,
            "{dest}: one error, not one per file: {err}"
        );
    }
}
