//! Helpers shared by the CLI tests: loop devices and a small file system on one, and bounded
//! waits for children that are sent Ctrl-C.
#![allow(dead_code)] // each test crate uses its own subset

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// The `ferrio` binary, started with the default action for the signals the tests send
/// (SIGINT, SIGTERM, SIGHUP), as from a terminal: a test run in the background or under `nohup`
/// would otherwise hand it ignored ones, which ferrio rightly keeps ignoring.
pub fn ferrio() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrio"));
    // SAFETY: `signal` is async-signal-safe, as `pre_exec` requires.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            for number in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(number, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

/// Sends SIGINT to `child`.
pub fn interrupt(child: &Child) {
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
}

/// Waits up to `limit` for `child`; kills it and returns `None` when it is still running then.
pub fn wait_bounded(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Sends Ctrl-C to `child` and returns its exit status and how long it took to exit, or panics
/// when it has not exited within `limit` (the child is killed then).
pub fn interrupt_and_time(child: &mut Child, limit: Duration) -> (ExitStatus, Duration) {
    let t0 = Instant::now();
    interrupt(child);
    match wait_bounded(child, limit) {
        Some(status) => (status, t0.elapsed()),
        None => panic!("still running {limit:?} after Ctrl-C (killed)"),
    }
}

/// Whether the tests run as root (loop devices and mounts need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `cmd`; its trimmed standard output, or why it failed.
fn sh(cmd: &mut Command) -> Result<String, String> {
    let o = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !o.status.success() {
        return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&o.stderr)));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// A loop device over an image file; detached on drop.
pub struct LoopDevice {
    /// The device node, `/dev/loopN`.
    pub path: String,
}

impl LoopDevice {
    /// Attaches `img`; the error says why it cannot (not root, no free loop device).
    pub fn attach(img: &Path) -> Result<LoopDevice, String> {
        if !is_root() {
            return Err("needs root (losetup)".into());
        }
        let path = sh(Command::new("losetup").args(["-f", "--show"]).arg(img))?;
        Ok(LoopDevice { path })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.path]).status();
    }
}

/// A small ext4 file system on a loop device; unmounted and detached on drop.
pub struct LoopFs {
    pub dir: tempfile::TempDir,
    mounted: bool,
    // Dropped after `drop` has unmounted.
    dev: Option<LoopDevice>,
}

impl LoopFs {
    pub fn new(size_mib: u64) -> Result<LoopFs, String> {
        if !is_root() {
            return Err("needs root (losetup, mount)".into());
        }
        let mut fs = LoopFs {
            dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?,
            dev: None,
            mounted: false,
        };
        let img = fs.dir.path().join("fs.img");
        fs::File::create(&img)
            .and_then(|f| f.set_len(size_mib << 20))
            .map_err(|e| e.to_string())?;
        sh(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img))?;
        let dev = LoopDevice::attach(&img)?;
        fs::create_dir(fs.mnt()).map_err(|e| e.to_string())?;
        sh(Command::new("mount").arg(&dev.path).arg(fs.mnt()))?;
        fs.dev = Some(dev);
        fs.mounted = true;
        Ok(fs)
    }

    pub fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted
            && !Command::new("umount")
                .arg(self.mnt())
                .status()
                .is_ok_and(|s| s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(self.mnt()).status();
        }
    }
}
