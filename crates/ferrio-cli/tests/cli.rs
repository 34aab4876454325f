//! The `ferrio` binary as a user runs it: exit codes, one-line errors, JSON, cleanup.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::interrupt_and_time;

fn ferrio() -> Command {
    common::ferrio()
}

fn run(args: &[&str]) -> Output {
    ferrio().args(args).output().expect("run ferrio")
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn assert_one_line_error(o: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

#[test]
fn help_and_version_succeed() {
    assert!(run(&["--help"]).status.success());
    assert!(run(&["--version"]).status.success());
    let o = run(&["bench", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("--compare") && help.contains("--size"),
        "{help}"
    );
}

#[test]
fn help_states_the_defaults_of_the_settings_table() {
    let o = run(&["read", "--help"]);
    // Undo clap's line wrapping.
    let help = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for name in [
        "direct_read",
        "direct_write",
        "task_size",
        "threads_per_device",
    ] {
        let info = ferrio::config::setting(name).expect("a setting of the table");
        let default = info
            .default
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let stated = format!("[default: {}, else {default}]", info.env);
        assert!(help.contains(&stated), "help lacks {stated:?}: {help}");
    }
    assert!(help.contains("FERRIO_DIRECT_WRITE, else auto]"), "{help}");
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(run(&["--no-such-flag"]).status.code(), Some(2));
    assert_eq!(run(&["read"]).status.code(), Some(2), "read needs a path");
    let o = run(&["write", "/tmp/never", "--size", "12Q"]);
    assert_one_line_error(&o, 2, "not a size");
    let o = run(&["read", "/no/such/file"]);
    assert_one_line_error(&o, 2, "/no/such/file");
    let d = tmp();
    let o = run(&["read", d.path().to_str().unwrap()]);
    assert_one_line_error(&o, 2, "Is a directory");
}

#[test]
fn bad_environment_value_names_the_variable() {
    let d = tmp();
    let o = ferrio()
        .env("FERRIO_TASK_SIZE", "lots")
        .args(["info", d.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_one_line_error(&o, 2, "FERRIO_TASK_SIZE");
    // A value that is not text is bad, not absent (it was ignored: the defaults ran silently).
    use std::os::unix::ffi::OsStrExt;
    let o = ferrio()
        .env("FERRIO_TASK_SIZE", std::ffi::OsStr::from_bytes(b"4\xffMiB"))
        .args(["info", d.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_one_line_error(&o, 2, "FERRIO_TASK_SIZE");
    let o = ferrio()
        .env("FERRIO_DEVICE_THREADS", "=3")
        .args(["info", d.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_one_line_error(&o, 2, "FERRIO_DEVICE_THREADS");
    assert_one_line_error(&o, 2, "NAME=N[,NAME=N...]");
    let o = ferrio()
        .env("FERRIO_CACHE", "sometimes")
        .args(["info", d.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_one_line_error(&o, 2, "FERRIO_CACHE");
    assert_one_line_error(&o, 2, "auto|keep|bypass");
}

#[test]
fn info_says_what_the_cache_policy_decided_and_read_takes_cache() {
    let d = tmp();
    let f = d.path().join("small");
    std::fs::write(&f, vec![7u8; 1 << 20]).unwrap();
    let fs = f.to_str().unwrap();
    let o = run(&["info", fs]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("cache:       auto → keep"), "{text}");
    // The default, auto, reads block by block (populate) on any local file system here.
    assert!(
        text.contains("fill:        cold reads of 64.00 MiB or more: 4 tasks")
            && text.contains("each reading 2 MiB blocks into the page cache (fill_reads=auto)"),
        "{text}"
    );
    let o = ferrio()
        .env("FERRIO_FILL_READS", "populate")
        .args(["info", fs])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("each reading 2 MiB blocks into the page cache (fill_reads=populate)"),
        "{text}"
    );
    let o = ferrio()
        .env("FERRIO_CACHE", "bypass")
        .args(["info", fs, "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cache"]["resolved"], "bypass");
    assert_eq!(v["cache"]["fill"], serde_json::Value::Null);
    let o = ferrio()
        .env("FERRIO_FILL_READS", "readahead")
        .args(["info", fs, "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cache"]["fill"]["reads"], "readahead");
    assert_eq!(v["cache"]["fill"]["in_flight"], 4);
    let o = run(&["read", fs, "--cache", "keep", "--cold"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["read", fs, "--cache", "never"]);
    assert_one_line_error(&o, 2, "--cache");
}

#[test]
fn write_then_read_and_info_as_json() {
    let d = tmp();
    let f = d.path().join("data bin");
    let fs = f.to_str().unwrap();
    let o = run(&["write", fs, "--size", "3MiB", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 3 << 20);
    let o = run(&["read", fs, "--cold", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes"], 3 << 20);
    assert!(v["gib_per_s"].as_f64().unwrap() > 0.0);
    let o = run(&["info", fs, "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["size"], 3 << 20);
    assert!(v["fs_type"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(v["pool"]["key"].as_str().is_some());
    assert!(v["direct_io"]["available"].is_boolean());
    let o = run(&["info", fs]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("chain:") && text.contains("direct I/O:"),
        "{text}"
    );
}

#[test]
fn json_names_a_path_that_is_not_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let d = tmp();
    let f = d.path().join(OsStr::from_bytes(b"caf\xe9.bin"));
    let lossy = f.to_string_lossy().into_owned();
    assert!(lossy.contains('\u{fffd}'));
    let json_of = |args: &[&OsStr], code: i32| -> serde_json::Value {
        let o = ferrio()
            .args(args)
            .arg("--json")
            .output()
            .expect("run ferrio");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        serde_json::from_slice(&o.stdout).expect("one JSON object")
    };
    let (size, one) = (OsStr::new("--size"), OsStr::new("1MiB"));
    let v = json_of(&[OsStr::new("write"), f.as_os_str(), size, one], 0);
    assert_eq!(v["files"][0]["path"], lossy.as_str());
    let v = json_of(&[OsStr::new("read"), f.as_os_str()], 0);
    assert_eq!(v["files"][0]["path"], lossy.as_str());
    let v = json_of(&[OsStr::new("info"), f.as_os_str()], 0);
    assert_eq!(v["path"], lossy.as_str());
    // A failed copy's JSON names the source and the destination.
    let dest = d.path().join("no-dir").join(OsStr::from_bytes(b"\xff"));
    let v = json_of(&[OsStr::new("cp"), f.as_os_str(), dest.as_os_str()], 1);
    assert_eq!(v["errors"][0]["path"], lossy.as_str());
    assert_eq!(v["errors"][0]["dest"], dest.to_string_lossy().as_ref());
}

#[test]
fn a_full_stdout_is_named_as_the_failure() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let d = tmp();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    std::fs::write(&src, b"data").unwrap();
    let o = ferrio()
        .arg("cp")
        .arg(&src)
        .arg(&dst)
        .stdout(full)
        .output()
        .expect("run ferrio");
    // The copy itself succeeded; only its summary could not be printed.
    assert_one_line_error(
        &o,
        1,
        "cannot write to standard output: No space left on device",
    );
    assert_eq!(std::fs::read(&dst).unwrap(), b"data");
}

#[test]
fn a_block_device_is_described_and_pooled_as_its_own_device() {
    let d = tmp();
    let img = d.path().join("img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(8 << 20))
        .unwrap();
    let loop_dev = match common::LoopDevice::attach(&img) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dev = loop_dev.path.clone();
    let o = run(&["info", &dev, "--json"]);
    drop(loop_dev);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let name = dev.trim_start_matches("/dev/");
    // Not the devtmpfs that holds the node (pool fs:0:N, shared by every device node).
    assert_eq!(v["pool"]["key"], name, "{v}");
    assert_eq!(v["has_block_device"], true, "{v}");
    assert_eq!(v["fs_type"], "block device", "{v}");
    assert_eq!(v["size"], 8 << 20, "{v}");
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn bench_reports_and_cleans_up() {
    let d = tmp();
    let o = run(&[
        "bench",
        "--dir",
        d.path().to_str().unwrap(),
        "--size",
        "8MiB",
        "--rounds",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for row in ["ferrio write (synced)", "ferrio cold", "ferrio hot"] {
        let r = &v["results"][row];
        assert!(r["gib_per_s"].as_f64().unwrap() > 0.0, "{row}: {r}");
        assert!(r["cpu_seconds_per_gib"].as_f64().is_some(), "{row}: {r}");
        assert_eq!(r["rounds"].as_array().unwrap().len(), 2);
    }
    assert_eq!(v["settings"]["task_size"], "4194304");
    assert!(
        leftovers(d.path()).is_empty(),
        "bench left {:?}",
        leftovers(d.path())
    );
    // Not enough space is a usage error, before any file is made.
    let o = run(&[
        "bench",
        "--dir",
        d.path().to_str().unwrap(),
        "--size",
        "1000000GiB",
    ]);
    assert_one_line_error(&o, 2, "free");
    // So is a --dir that is a file, as one that does not exist.
    let f = d.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let o = run(&["bench", "--dir", f.to_str().unwrap(), "--size", "1MiB"]);
    assert_one_line_error(&o, 2, "not a directory");
}

/// Runs `ferrio ARGS` under `ulimit -v KIB` (address space), through sh.
fn run_limited(kib: u64, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_ferrio"))
        .args(args)
        .output()
        .expect("run sh")
}

#[test]
fn bench_and_write_without_the_memory_they_need_fail_in_one_line_and_clean_up() {
    // `vec![0; size]` aborted the process (SIGABRT), leaving the temporary directory or the
    // new file behind.
    // Sizes small enough for a nearly full disk (both check the room first).
    let d = tmp();
    let dir = d.path().to_str().unwrap();
    let o = run_limited(160 << 10, &["bench", "--dir", dir, "--size", "200MiB"]);
    assert_one_line_error(&o, 1, "cannot allocate");
    assert!(
        leftovers(d.path()).is_empty(),
        "bench left {:?}",
        leftovers(d.path())
    );
    let target = d.path().join("new");
    let o = run_limited(
        160 << 10,
        &["write", "--size", "200MiB", target.to_str().unwrap()],
    );
    assert_one_line_error(&o, 1, "cannot allocate");
    assert!(!target.exists(), "write left {}", target.display());
}

#[test]
fn reads_and_writes_of_nothing_give_no_cpu_rate() {
    let d = tmp();
    let empty = d.path().join("empty");
    let o = run(&["write", "--json", "--size", "0", empty.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["cpu_seconds_per_gib"].is_null(), "{v}");
    let o = run(&["read", "--json", empty.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes"], 0);
    assert!(v["cpu_seconds_per_gib"].is_null(), "{v}");
}

#[test]
fn ctrl_c_during_bench_removes_its_files() {
    let d = tmp();
    let mut child = ferrio()
        .args([
            "bench",
            "--dir",
            d.path().to_str().unwrap(),
            "--size",
            "1GiB",
            "--rounds",
            "50",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the benchmark has made its directory, then interrupt it.
    let t0 = Instant::now();
    while leftovers(d.path()).is_empty() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        leftovers(d.path()).is_empty(),
        "left {:?}",
        leftovers(d.path())
    );
}

/// Runs `ferrio args`, killing it if it has not exited within ten seconds.
fn run_within(args: &[&str]) -> Output {
    let child = ferrio()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ferrio");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(o) => o.expect("wait for ferrio"),
        Err(_) => {
            // SAFETY: plain kill(2) of our own child, which has not been waited for yet.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("ferrio {args:?} blocked");
        }
    }
}

#[test]
fn a_fifo_is_refused_at_once_by_info_read_and_write() {
    let d = tmp();
    let p = d.path().join("p");
    let ok = Command::new("mkfifo")
        .arg(&p)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo");
    let ps = p.to_str().unwrap();
    for args in [
        vec!["info", ps],
        vec!["read", ps],
        vec!["write", ps, "--size", "1MiB"],
    ] {
        // Bad input, as a missing file is: exit 2.
        let o = run_within(&args);
        assert_one_line_error(&o, 2, "is a FIFO");
        assert!(String::from_utf8_lossy(&o.stderr).contains(ps), "{o:?}");
    }
}

#[test]
fn task_size_flag_is_checked_like_its_variable() {
    let d = tmp();
    let f = d.path().join("f");
    std::fs::write(&f, b"data").unwrap();
    let fs = f.to_str().unwrap();
    let o = run(&["read", "--task-size", "0", fs]);
    assert_one_line_error(&o, 2, "--task-size");
    let by_flag = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        by_flag.contains("\"0\"") && by_flag.contains("at least 4 KiB"),
        "{by_flag}"
    );
    let o = ferrio()
        .env("FERRIO_TASK_SIZE", "0")
        .args(["read", fs])
        .output()
        .unwrap();
    assert_one_line_error(&o, 2, "FERRIO_TASK_SIZE");
    let by_env = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(by_flag.replace("--task-size", "FERRIO_TASK_SIZE"), by_env);
    let o = run(&["write", "--task-size", "lots", "--size", "1MiB", fs]);
    assert_one_line_error(&o, 2, "--task-size");
    assert_eq!(std::fs::read(&f).unwrap(), b"data", "nothing written");
}

#[test]
fn bench_reacts_to_ctrl_c_within_a_fraction_of_a_second() {
    // Interrupted at several points: while writing, reading cold and reading hot.
    for delay_ms in [150u64, 700, 1400, 2100] {
        let d = tmp();
        let mut child = ferrio()
            .args([
                "bench",
                "--dir",
                d.path().to_str().unwrap(),
                "--size",
                "512MiB",
                "--rounds",
                "50",
                "--threads",
                "1",
                "--task-size",
                "64KiB",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while leftovers(d.path()).is_empty() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let (status, took) = interrupt_and_time(&mut child, Duration::from_secs(30));
        assert_eq!(status.code(), Some(130), "at {delay_ms} ms");
        assert!(
            took < Duration::from_millis(800),
            "at {delay_ms} ms: exited {took:?} after Ctrl-C"
        );
        assert!(
            leftovers(d.path()).is_empty(),
            "left {:?}",
            leftovers(d.path())
        );
    }
}

#[test]
fn info_gpu_takes_no_path_and_needs_one_or_the_other() {
    let o = run(&["info", "--gpu", "0", "/etc/hosts"]);
    assert_one_line_error(&o, 2, "cannot be used with");
    let o = run(&["info"]);
    assert_one_line_error(&o, 2, "required");
    let o = run(&["info", "--gpu", "first"]);
    assert_one_line_error(&o, 2, "invalid value");
}

#[test]
fn info_gpu_without_a_driver_is_one_clear_line() {
    for args in [
        &["info", "--gpu", "0"][..],
        &["info", "--gpu", "0", "--json"],
    ] {
        let o = run(args);
        if ferrio::cuda::available().is_ok() {
            // On a GPU machine: the device is described instead.
            assert_eq!(o.status.code(), Some(0), "{o:?}");
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(text.contains("pci"), "{text}");
            continue;
        }
        assert_one_line_error(&o, 1, "CUDA is not available");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(o.stdout.is_empty(), "nothing on stdout: {o:?}");
    }
    // A GPU past the count is a usage error where there is a driver.
    if ferrio::cuda::available().is_ok() {
        let o = run(&["info", "--gpu", "4096"]);
        assert_one_line_error(&o, 2, "there is no GPU 4096");
    }
}

#[test]
fn a_url_of_a_scheme_ferrio_does_not_open_says_so() {
    let url = "ftp://example.invalid/x";
    let o = run(&["read", url]);
    assert_one_line_error(&o, 2, "is not a URL scheme ferrio opens");
    assert!(String::from_utf8_lossy(&o.stderr).contains(url), "{o:?}");
    // A file:/ URL names a local path (session 26): a missing one is a missing file.
    let o = run(&["read", "file:///nonexistent/ferrio"]);
    assert_one_line_error(&o, 2, "No such file");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/nonexistent/ferrio"),
        "{o:?}"
    );
    // A missing local path says only that.
    let o = run(&["read", "/nonexistent/ferrio/x"]);
    assert_one_line_error(&o, 2, "No such file");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("scheme"),
        "{o:?}"
    );
}

#[test]
fn an_error_with_stderr_gone_keeps_its_exit_status() {
    // A hung-up terminal (after SIGHUP) or a closed pipe: writing the error line fails, and
    // `eprintln!` panicked (exit 101) instead of exiting 2.
    let mut fds = [0; 2];
    // SAFETY: `pipe` writes two descriptors into the array it is given.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are ours; the read end is closed at once, so writes to the other fail.
    let (read_end, write_end) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    drop(read_end);
    let status = ferrio()
        .args(["read", "/no/such/file/anywhere"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(write_end))
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2), "{status:?}");
}
