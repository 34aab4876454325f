//! Shared helpers for the integration tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use ferrio::{DirectMode, Settings};

/// Deterministic pseudo-random bytes (never all zeros) from a seed.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    crate::support::random_bytes(len, seed)
}

/// A temporary directory on a real disk (not tmpfs), so O_DIRECT works: `FERRIO_TEST_DIR`, else
/// the build's temporary directory, else the system's (a test binary carried to another machine).
pub fn disk_dir() -> tempfile::TempDir {
    let base = std::env::var_os("FERRIO_TEST_DIR")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR"))).filter(|p| p.is_dir()))
        .unwrap_or_else(std::env::temp_dir);
    tempfile::Builder::new()
        .prefix("ferrio-test")
        .tempdir_in(base)
        .expect("create temp dir")
}

/// Writes `bytes` to a new file at `dir/name` with std, returning its path.
pub fn make_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write test file");
    p
}

/// Settings with a direct-I/O policy and overread flag, and small tasks so that requests split.
pub fn settings(direct: DirectMode, overread: bool, task_size: u64) -> Settings {
    let mut s = Settings::default();
    s.direct_read = direct;
    s.direct_write = direct;
    s.direct_overread = overread;
    s.task_size = task_size;
    s
}

/// A byte pattern that differs from any test data at the same position, to poison buffers.
pub const POISON: u8 = 0xA5;

/// A small ext4 file system on a loop device, mounted in a temporary directory; unmounted,
/// detached and removed on drop, also when a test fails.
pub struct LoopFs {
    dir: tempfile::TempDir,
    dev: Option<String>,
    mounted: bool,
}

impl LoopFs {
    /// Makes one of `size_mib` MiB, or says why it cannot.
    pub fn new(size_mib: u64) -> Result<LoopFs, String> {
        if !ferrio::sys::is_root() {
            return Err("needs root (losetup, mount)".into());
        }
        let dir = disk_dir();
        let img = dir.path().join("fs.img");
        let mut fs = LoopFs {
            dir,
            dev: None,
            mounted: false,
        };
        let run = |cmd: &mut Command| -> Result<String, String> {
            let o = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if !o.status.success() {
                return Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        fs::File::create(&img)
            .and_then(|f| f.set_len(size_mib << 20))
            .map_err(|e| e.to_string())?;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img))?;
        let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(&img))?;
        fs.dev = Some(dev.clone());
        let mnt = fs.mount_point();
        std::fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        run(Command::new("mount").arg(&dev).arg(&mnt))?;
        fs.mounted = true;
        Ok(fs)
    }

    /// The loop device (`/dev/loopN`) the file system is on.
    pub fn device(&self) -> &str {
        self.dev
            .as_deref()
            .expect("a LoopFs has its device from new() on")
    }

    pub fn mount_point(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// Fills the file system with a file named `filler` until about `left` bytes are free.
    pub fn fill_up_to(&self, left: u64) {
        use std::io::Write;
        let mnt = self.mount_point();
        let free = ferrio::sys::free_bytes(&mnt).unwrap();
        let filler = fs::File::create(mnt.join("filler")).unwrap();
        let chunk = vec![1u8; 1 << 20];
        let mut todo = free.saturating_sub(left);
        let mut w = std::io::BufWriter::new(&filler);
        while todo > 0 {
            let n = todo.min(chunk.len() as u64) as usize;
            w.write_all(&chunk[..n]).unwrap();
            todo -= n as u64;
        }
        drop(w);
        filler.sync_all().unwrap();
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount")
                .arg(self.mount_point())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(self.mount_point())
                    .status();
            }
        }
        if let Some(dev) = &self.dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

/// The file at `path` dropped from the page cache and opened to be kept, its cold reads filling
/// the cache the `reads` way; `None` (said on stderr) where the drop does not take.
pub fn open_cold_to_fill(path: &Path, reads: ferrio::FillReads) -> Option<ferrio::File> {
    ferrio::pagecache::drop_file(path).unwrap();
    if ferrio::pagecache::residency(path, 0, None).unwrap().share() > 0.02 {
        eprintln!("skipped: this file system keeps the pages after POSIX_FADV_DONTNEED");
        return None;
    }
    let mut s = Settings::default();
    s.fill_reads = reads;
    let f = ferrio::File::options()
        .settings(s)
        .cache(ferrio::CacheMode::Keep)
        .open(path, "r")
        .unwrap();
    assert_eq!(f.fill_reads(), Some(reads));
    Some(f)
}
