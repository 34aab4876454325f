//! Temporary names: a hidden `.NAME.ferrio-XXXXXX` next to each destination, removed unless it
//! is renamed into place.
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
            temp.extend_from_slice(b".ferrio-");
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
}
