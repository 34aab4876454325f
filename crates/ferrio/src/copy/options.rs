//! What a copy is asked to do and what it tells back: [`CopyOptions`] and [`CopyMethod`], the
//! live [`CopyProgress`] counters with their cancel switch, and the final [`CopyReport`].
//!
//! Plain data and its parsing only: nothing here touches a file.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::Settings;
use crate::error::{Error, Result};

/// How file bytes are moved from source to destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CopyMethod {
    /// `copy_file_range` when source and destination are on one file system, else read + write.
    #[default]
    Auto,
    /// Read into memory on the source's pool and write from it on the destination's pool.
    ReadWrite,
    /// `copy_file_range` wherever the kernel accepts it (read + write where it refuses).
    CopyFileRange,
}

impl CopyMethod {
    /// The accepted spellings, for error messages.
    pub const FORMS: &'static str = "auto|read-write|copy-file-range (also rw, cfr)";

    /// The canonical name.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyMethod::Auto => "auto",
            CopyMethod::ReadWrite => "read-write",
            CopyMethod::CopyFileRange => "copy-file-range",
        }
    }
}

impl std::fmt::Display for CopyMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CopyMethod {
    type Err = Error;
    fn from_str(s: &str) -> Result<CopyMethod> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "auto" => Ok(CopyMethod::Auto),
            "read-write" | "rw" => Ok(CopyMethod::ReadWrite),
            "copy-file-range" | "cfr" => Ok(CopyMethod::CopyFileRange),
            _ => Err(Error::InvalidArgument(format!(
                "copy method {s:?} is not one of {}",
                CopyMethod::FORMS
            ))),
        }
    }
}

/// What [`copy`](fn@crate::copy::copy) does and how. Build with [`CopyOptions::new`] and the
/// setters, or set the fields.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CopyOptions {
    /// Copy directories and everything in them (`cp -r`). Without it a directory source is an
    /// error.
    pub recursive: bool,
    /// Keep mode, owner (where permitted) and access/modification times (`cp -p`).
    pub preserve: bool,
    /// After each file is written and flushed, read both back and compare every byte; a
    /// difference fails the file and the destination is left as it was.
    pub verify: bool,
    /// Follow symlinks, copying what they point to (`cp -L`). Without it a symlink inside a
    /// tree is copied as a symlink, never followed; a source named on its own is followed only
    /// when `recursive` is off (as `cp` does).
    pub follow_symlinks: bool,
    /// `fdatasync` each file before renaming it into place (see
    /// [durability](mod@crate::copy#durability)).
    pub sync: bool,
    /// How bytes are moved.
    pub method: CopyMethod,
    /// Files copied at once; 0 picks 12 when every file stays within its file system (the
    /// kernel copies, no buffers held), else 8, or 2 per source/destination device pair when
    /// that is more (at most 16). Copies through memory hold up to
    /// `parallel_files × windows_in_flight × window_bytes` of buffers (256 MiB by default).
    pub parallel_files: usize,
    /// Bytes per pipeline window; 0 picks twice the task size (8 MiB by default).
    pub window_bytes: u64,
    /// Windows in flight per file (being read or written); 0 picks 4.
    pub windows_in_flight: usize,
    /// Settings for the files opened by the copy (task size, direct I/O, threads); `None` takes
    /// [`Settings::current`] of the calling thread.
    pub settings: Option<Settings>,
    /// Counters to watch the copy from another thread, and its cancel switch.
    pub progress: Option<Arc<CopyProgress>>,
}

impl CopyOptions {
    /// Options with everything off and defaults picked by ferrio.
    pub fn new() -> CopyOptions {
        CopyOptions::default()
    }

    /// Sets [`CopyOptions::recursive`].
    pub fn recursive(mut self, on: bool) -> Self {
        self.recursive = on;
        self
    }

    /// Sets [`CopyOptions::preserve`].
    pub fn preserve(mut self, on: bool) -> Self {
        self.preserve = on;
        self
    }

    /// Sets [`CopyOptions::verify`].
    pub fn verify(mut self, on: bool) -> Self {
        self.verify = on;
        self
    }

    /// Sets [`CopyOptions::follow_symlinks`].
    pub fn follow_symlinks(mut self, on: bool) -> Self {
        self.follow_symlinks = on;
        self
    }

    /// Sets [`CopyOptions::sync`].
    pub fn sync(mut self, on: bool) -> Self {
        self.sync = on;
        self
    }

    /// Sets [`CopyOptions::method`].
    pub fn method(mut self, method: CopyMethod) -> Self {
        self.method = method;
        self
    }

    /// Sets [`CopyOptions::parallel_files`].
    pub fn parallel_files(mut self, n: usize) -> Self {
        self.parallel_files = n;
        self
    }

    /// Sets [`CopyOptions::window_bytes`].
    pub fn window_bytes(mut self, bytes: u64) -> Self {
        self.window_bytes = bytes;
        self
    }

    /// Sets [`CopyOptions::windows_in_flight`].
    pub fn windows_in_flight(mut self, n: usize) -> Self {
        self.windows_in_flight = n;
        self
    }

    /// Sets [`CopyOptions::settings`].
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = Some(settings);
        self
    }

    /// Sets [`CopyOptions::progress`].
    pub fn progress(mut self, progress: Arc<CopyProgress>) -> Self {
        self.progress = Some(progress);
        self
    }
}

/// Live counters of a copy, readable from any thread while it runs, and its cancel switch.
///
/// Totals are known once the sources have been walked (before any byte is copied). Bytes count
/// data moved plus, when a file is done, its holes, so `bytes_done` reaches `bytes_total`.
#[derive(Debug, Default)]
pub struct CopyProgress {
    pub(super) files_total: AtomicU64,
    pub(super) bytes_total: AtomicU64,
    pub(super) files_done: AtomicU64,
    bytes_done: AtomicU64,
    pub(super) errors: AtomicU64,
    cancelled: AtomicBool,
}

impl CopyProgress {
    /// Fresh counters, shared.
    pub fn new() -> Arc<CopyProgress> {
        Arc::new(CopyProgress::default())
    }

    /// Asks the copy to stop: no new file is started, files under way are abandoned and their
    /// temporary files removed. [`copy`](fn@crate::copy::copy) then returns a report with
    /// `cancelled` set.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether [`CopyProgress::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Files and symlinks to copy (0 until the walk is done).
    pub fn files_total(&self) -> u64 {
        self.files_total.load(Ordering::Relaxed)
    }

    /// Bytes of the files to copy, by their sizes.
    pub fn bytes_total(&self) -> u64 {
        self.bytes_total.load(Ordering::Relaxed)
    }

    /// Files and symlinks finished, copied or failed.
    pub fn files_done(&self) -> u64 {
        self.files_done.load(Ordering::Relaxed)
    }

    /// Bytes copied so far.
    pub fn bytes_done(&self) -> u64 {
        self.bytes_done.load(Ordering::Relaxed)
    }

    /// Entries that failed so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub(super) fn add_bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
    }
}

/// Bytes one worker pool moved for a copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceTraffic {
    /// The pool's key (as [`crate::PoolStats::key`] and `ferrio info` show it).
    pub pool: String,
    /// Bytes read from files on this pool's device.
    pub bytes_read: u64,
    /// Bytes written to files on this pool's device.
    pub bytes_written: u64,
}

/// One source that could not be copied, and why.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CopyError {
    /// The source path.
    pub path: PathBuf,
    /// Where it was to go.
    pub dest: PathBuf,
    /// What went wrong (its text names the path it is about).
    pub error: Error,
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)?;
        if self.error.path() != Some(self.path.as_path()) {
            write!(f, " (copying {})", self.path.display())?;
        }
        Ok(())
    }
}

/// What a copy did. A copy goes on past a failing file, so check [`CopyReport::errors`] (or
/// call [`CopyReport::check`]) before trusting it.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
#[must_use = "a copy can fail file by file: look at `errors` or call `check()`"]
pub struct CopyReport {
    /// Regular files copied (renamed into place).
    pub files: u64,
    /// Directories created or merged into.
    pub dirs: u64,
    /// Symlinks copied as symlinks.
    pub symlinks: u64,
    /// File data bytes moved (holes not counted).
    pub bytes: u64,
    /// Of `bytes`, those moved by `copy_file_range`.
    pub bytes_copy_file_range: u64,
    /// Files whose copy was read back and compared ([`CopyOptions::verify`]).
    pub verified: u64,
    /// Wall time of the whole copy.
    pub seconds: f64,
    /// Bytes read and written per worker pool, by pool key.
    pub devices: Vec<DeviceTraffic>,
    /// Every entry that failed.
    pub errors: Vec<CopyError>,
    /// Whether the copy was cancelled ([`CopyProgress::cancel`]) before it finished.
    pub cancelled: bool,
}

impl CopyReport {
    /// Whether everything was copied.
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty() && !self.cancelled
    }

    /// `Ok` when everything was copied; else the first error, or [`Error::Cancelled`].
    pub fn check(&self) -> Result<()> {
        match self.errors.first() {
            Some(e) => Err(e.error.clone()),
            None if self.cancelled => Err(Error::Cancelled),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_parse() {
        for m in [
            CopyMethod::Auto,
            CopyMethod::ReadWrite,
            CopyMethod::CopyFileRange,
        ] {
            assert_eq!(m.as_str().parse::<CopyMethod>().unwrap(), m);
        }
        assert_eq!(
            "cfr".parse::<CopyMethod>().unwrap(),
            CopyMethod::CopyFileRange
        );
        assert!("fast".parse::<CopyMethod>().is_err());
    }
}
