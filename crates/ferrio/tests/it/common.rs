//! Shared helpers for the integration tests.

use std::path::{Path, PathBuf};

use ferrio::{DirectMode, Settings};

/// Deterministic pseudo-random bytes (never all zeros) from a seed.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
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
