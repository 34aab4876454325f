//! Temporary names: a hidden `.NAME.ferrio-PID-HHHHXXXXXX` next to each destination (the
//! copying process's id, a tag of this machine's host name and process id namespace, six random
//! characters), removed
//! unless it is renamed into place; and the sweep that removes such names left by a process that
//! no longer exists (killed with `SIGKILL`, or a crash), so a re-run cleans up after its
//! predecessor.
//!
//! It knows names only, not what is written under them.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// A temporary name next to a destination, removed on drop unless committed.
pub(super) struct TempPath {
    path: PathBuf,
    committed: bool,
}

/// Bytes of the destination's name kept in the temporary name (which must fit `NAME_MAX`, 255).
const TEMP_NAME_KEEP: usize = 200;

impl TempPath {
    /// Makes something at a fresh temporary name next to `dst` with `make` (which must fail with
    /// `AlreadyExists` when the name is taken), trying new names until one is free.
    pub(super) fn create(
        dst: &Path,
        mut make: impl FnMut(&Path) -> io::Result<()>,
    ) -> Result<TempPath> {
        let dir = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = dst.file_name().map(|n| n.as_bytes()).unwrap_or(b"copy");
        let name = &name[..name.len().min(TEMP_NAME_KEEP)];
        let mut last = None;
        for _ in 0..TEMP_TRIES {
            let mut temp = Vec::with_capacity(name.len() + 16);
            temp.push(b'.');
            temp.extend_from_slice(name);
            temp.extend_from_slice(TEMP_MARK);
            temp.extend_from_slice(own_tag().as_bytes());
            temp.extend_from_slice(&random_suffix());
            let path = dir.join(OsString::from_vec(temp));
            match make(&path) {
                Ok(()) => {
                    return Ok(TempPath {
                        path,
                        committed: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(source) => {
                    return Err(Error::Fs {
                        action: "create a temporary file for",
                        path: dst.to_path_buf(),
                        source,
                    })
                }
            }
        }
        Err(Error::Fs {
            action: "find a free temporary name for",
            path: dst.to_path_buf(),
            source: last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EEXIST)),
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the temporary file over `dst`.
    pub(super) fn commit(mut self, dst: &Path) -> Result<()> {
        fs::rename(&self.path, dst).map_err(|source| Error::Fs {
            action: "rename into place",
            path: dst.to_path_buf(),
            source,
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the name is ours, and an error here has nowhere better to go.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// What separates a destination's name from the temporary part.
const TEMP_MARK: &[u8] = b".ferrio-";

/// `PID-HHHH`: this process's id and a tag of the host name and process id namespace, so that
/// a sweep never takes a name of a live copy, nor of a copy on another machine sharing the
/// directory (NFS), nor of one in another container sharing the volume (whose process ids are
/// its own, even where the host name is the same: Docker's `--network host`, the containers of
/// one Kubernetes pod).
/// The id is asked each time (a forked child has its own); the host tag is read once.
fn own_tag() -> String {
    format!("{}-{}", crate::sys::process_id(), host_tag())
}

/// Four letters and digits from the host name and the process id namespace (FNV-1a), the same
/// in every process of a machine that sees the same process ids.
fn host_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(read_host_tag)
}

fn read_host_tag() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let name = fs::read("/proc/sys/kernel/hostname").unwrap_or_default();
    // `pid:[4026531836]`: the namespace the process ids of the names are counted in.
    let namespace = fs::read_link("/proc/self/ns/pid").unwrap_or_default();
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    let bytes = name
        .trim_ascii()
        .iter()
        .chain(namespace.as_os_str().as_bytes());
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    (0..4)
        .map(|_| {
            let c = ALPHABET[(h % ALPHABET.len() as u64) as usize] as char;
            h /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// The process id in a temporary name of this machine, if `name` is one.
fn temp_owner(name: &[u8]) -> Option<u32> {
    if !name.starts_with(b".") {
        return None;
    }
    let at = name
        .windows(TEMP_MARK.len())
        .rposition(|w| w == TEMP_MARK)?;
    let rest = std::str::from_utf8(&name[at + TEMP_MARK.len()..]).ok()?;
    let (pid, tail) = rest.split_once('-')?;
    let host = host_tag();
    if tail.len() != host.len() + 6 || !tail.starts_with(host) || pid.starts_with('0') {
        return None;
    }
    if !tail.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    pid.parse().ok()
}

/// Removes from `dir` the temporary files and links that copies on this machine left behind
/// when they died (their process no longer exists). Returns how many were removed; a directory
/// that cannot be listed is left alone (the copy itself reports what is wrong with it).
pub(super) fn remove_stale(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let me = crate::sys::process_id();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_owner(name.as_bytes()) else {
            continue;
        };
        if pid == me || crate::sys::process_exists(pid) {
            continue;
        }
        let is_leaf = entry
            .file_type()
            .is_ok_and(|t| t.is_file() || t.is_symlink());
        if is_leaf && fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Names tried before giving up: a clash needs another copy racing for the same name.
const TEMP_TRIES: usize = 64;

/// Six random-looking letters and digits, different on each call in this process.
fn random_suffix() -> [u8; 6] {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let pid = *PID.get_or_init(std::process::id);
    let mut x = nanos
        ^ (u64::from(pid) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64 finaliser: neighbouring inputs give unrelated outputs.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let mut out = [0u8; 6];
    for b in &mut out {
        *b = ALPHABET[(x % ALPHABET.len() as u64) as usize];
        x /= ALPHABET.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_hidden_short_and_distinct() {
        let long = "x".repeat(255);
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join(&long);
        let t1 = TempPath::create(&dst, |p| fs::write(p, b"1")).unwrap();
        let t2 = TempPath::create(&dst, |p| fs::write(p, b"2")).unwrap();
        assert_ne!(t1.path(), t2.path());
        let name = t1.path().file_name().unwrap().as_bytes().to_vec();
        assert!(
            name.starts_with(b".") && name.len() <= 255,
            "{}",
            name.len()
        );
        let p1 = t1.path().to_path_buf();
        drop(t1);
        assert!(!p1.exists(), "an uncommitted temporary file is removed");
        t2.commit(&dst).unwrap();
        assert_eq!(fs::read(&dst).unwrap(), b"2");
    }

    #[test]
    fn stale_names_of_dead_processes_are_removed_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let live = TempPath::create(&dir.path().join("a.bin"), |p| fs::write(p, b"1")).unwrap();
        // A process id that does not exist: past the kernel's maximum.
        let dead = dir
            .path()
            .join(format!(".b.bin.ferrio-4194305-{}abcdef", host_tag()));
        fs::write(&dead, b"2").unwrap();
        let other_host = dir.path().join(".c.bin.ferrio-4194305-zzzzabcdef");
        fs::write(&other_host, b"3").unwrap();
        let user_file = dir.path().join(".d.ferrio-notes");
        fs::write(&user_file, b"4").unwrap();
        let parent = std::os::unix::process::parent_id();
        let alive = dir
            .path()
            .join(format!(".e.ferrio-{parent}-{}abcdef", host_tag()));
        fs::write(&alive, b"5").unwrap();
        assert_eq!(
            temp_owner(live.path().file_name().unwrap().as_bytes()),
            Some(std::process::id())
        );
        assert_eq!(remove_stale(dir.path()), 1);
        assert!(!dead.exists());
        for kept in [live.path(), &other_host, &user_file, &alive] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }
}
