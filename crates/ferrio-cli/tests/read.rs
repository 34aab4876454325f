//! `ferrio read` as a user runs it: Ctrl-C, bounded host memory, allocation failure.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::interrupt_and_time;

fn ferrio() -> Command {
    common::ferrio()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

/// A sparse file of `len` bytes: reading it costs no disk and it takes no space.
fn sparse(dir: &Path, name: &str, len: u64) -> PathBuf {
    let p = dir.join(name);
    fs::File::create(&p)
        .and_then(|f| f.set_len(len))
        .expect("sparse file");
    p
}

/// `ferrio read ARGS` under `ulimit -v KIB` (address space), through sh.
fn read_limited(kib: u64, args: &[&Path]) -> std::process::Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" read \"$@\""))
        .arg(env!("CARGO_BIN_EXE_ferrio"))
        .args(args);
    cmd.output().expect("run sh")
}

#[test]
fn ctrl_c_stops_a_read_promptly_with_130() {
    let d = tmp();
    let f = sparse(d.path(), "big", 8 << 30);
    // Tiny tasks on one thread: a 1 GiB window takes several seconds.
    let mut child = ferrio()
        .args(["read", "--threads", "1", "--task-size", "4096"])
        .arg(&f)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    let (status, took) = interrupt_and_time(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(130));
    assert!(
        took < Duration::from_millis(1500),
        "exited {took:?} after Ctrl-C"
    );
}

#[test]
fn more_files_than_the_soft_open_file_limit_are_read() {
    let d = tmp();
    let files: Vec<PathBuf> = (0..300)
        .map(|i| {
            let p = d.path().join(format!("f{i}"));
            fs::write(&p, i.to_string()).expect("write");
            p
        })
        .collect();
    let bytes: u64 = (0..300).map(|i: u32| i.to_string().len() as u64).sum();
    // Soft limit 64, hard limit as it is (the hard one must leave room to raise it).
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("[ \"$(ulimit -H -n)\" = unlimited ] || [ \"$(ulimit -H -n)\" -ge 1024 ] || exit 77; ulimit -S -n 64 && exec \"$0\" read --json \"$@\"")
        .arg(env!("CARGO_BIN_EXE_ferrio"))
        .args(&files);
    let o = cmd.output().expect("run sh");
    if o.status.code() == Some(77) {
        eprintln!("skipped: the hard open-file limit is below 1024");
        return;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes"], bytes);
}

#[test]
fn many_large_files_fit_in_bounded_memory() {
    let d = tmp();
    let files: Vec<PathBuf> = (0..4)
        .map(|i| sparse(d.path(), &format!("f{i}"), 768 << 20))
        .collect();
    let mut args: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    args.push(Path::new("--json"));
    // 1.5 GiB of address space: not enough for a window per file of the whole file (3 GiB).
    let o = read_limited(1536 << 10, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "stderr: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes"], 4 * (768u64 << 20));
}

#[test]
fn allocation_failure_is_a_one_line_error() {
    let d = tmp();
    let f = sparse(d.path(), "f", 1 << 30);
    // Enough to start, too little for the read windows.
    let o = read_limited(160 << 10, &[&f]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with("ferrio: cannot allocate"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

/// `--gpu N` reads into GPU memory: without a usable GPU it fails in one line saying why; with
/// one, an out-of-range N is a usage error and a real read reports its rate "into GPU N".
#[test]
fn gpu_reads_say_why_they_cannot_run_or_report_the_rate() {
    let d = tmp();
    let f = d.path().join("f");
    fs::write(&f, vec![7u8; 3 << 20]).unwrap();
    let o = ferrio()
        .arg("read")
        .arg("--gpu")
        .arg("0")
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if ferrio::cuda::available().is_err() {
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("CUDA is not available"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    } else {
        assert!(o.status.success(), "{err}");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("3.00 MiB") && text.contains("into GPU 0"),
            "{text}"
        );
        let o = ferrio()
            .arg("read")
            .arg("--gpu")
            .arg("999")
            .arg(&f)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
    }
}
