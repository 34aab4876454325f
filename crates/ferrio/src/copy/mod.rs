//! Copying files and directory trees ([`copy`]): the rules of `cp` for where things go, a walk of
//! the sources, and one copy per file that is renamed into place only when it is complete.
//!
//! This module owns the copy's plan, its scheduling and its report. It makes no syscall itself
//! (those live in [`crate::sys`]) and reaches the worker pools only through [`File`].
//!
//! # How a file is copied
//! The source is opened as a [`File`] (its reads run on the source device's pool) and a
//! temporary file `.NAME.ferrio-XXXXXX` is created next to the destination and opened as a second
//! [`File`] (its writes run on the destination device's pool). Only the source's data extents
//! are copied (`SEEK_DATA`/`SEEK_HOLE`), so holes stay holes, and a trailing hole is kept by
//! setting the length. Each extent is cut into windows and a few windows are in flight at once:
//! window *i+1* is being read while window *i* is being written, so each device works at its own
//! pace. Where source and destination share a file system the kernel copies instead
//! (`copy_file_range`, unless [`CopyMethod::ReadWrite`] is asked for): the data is cut into a few
//! contiguous segments copied at once, each one sequentially through its own file description so
//! that page-cache readahead keeps ahead of it, each on a thread of the copy (the calls block in
//! the kernel and move no bytes through ferrio), which on one disk is faster than copying
//! through memory (measured: see benchmarks/RESULTS.md).
//! Several files are copied at once, handed out so that every source and destination device has
//! files under way.
//!
//! # Nothing lost, nothing half-done
//! The destination name is touched once, by `rename(2)` of the complete temporary file, so an
//! existing destination is never truncated or partly overwritten, and a reader sees the old file
//! or the new one. On an error or a cancel the temporary file is removed; the error is listed in
//! [`CopyReport::errors`] and the other files go on. Only a crash or `SIGKILL` can leave a
//! `.NAME.ferrio-XXXXXX` file behind.
//!
//! # Durability
//! By default files are renamed into place without `fdatasync`, like `cp`: after a power loss a
//! new file may be missing or, on file systems without ext4's `auto_da_alloc` rename heuristic,
//! empty. [`CopyOptions::sync`] flushes each file before its rename, so the destination name
//! holds the old content or the whole new content at any moment. The time until the data is on
//! the device is about the same either way (a `sync(1)` after a plain copy waits as long), but
//! the copy itself returns later, which is why it is not the default (measured: see
//! benchmarks/RESULTS.md). [`CopyOptions::verify`]
//! implies it, since the check must read what the device holds, not the page cache.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::buffer::{IoBuf, IoBufMut};
use crate::config::{DirectMode, Settings};
use crate::error::{Error, Op, Result};
use crate::file::File;
use crate::pool::IoFuture;
use crate::sys::{self, AlignedBuf, Timestamp};

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

/// What [`copy`] does and how. Build with [`CopyOptions::new`] and the setters, or set the
/// fields.
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
    /// `fdatasync` each file before renaming it into place (see the module docs on durability).
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
    files_total: AtomicU64,
    bytes_total: AtomicU64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    errors: AtomicU64,
    cancelled: AtomicBool,
}

impl CopyProgress {
    /// Fresh counters, shared.
    pub fn new() -> Arc<CopyProgress> {
        Arc::new(CopyProgress::default())
    }

    /// Asks the copy to stop: no new file is started, files under way are abandoned and their
    /// temporary files removed. [`copy`] then returns a report with `cancelled` set.
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

    fn add_bytes(&self, n: u64) {
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

/// Copies `sources` to `dest` the way `cp` would, fast: see the [module docs](self).
///
/// Destination rules: one source and `dest` an existing directory (or a symlink to one) puts
/// the copy inside it as `dest/NAME`; otherwise the copy is `dest` itself. Several sources need
/// `dest` to be a directory. A directory source needs [`CopyOptions::recursive`]; into an existing
/// directory it is merged. Copying a directory into itself is refused. Copying a file over an
/// existing file replaces it when the new copy is complete; without `preserve` the replacement
/// keeps the old file's mode (and owner, where permitted), as `cp` does.
///
/// Errors before anything is copied (a missing source, a bad destination) are returned as
/// `Err`; errors of single files are listed in the report and the copy goes on.
///
/// ```no_run
/// # fn main() -> ferrio::Result<()> {
/// use ferrio::copy::{copy, CopyOptions};
/// let options = CopyOptions::new().recursive(true).preserve(true);
/// let report = copy(["/data/checkpoints"], "/mnt/backup", &options)?;
/// report.check()?; // the first failed file, if any
/// println!("{} files, {} bytes in {:.1} s", report.files, report.bytes, report.seconds);
/// # Ok(()) }
/// ```
pub fn copy<I, P>(sources: I, dest: impl AsRef<Path>, options: &CopyOptions) -> Result<CopyReport>
where
    I: IntoIterator<Item = P>,
    P: AsRef<Path>,
{
    let t0 = Instant::now();
    let sources: Vec<PathBuf> = sources
        .into_iter()
        .map(|p| p.as_ref().to_path_buf())
        .collect();
    let roots = plan_roots(&sources, dest.as_ref(), options)?;
    let settings = options.settings.clone().unwrap_or_else(Settings::current);
    let window = if options.window_bytes > 0 {
        options.window_bytes
    } else {
        (2 * settings.task_size).clamp(MIN_WINDOW, MAX_WINDOW)
    };
    let copier = Copier {
        options,
        progress: options.progress.clone().unwrap_or_default(),
        window: window.max(sys::page_size() as u64) as usize,
        depth: if options.windows_in_flight > 0 {
            options.windows_in_flight
        } else {
            DEFAULT_WINDOWS_IN_FLIGHT
        },
        settings,
        umask: sys::umask(),
        tally: Mutex::new(Tally::default()),
    };
    copier.run(roots);
    let mut report = copier.into_report();
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// Smallest and largest pipeline window picked by default.
const MIN_WINDOW: u64 = 1 << 20;
const MAX_WINDOW: u64 = 64 << 20;
/// Windows in flight per file by default: enough that a read and a write of the same file
/// overlap with room for both devices to queue.
const DEFAULT_WINDOWS_IN_FLIGHT: usize = 4;
/// Files copied at once by default: a small file's copy is mostly metadata calls, which overlap,
/// so more files at once than devices pays (measured: see benchmarks/RESULTS.md).
const DEFAULT_PARALLEL_FILES: usize = 8;
/// Files copied at once by default when every file stays within its file system
/// (`copy_file_range`, which holds no buffers): more streams keep the disk's queue fuller than
/// `DEFAULT_PARALLEL_FILES`, and more than this gained nothing (measured: see
/// benchmarks/RESULTS.md).
const KERNEL_COPY_PARALLEL_FILES: usize = 12;
/// Most files copied at once by default.
const MAX_PARALLEL_FILES: usize = 16;

/// A source named by the caller and where it goes.
struct Root {
    src: PathBuf,
    dst: PathBuf,
    meta: Metadata,
}

/// Applies `cp`'s destination rules; every error here is the caller's (nothing copied yet).
fn plan_roots(sources: &[PathBuf], dest: &Path, o: &CopyOptions) -> Result<Vec<Root>> {
    if sources.is_empty() {
        return Err(Error::InvalidArgument("no source to copy".into()));
    }
    let dest_is_dir = fs::metadata(dest).is_ok_and(|m| m.is_dir());
    if sources.len() > 1 && !dest_is_dir {
        return Err(Error::InvalidArgument(format!(
            "copying {} sources needs a directory as destination, and {} is not one",
            sources.len(),
            dest.display()
        )));
    }
    let trailing_slash = dest.as_os_str().as_bytes().ends_with(b"/");
    let mut roots = Vec::with_capacity(sources.len());
    for src in sources {
        let follow = o.follow_symlinks || !o.recursive;
        let meta = if follow {
            fs::metadata(src)
        } else {
            fs::symlink_metadata(src)
        }
        .map_err(|source| Error::Open {
            path: src.clone(),
            mode: "r".into(),
            source,
        })?;
        let dst = if dest_is_dir {
            dest.join(base_name(src)?)
        } else {
            dest.to_path_buf()
        };
        if meta.is_dir() {
            if !o.recursive {
                return Err(Error::InvalidArgument(format!(
                    "{} is a directory: copy it with recursive (-r)",
                    src.display()
                )));
            }
            if !dest_is_dir && fs::symlink_metadata(&dst).is_ok() {
                return Err(Error::InvalidArgument(format!(
                    "cannot overwrite {}, which is not a directory, with directory {}",
                    dst.display(),
                    src.display()
                )));
            }
            if is_inside(src, &dst) {
                return Err(Error::InvalidArgument(format!(
                    "cannot copy directory {} into itself ({})",
                    src.display(),
                    dst.display()
                )));
            }
        } else if !dest_is_dir && trailing_slash {
            return Err(Error::InvalidArgument(format!(
                "{} is not a directory",
                dest.display()
            )));
        }
        roots.push(Root {
            src: src.clone(),
            dst,
            meta,
        });
    }
    Ok(roots)
}

/// The last component of `src`, resolving `.`, `..` and `/`-ended paths as `cp` does.
fn base_name(src: &Path) -> Result<OsString> {
    if let Some(name) = src.file_name() {
        if !src.as_os_str().as_bytes().ends_with(b"/..") && src.as_os_str() != ".." {
            return Ok(name.to_os_string());
        }
    }
    let canon = fs::canonicalize(src).map_err(|source| Error::Fs {
        action: "resolve",
        path: src.to_path_buf(),
        source,
    })?;
    canon
        .file_name()
        .map(|n| n.to_os_string())
        .ok_or_else(|| Error::InvalidArgument(format!("cannot copy {} by name", src.display())))
}

/// Whether `dst` (which may not exist yet) is `dir` or lies inside it.
fn is_inside(dir: &Path, dst: &Path) -> bool {
    let Ok(dir) = fs::canonicalize(dir) else {
        return false;
    };
    let dst = match fs::canonicalize(dst) {
        Ok(d) => d,
        Err(_) => {
            let parent = match dst.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let (Ok(parent), Some(name)) = (fs::canonicalize(parent), dst.file_name()) else {
                return false;
            };
            parent.join(name)
        }
    };
    dst.starts_with(&dir)
}

/// What an entry of the walk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
}

/// One thing to copy.
struct Entry {
    src: PathBuf,
    dst: PathBuf,
    meta: Metadata,
    kind: Kind,
    /// Device of the destination's file system (of its root's parent), for scheduling.
    dst_dev: u64,
}

/// Counts and errors gathered by the workers.
#[derive(Default)]
struct Tally {
    files: u64,
    dirs: u64,
    symlinks: u64,
    bytes: u64,
    bytes_cfr: u64,
    verified: u64,
    devices: HashMap<String, (u64, u64)>,
    errors: Vec<CopyError>,
}

/// One copy under way.
struct Copier<'a> {
    options: &'a CopyOptions,
    progress: Arc<CopyProgress>,
    settings: Settings,
    window: usize,
    depth: usize,
    umask: u32,
    tally: Mutex<Tally>,
}

impl Copier<'_> {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        // Only counters and a list are changed under this lock: a poisoned one is consistent.
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, e: &Entry, error: Error) {
        self.fail_paths(&e.src, &e.dst, error);
    }

    fn fail_paths(&self, src: &Path, dst: &Path, error: Error) {
        self.progress.errors.fetch_add(1, Ordering::Relaxed);
        self.tally().errors.push(CopyError {
            path: src.to_path_buf(),
            dest: dst.to_path_buf(),
            error,
        });
    }

    fn cancelled(&self) -> bool {
        self.progress.is_cancelled()
    }

    fn run(&self, roots: Vec<Root>) {
        let mut entries = Vec::new();
        for root in roots {
            let dst_dev = nearest_dev(&root.dst);
            let mut ancestors = Vec::new();
            self.walk(
                root.src,
                root.dst,
                root.meta,
                dst_dev,
                &mut entries,
                &mut ancestors,
            );
        }
        let (files, bytes) =
            entries
                .iter()
                .filter(|e| e.kind != Kind::Dir)
                .fold((0u64, 0u64), |(n, b), e| {
                    (
                        n + 1,
                        b + if e.kind == Kind::File {
                            e.meta.len()
                        } else {
                            0
                        },
                    )
                });
        self.progress.files_total.store(files, Ordering::Relaxed);
        self.progress.bytes_total.store(bytes, Ordering::Relaxed);

        let (created, failed_dirs) = self.make_dirs(&entries);
        let work: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].kind != Kind::Dir)
            .filter(|&i| !failed_dirs.iter().any(|d| entries[i].dst.starts_with(d)))
            .collect();
        self.copy_all(&entries, &work);
        // Also after a cancel: directories made here must not stay owner-only.
        self.finish_dirs(&entries, &created);
    }

    /// Walks `src` depth first, children in name order, appending what to copy.
    fn walk(
        &self,
        src: PathBuf,
        dst: PathBuf,
        meta: Metadata,
        dst_dev: u64,
        out: &mut Vec<Entry>,
        ancestors: &mut Vec<(u64, u64)>,
    ) {
        if self.cancelled() {
            return;
        }
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else if ft.is_symlink() {
            Kind::Symlink
        } else {
            self.fail_paths(
                &src,
                &dst,
                Error::InvalidArgument(format!(
                    "{} is not a regular file, directory or symlink: not copied",
                    src.display()
                )),
            );
            return;
        };
        if kind != Kind::Dir {
            out.push(Entry {
                src,
                dst,
                meta,
                kind,
                dst_dev,
            });
            return;
        }
        let id = (meta.dev(), meta.ino());
        if ancestors.contains(&id) {
            let error = Error::Fs {
                action: "follow symlinks into a loop at",
                path: src.clone(),
                source: io::Error::from_raw_os_error(libc::ELOOP),
            };
            self.fail_paths(&src, &dst, error);
            return;
        }
        let names = match read_names(&src) {
            Ok(n) => n,
            Err(source) => {
                let error = Error::Fs {
                    action: "list directory",
                    path: src.clone(),
                    source,
                };
                self.fail_paths(&src, &dst, error);
                return;
            }
        };
        out.push(Entry {
            src: src.clone(),
            dst: dst.clone(),
            meta,
            kind,
            dst_dev,
        });
        ancestors.push(id);
        for name in names {
            let csrc = src.join(&name);
            let cdst = dst.join(&name);
            let cmeta = if self.options.follow_symlinks {
                // A dangling link cannot be followed: it is copied as the link it is.
                fs::metadata(&csrc).or_else(|_| fs::symlink_metadata(&csrc))
            } else {
                fs::symlink_metadata(&csrc)
            };
            match cmeta {
                Ok(m) => self.walk(csrc, cdst, m, dst_dev, out, ancestors),
                Err(source) => {
                    let error = Error::Fs {
                        action: "stat",
                        path: csrc.clone(),
                        source,
                    };
                    self.fail_paths(&csrc, &cdst, error);
                }
            }
        }
        ancestors.pop();
    }

    /// Creates the destination directories, parents first. Returns which entries were created
    /// here (their final mode is set at the end) and the destinations that could not be made
    /// (nothing below them is tried).
    fn make_dirs(&self, entries: &[Entry]) -> (Vec<bool>, Vec<PathBuf>) {
        let mut created = vec![false; entries.len()];
        let mut failed: Vec<PathBuf> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if e.kind != Kind::Dir || self.cancelled() {
                continue;
            }
            if failed.iter().any(|d| e.dst.starts_with(d)) {
                continue;
            }
            let outcome = match fs::symlink_metadata(&e.dst) {
                Ok(m) if m.is_dir() => Ok(false),
                Ok(_) => Err(Error::Fs {
                    action: "cannot replace a non-directory with a directory:",
                    path: e.dst.clone(),
                    source: io::Error::from_raw_os_error(libc::ENOTDIR),
                }),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    // Owner-only until its contents are in; the final mode is set last.
                    fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&e.dst)
                        .map(|()| true)
                        .map_err(|source| Error::Fs {
                            action: "create directory",
                            path: e.dst.clone(),
                            source,
                        })
                }
                Err(source) => Err(Error::Fs {
                    action: "stat",
                    path: e.dst.clone(),
                    source,
                }),
            };
            match outcome {
                Ok(new) => {
                    created[i] = new;
                    self.tally().dirs += 1;
                }
                Err(error) => {
                    failed.push(e.dst.clone());
                    self.fail(e, error);
                }
            }
        }
        (created, failed)
    }

    /// Sets directories' modes (and, with `preserve`, owners and times), children first, now
    /// that nothing more is written into them.
    fn finish_dirs(&self, entries: &[Entry], created: &[bool]) {
        for (i, e) in entries.iter().enumerate().rev() {
            if e.kind != Kind::Dir || !(created[i] || self.options.preserve) {
                continue;
            }
            if let Err(error) = self.apply_dir_meta(e) {
                self.fail(e, error);
            }
        }
    }

    fn apply_dir_meta(&self, e: &Entry) -> Result<()> {
        let fs_err = |action: &'static str| {
            let path = e.dst.clone();
            move |source| Error::Fs {
                action,
                path,
                source,
            }
        };
        let mut mode = self.new_mode(&e.meta);
        if self.options.preserve && !self.chown_path(&e.dst, &e.meta)? {
            mode &= !0o6000;
        }
        fs::set_permissions(&e.dst, fs::Permissions::from_mode(mode))
            .map_err(fs_err("set permissions of"))?;
        if self.options.preserve {
            let (a, m) = times(&e.meta);
            sys::lutimens(&e.dst, a, m).map_err(fs_err("set times of"))?;
        }
        Ok(())
    }

    /// The mode a new copy of something with `meta` gets: the source's with `preserve`, else
    /// the source's permission bits less the umask (as `cp`).
    fn new_mode(&self, meta: &Metadata) -> u32 {
        if self.options.preserve {
            meta.mode() & 0o7777
        } else {
            meta.mode() & 0o777 & !self.umask
        }
    }

    /// `lchown` to the owner in `meta`; `Ok(false)` when not permitted (not root).
    fn chown_path(&self, path: &Path, meta: &Metadata) -> Result<bool> {
        match std::os::unix::fs::lchown(path, Some(meta.uid()), Some(meta.gid())) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(false),
            Err(source) => Err(Error::Fs {
                action: "set owner of",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Copies the files and symlinks of `work` on several threads, spreading them over device
    /// pairs so that every source and destination device has files under way.
    fn copy_all(&self, entries: &[Entry], work: &[usize]) {
        if work.is_empty() {
            return;
        }
        let mut groups: Vec<((u64, u64), VecDeque<usize>)> = Vec::new();
        for &i in work {
            let key = (entries[i].meta.dev(), entries[i].dst_dev);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, q)) => q.push_back(i),
                None => groups.push((key, VecDeque::from([i]))),
            }
        }
        let kernel_copies = self.options.method != CopyMethod::ReadWrite
            && groups
                .iter()
                .all(|((src_dev, dst_dev), _)| src_dev == dst_dev);
        let threads = if self.options.parallel_files > 0 {
            self.options.parallel_files
        } else if kernel_copies {
            (2 * groups.len()).clamp(KERNEL_COPY_PARALLEL_FILES, MAX_PARALLEL_FILES)
        } else {
            (2 * groups.len()).clamp(DEFAULT_PARALLEL_FILES, MAX_PARALLEL_FILES)
        }
        .min(work.len())
        .max(1);
        let sched = Scheduler::new(groups.into_iter().map(|(_, q)| q).collect());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut ring = Ring::new(self.window, self.depth);
                    while let Some((g, i)) = sched.next() {
                        if !self.cancelled() {
                            self.copy_entry(&entries[i], &mut ring);
                        }
                        sched.done(g);
                    }
                });
            }
        });
    }

    fn copy_entry(&self, e: &Entry, ring: &mut Ring) {
        let outcome = match e.kind {
            Kind::File => self.copy_file(e, ring).map(|done| {
                let mut t = self.tally();
                t.files += 1;
                t.bytes += done.bytes;
                t.bytes_cfr += done.bytes_cfr;
                t.verified += u64::from(done.verified);
                let r = t.devices.entry(done.src_pool).or_default();
                r.0 += done.bytes;
                let w = t.devices.entry(done.dst_pool).or_default();
                w.1 += done.bytes;
            }),
            Kind::Symlink => self.copy_symlink(e).map(|()| self.tally().symlinks += 1),
            Kind::Dir => Ok(()),
        };
        match outcome {
            Ok(()) => {}
            // A cancelled file is not an error of that file: the report says cancelled.
            Err(Error::Cancelled) if self.cancelled() => {}
            Err(error) => self.fail(e, error),
        }
        self.progress.files_done.fetch_add(1, Ordering::Relaxed);
    }

    /// What is at the destination now; an error if it cannot be replaced by a file or link.
    fn existing_dest(&self, e: &Entry) -> Result<Option<Metadata>> {
        let existing = match fs::symlink_metadata(&e.dst) {
            Ok(m) => Some(m),
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(Error::Fs {
                    action: "stat",
                    path: e.dst.clone(),
                    source,
                })
            }
        };
        let Some(m) = &existing else {
            return Ok(None);
        };
        if m.is_dir() {
            return Err(Error::Fs {
                action: "cannot replace a directory with a non-directory:",
                path: e.dst.clone(),
                source: io::Error::from_raw_os_error(libc::EISDIR),
            });
        }
        let target = if m.file_type().is_symlink() {
            fs::metadata(&e.dst).ok()
        } else {
            Some(m.clone())
        };
        if let Some(m) = target {
            if m.dev() == e.meta.dev() && m.ino() == e.meta.ino() {
                return Err(Error::InvalidArgument(format!(
                    "{} and {} are the same file",
                    e.src.display(),
                    e.dst.display()
                )));
            }
        }
        Ok(existing)
    }

    fn copy_symlink(&self, e: &Entry) -> Result<()> {
        self.existing_dest(e)?;
        let target = fs::read_link(&e.src).map_err(|source| Error::Fs {
            action: "read symlink",
            path: e.src.clone(),
            source,
        })?;
        let temp = TempPath::create(&e.dst, |p| std::os::unix::fs::symlink(&target, p))?;
        if self.options.preserve {
            self.chown_path(temp.path(), &e.meta)?;
            let (a, m) = times(&e.meta);
            sys::lutimens(temp.path(), a, m).map_err(|source| Error::Fs {
                action: "set times of",
                path: e.dst.clone(),
                source,
            })?;
        }
        temp.commit(&e.dst)
    }

    fn copy_file(&self, e: &Entry, ring: &mut Ring) -> Result<FileDone> {
        let existing = self.existing_dest(e)?;
        let mut created = None;
        let temp = TempPath::create(&e.dst, |p| {
            let f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(p)?;
            created = Some(f);
            Ok(())
        })?;
        let handle = Arc::new(created.ok_or_else(|| Error::Fs {
            action: "create temporary file for",
            path: e.dst.clone(),
            source: io::Error::other("no file handle"),
        })?);
        let on_dst = |err: Error| repath(err, temp.path(), &e.dst);
        let dst_io = |op, offset, source| Error::io(op, &e.dst, offset, 0, source);
        let dst_dev = sys::fstat(handle.as_fd()).map_or(0, |st| st.st_dev);
        let try_cfr = match self.options.method {
            CopyMethod::ReadWrite => false,
            CopyMethod::CopyFileRange => true,
            // Where source and destination share a file system the kernel copies.
            CopyMethod::Auto => dst_dev == e.meta.dev(),
        };
        // Only descriptors that will be used are opened (a small file's copy is mostly opens):
        // no O_DIRECT source when the kernel copies, the copy opened as a `File` only when bytes
        // pass through memory or it is verified.
        let opts = File::options().settings(self.settings.clone());
        let src_opts = if try_cfr {
            opts.clone().direct_read(DirectMode::Off)
        } else {
            opts.clone()
        };
        let src = src_opts.open(&e.src, "r")?;
        let size = src.len()?;
        let extents = data_extents(&src, size)?;
        let data: u64 = extents.iter().map(|(s, end)| end - s).sum();
        let open_out = |mode: &str| {
            let o = opts.clone().direct_read(DirectMode::Off);
            o.open(temp.path(), mode).map_err(on_dst)
        };
        let mut bytes_cfr = 0;
        let mut out = None;
        let moved = if try_cfr && data > 0 {
            match self.copy_cfr(&src, &handle, &e.dst, &extents) {
                Ok(n) => {
                    bytes_cfr = n;
                    n
                }
                Err(Error::Io {
                    op: Op::Copy,
                    source,
                    ..
                }) if sys::copy_unsupported(&source) => {
                    let o = out.insert(open_out("r+")?);
                    self.copy_rw(&src, o, &extents, ring).map_err(on_dst)?
                }
                Err(err) => return Err(on_dst(err)),
            }
        } else {
            let o = out.insert(open_out("r+")?);
            self.copy_rw(&src, o, &extents, ring).map_err(on_dst)?
        };
        if extents.last().map_or(0, |&(_, end)| end) < size {
            // A trailing hole: the data written so far ends before the file does.
            sys::ftruncate(handle.as_fd(), size).map_err(|err| dst_io(Op::Write, size, err))?;
        }
        if self.options.sync || self.options.verify {
            sys::fdatasync(handle.as_fd()).map_err(|err| dst_io(Op::Sync, 0, err))?;
        }
        let mut verified = false;
        if self.options.verify {
            // Drop the copy's pages so that the comparison reads what the device holds.
            let _ = sys::fadvise_dontneed(handle.as_fd(), 0, 0);
            let copy = opts.open(temp.path(), "r").map_err(on_dst)?;
            self.verify_same(&src, &copy, size, ring).map_err(on_dst)?;
            verified = true;
        }
        self.apply_file_meta(&handle, e, existing.as_ref())?;
        temp.commit(&e.dst)?;
        self.progress.add_bytes(size.saturating_sub(data));
        let src_pool = src.pool().key().to_string();
        Ok(FileDone {
            bytes: moved,
            bytes_cfr,
            verified,
            // `copy_file_range` needs one file system, so one pool.
            dst_pool: out.map_or_else(|| src_pool.clone(), |o| o.pool().key().to_string()),
            src_pool,
        })
    }

    /// Owner, mode and (with `preserve`) times of the new file, through its open handle.
    fn apply_file_meta(&self, f: &fs::File, e: &Entry, existing: Option<&Metadata>) -> Result<()> {
        let fs_err = |action: &'static str| {
            let path = e.dst.clone();
            move |source| Error::Fs {
                action,
                path,
                source,
            }
        };
        // Replacing a file without -p keeps that file's mode and owner, as cp (which writes into
        // it) does.
        let existing = existing.filter(|m| m.is_file() && !self.options.preserve);
        let (mut mode, owner) = match existing {
            Some(m) => (m.mode() & 0o7777, Some((m.uid(), m.gid()))),
            None if self.options.preserve => {
                (e.meta.mode() & 0o7777, Some((e.meta.uid(), e.meta.gid())))
            }
            None => (self.new_mode(&e.meta), None),
        };
        if let Some((uid, gid)) = owner {
            match std::os::unix::fs::fchown(f, Some(uid), Some(gid)) {
                Ok(()) => {}
                // Not root: keep our own owner, and drop set-id bits that would now be wrong.
                Err(err) if err.raw_os_error() == Some(libc::EPERM) => mode &= !0o6000,
                Err(source) => return Err(fs_err("set owner of")(source)),
            }
        }
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(fs_err("set permissions of"))?;
        if self.options.preserve {
            let (a, m) = times(&e.meta);
            sys::futimens(f.as_fd(), a, m).map_err(fs_err("set times of"))?;
        }
        Ok(())
    }

    /// Copies the extents through memory: windows read on the source's pool and written on the
    /// destination's, up to `depth` windows in flight. Returns the bytes moved.
    fn copy_rw(
        &self,
        src: &File,
        out: &File,
        extents: &[(u64, u64)],
        ring: &mut Ring,
    ) -> Result<u64> {
        let mut windows = windows(extents, self.window as u64);
        let mut next = windows.next();
        let mut reads: VecDeque<(u64, usize, IoFuture<Window>)> = VecDeque::new();
        let mut writes: VecDeque<(usize, IoFuture<Window>)> = VecDeque::new();
        let mut moved = 0u64;
        let result = loop {
            // Finished writes give their windows back.
            let mut failed = None;
            while writes.front().is_some_and(|(_, f)| f.is_done()) {
                let Some((len, f)) = writes.pop_front() else {
                    break;
                };
                let (r, w) = f.into_buffer();
                ring.give(w);
                match r {
                    Ok(_) => {
                        moved += len as u64;
                        self.progress.add_bytes(len as u64);
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                break Err(e);
            }
            if self.cancelled() {
                break Err(Error::Cancelled);
            }
            while reads.len() + writes.len() < self.depth {
                let Some((off, len)) = next else {
                    break;
                };
                let w = match ring.take(len) {
                    Ok(w) => w,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                };
                reads.push_back((off, len, src.pread(w, off)));
                next = windows.next();
            }
            if let Some(e) = failed {
                break Err(e);
            }
            if let Some((off, len, f)) = reads.pop_front() {
                let (r, w) = f.into_buffer();
                match r {
                    Ok(n) if n == len => writes.push_back((len, out.pwrite(w, off))),
                    Ok(n) => {
                        ring.give(w);
                        break Err(shrank(src.path(), off + n as u64));
                    }
                    Err(e) => {
                        ring.give(w);
                        break Err(e);
                    }
                }
            } else if let Some((len, f)) = writes.pop_front() {
                let (r, w) = f.into_buffer();
                ring.give(w);
                match r {
                    Ok(_) => {
                        moved += len as u64;
                        self.progress.add_bytes(len as u64);
                    }
                    Err(e) => break Err(e),
                }
            } else {
                break Ok(moved);
            }
        };
        if result.is_err() {
            // Stop what has not started, wait for what has, and keep the windows.
            for (_, _, f) in &reads {
                f.cancel();
            }
            for (_, f) in &writes {
                f.cancel();
            }
            for (_, _, f) in reads {
                ring.give(f.into_buffer().1);
            }
            for (_, f) in writes {
                ring.give(f.into_buffer().1);
            }
        }
        result
    }

    /// Copies the extents with `copy_file_range` into `out`. Returns the bytes moved.
    ///
    /// The data is cut into up to `depth` contiguous segments (one per [`CFR_SEGMENT_MIN`] of
    /// data), copied at once, each by its own thread (this one for the first) as one sequential
    /// stream of window-sized calls through its own open file description of the source. The
    /// kernel copies through the page cache, whose readahead state belongs to the file
    /// description: one sequential reader per description keeps readahead running ahead of each
    /// segment. The calls block in the kernel and move no bytes through ferrio, so they run on
    /// the copy's own threads rather than as tasks on the device's pool, which was faster
    /// (measured: see benchmarks/RESULTS.md).
    fn copy_cfr(
        &self,
        src: &File,
        out: &Arc<fs::File>,
        dst: &Path,
        extents: &[(u64, u64)],
    ) -> Result<u64> {
        let data: u64 = extents.iter().map(|&(start, end)| end - start).sum();
        let k = usize::try_from(data / CFR_SEGMENT_MIN)
            .unwrap_or(usize::MAX)
            .clamp(1, self.depth.max(1));
        let segments = split_extents(extents, k, self.window as u64);
        let readers = segment_readers(src, segments.len());
        let failed = AtomicBool::new(false);
        let copy = |seg: &[(u64, u64)], reader: &dyn AsFd| -> Result<u64> {
            let mut moved = 0;
            for &(start, end) in seg {
                let mut off = start;
                while off < end {
                    if self.cancelled() || failed.load(Ordering::Relaxed) {
                        return Err(Error::Cancelled);
                    }
                    let len = (end - off).min(self.window as u64);
                    let n = sys::copy_file_range(reader.as_fd(), off, out.as_fd(), off, len)
                        .map_err(|e| Error::io(Op::Copy, dst, off, len, e))?;
                    self.progress.add_bytes(n);
                    moved += n;
                    if n < len {
                        return Err(shrank(src.path(), off + n));
                    }
                    off += n;
                }
            }
            Ok(moved)
        };
        let outcomes: Vec<Result<u64>> = std::thread::scope(|s| {
            let copy = &copy;
            let failed = &failed;
            let helpers: Vec<_> = segments[1..]
                .iter()
                .zip(&readers[1..])
                .map(|(seg, reader)| {
                    s.spawn(move || {
                        let r = copy(seg, &**reader);
                        failed.fetch_or(r.is_err(), Ordering::Relaxed);
                        r
                    })
                })
                .collect();
            let first = copy(&segments[0], &*readers[0]);
            failed.fetch_or(first.is_err(), Ordering::Relaxed);
            std::iter::once(first)
                .chain(helpers.into_iter().map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::InvalidArgument("a copy thread panicked".into()))
                    })
                }))
                .collect()
        });
        // The first real error; `Cancelled` only if that is all there is (the user's cancel, or
        // segments stopped because another failed).
        let mut moved = 0;
        let mut cancelled = None;
        for outcome in outcomes {
            match outcome {
                Ok(n) => moved += n,
                Err(Error::Cancelled) => cancelled = Some(Error::Cancelled),
                Err(e) => return Err(e),
            }
        }
        cancelled.map_or(Ok(moved), Err)
    }

    /// Reads `a` and `b` back in windows and compares every byte.
    fn verify_same(&self, a: &File, b: &File, size: u64, ring: &mut Ring) -> Result<()> {
        verify_files(a, b, size, self.window, ring, &self.progress)
    }
}

/// The outcome of one file.
struct FileDone {
    bytes: u64,
    bytes_cfr: u64,
    verified: bool,
    src_pool: String,
    dst_pool: String,
}

/// Bytes of data per `copy_file_range` segment of one file, at least (smaller files are one
/// sequential stream).
const CFR_SEGMENT_MIN: u64 = 64 << 20;

/// The extents cut into `k` contiguous parts of about equal data, cut at multiples of `unit`
/// (at least one part, none empty).
fn split_extents(extents: &[(u64, u64)], k: usize, unit: u64) -> Vec<Vec<(u64, u64)>> {
    let data: u64 = extents.iter().map(|&(start, end)| end - start).sum();
    let share = data.div_ceil(k.max(1) as u64).div_ceil(unit.max(1)) * unit.max(1);
    let mut parts = vec![Vec::new()];
    let mut room = share;
    for &(mut start, end) in extents {
        while start < end {
            if room == 0 {
                parts.push(Vec::new());
                room = share;
            }
            let stop = end.min(start + room);
            parts
                .last_mut()
                .expect("one part at least")
                .push((start, stop));
            room -= stop - start;
            start = stop;
        }
    }
    parts
}

/// `n` descriptors to read the source through: the source's own for the first, fresh opens of
/// the same open file (through `/proc/self/fd`, so no other file can take its place) for the
/// others, each with its own readahead state. Where `/proc` is missing they share the source's.
fn segment_readers(src: &File, n: usize) -> Vec<Arc<dyn AsFd + Send + Sync>> {
    let mut readers: Vec<Arc<dyn AsFd + Send + Sync>> = vec![Arc::new(src.clone())];
    let again = PathBuf::from(format!("/proc/self/fd/{}", src.as_raw_fd()));
    for _ in 1..n {
        match sys::open(&again, libc::O_RDONLY, 0) {
            Ok(fd) => readers.push(Arc::new(fd)),
            Err(_) => readers.push(Arc::new(src.clone())),
        }
    }
    readers
}

impl Copier<'_> {
    fn into_report(self) -> CopyReport {
        let cancelled = self.cancelled();
        let t = self.tally.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut devices: Vec<DeviceTraffic> = t
            .devices
            .into_iter()
            .map(|(pool, (bytes_read, bytes_written))| DeviceTraffic {
                pool,
                bytes_read,
                bytes_written,
            })
            .collect();
        devices.sort_by(|a, b| a.pool.cmp(&b.pool));
        CopyReport {
            files: t.files,
            dirs: t.dirs,
            symlinks: t.symlinks,
            bytes: t.bytes,
            bytes_copy_file_range: t.bytes_cfr,
            verified: t.verified,
            seconds: 0.0,
            devices,
            errors: t.errors,
            cancelled,
        }
    }
}

/// Compares `a` and `b` over `[0, size)`, two windows at a time (one of each, read at once).
fn verify_files(
    a: &File,
    b: &File,
    size: u64,
    window: usize,
    ring: &mut Ring,
    progress: &CopyProgress,
) -> Result<()> {
    let mut off = 0u64;
    while off < size {
        if progress.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let len = (size - off).min(window as u64) as usize;
        let (wa, wb) = (ring.take(len)?, ring.take(len)?);
        let (fa, fb) = (a.pread(wa, off), b.pread(wb, off));
        let ((ra, wa), (rb, wb)) = (fa.into_buffer(), fb.into_buffer());
        let outcome = match (ra, rb) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(na), Ok(nb)) => match first_difference(&wa.bytes()[..na], &wb.bytes()[..nb]) {
                None if na == len => Ok(()),
                None => Err(shrank(a.path(), off + na as u64)),
                Some(i) => Err(Error::io(
                    Op::Copy,
                    b.path(),
                    off + i as u64,
                    1,
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the copy differs from {}", a.path().display()),
                    ),
                )),
            },
        };
        ring.give(wa);
        ring.give(wb);
        outcome?;
        off += len as u64;
    }
    Ok(())
}

/// The first index where `a` and `b` differ (a length difference counts at the shorter end).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    const CHUNK: usize = 4096;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i < n {
        let end = (i + CHUNK).min(n);
        if a[i..end] != b[i..end] {
            return a[i..end]
                .iter()
                .zip(&b[i..end])
                .position(|(x, y)| x != y)
                .map(|p| i + p);
        }
        i = end;
    }
    (a.len() != b.len()).then_some(n)
}

fn shrank(path: &Path, at: u64) -> Error {
    Error::io(
        Op::Read,
        path,
        at,
        0,
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the source file shrank while it was being copied",
        ),
    )
}

/// The data extents `(start, end)` of `f` up to `size`, from `SEEK_DATA`/`SEEK_HOLE`; the whole
/// file where the file system does not track holes.
fn data_extents(f: &File, size: u64) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut off = 0u64;
    let err = |off, e| Error::io(Op::Read, f.path(), off, 0, e);
    while off < size {
        let start = match sys::seek_data(f.as_fd(), off) {
            Ok(Some(s)) => s,
            Ok(None) => break,
            Err(e)
                if off == 0
                    && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) =>
            {
                return Ok(vec![(0, size)]);
            }
            Err(e) => return Err(err(off, e)),
        };
        if start >= size {
            break;
        }
        let hole = sys::seek_hole(f.as_fd(), start).map_err(|e| err(start, e))?;
        let end = if hole <= start { size } else { hole.min(size) };
        out.push((start, end));
        off = end;
    }
    Ok(out)
}

/// The extents cut into windows of at most `window` bytes.
fn windows(extents: &[(u64, u64)], window: u64) -> impl Iterator<Item = (u64, usize)> + '_ {
    extents.iter().flat_map(move |&(start, end)| {
        let n = (end - start).div_ceil(window);
        (0..n).map(move |k| {
            let off = start + k * window;
            (off, (end - off).min(window) as usize)
        })
    })
}

/// Access and modification times of `meta`.
fn times(meta: &Metadata) -> (Timestamp, Timestamp) {
    (
        Timestamp {
            secs: meta.atime(),
            nanos: meta.atime_nsec(),
        },
        Timestamp {
            secs: meta.mtime(),
            nanos: meta.mtime_nsec(),
        },
    )
}

/// The names in a directory, sorted (so copies are made in a predictable order).
fn read_names(dir: &Path) -> io::Result<Vec<OsString>> {
    let mut names = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<Vec<_>>>()?;
    names.sort();
    Ok(names)
}

/// `st_dev` of the closest existing ancestor of `path` (of `path` itself if it exists).
fn nearest_dev(path: &Path) -> u64 {
    let mut p = Some(path);
    while let Some(q) = p {
        let q = if q.as_os_str().is_empty() {
            Path::new(".")
        } else {
            q
        };
        if let Ok(m) = fs::metadata(q) {
            return m.dev();
        }
        p = q.parent();
    }
    0
}

/// Moves errors about the temporary file onto the destination's name, which the user knows.
fn repath(e: Error, temp: &Path, dst: &Path) -> Error {
    match e {
        Error::Io {
            op,
            path,
            offset,
            len,
            source,
        } if path == temp => Error::Io {
            op,
            path: dst.to_path_buf(),
            offset,
            len,
            source,
        },
        Error::Open { path, mode, source } if path == temp => Error::Open {
            path: dst.to_path_buf(),
            mode,
            source,
        },
        other => other,
    }
}

/// Hands out files to copy threads: the next file comes from the device pair with the fewest
/// files under way, so that one device's many files do not keep the others idle.
struct Scheduler {
    groups: Mutex<Vec<(VecDeque<usize>, usize)>>,
}

impl Scheduler {
    fn new(queues: Vec<VecDeque<usize>>) -> Scheduler {
        Scheduler {
            groups: Mutex::new(queues.into_iter().map(|q| (q, 0)).collect()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(VecDeque<usize>, usize)>> {
        // Whole pops and counter changes only: a poisoned lock is consistent.
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `(group, entry)` to copy next, or `None` when all have been handed out.
    fn next(&self) -> Option<(usize, usize)> {
        let mut groups = self.lock();
        let g = (0..groups.len())
            .filter(|&g| !groups[g].0.is_empty())
            .min_by_key(|&g| groups[g].1)?;
        let i = groups[g].0.pop_front()?;
        groups[g].1 += 1;
        Some((g, i))
    }

    fn done(&self, g: usize) {
        let mut groups = self.lock();
        if let Some(group) = groups.get_mut(g) {
            group.1 = group.1.saturating_sub(1);
        }
    }
}

/// A window of a copy pipeline: an aligned buffer and how much of it a request uses.
struct Window {
    buf: AlignedBuf,
    len: usize,
}

impl Window {
    fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }
}

// SAFETY: the pointer is the start of the `AlignedBuf`'s heap memory, which holds at least `len`
// bytes (`Ring::take` checks) and does not move when the `Window` moves.
unsafe impl IoBufMut for Window {
    fn io_ptr_mut(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr()
    }
    fn io_len(&self) -> usize {
        self.len
    }
}

// SAFETY: as for `IoBufMut`; the future owns the `Window`, so safe code cannot change it
// meanwhile.
unsafe impl IoBuf for Window {
    fn io_ptr(&self) -> *const u8 {
        self.buf.as_slice().as_ptr()
    }
    fn io_len(&self) -> usize {
        self.len
    }
}

/// One copy thread's windows, reused from file to file.
struct Ring {
    spare: Vec<AlignedBuf>,
    window: usize,
}

/// Windows of small files are allocated in steps of this many bytes.
const SMALL_STEP: usize = 64 << 10;

impl Ring {
    fn new(window: usize, depth: usize) -> Ring {
        Ring {
            spare: Vec::with_capacity(depth + 1),
            window,
        }
    }

    /// A window of `len` bytes (at most the window size), page-aligned for `O_DIRECT`.
    fn take(&mut self, len: usize) -> Result<Window> {
        let buf = match self.spare.pop() {
            Some(b) if b.len() >= len => b,
            _ => {
                let size = if len * 2 > self.window {
                    self.window.max(len)
                } else {
                    len.div_ceil(SMALL_STEP).max(1) * SMALL_STEP
                };
                AlignedBuf::new(size, sys::page_size())
                    .ok_or_else(|| Error::OutOfMemory(format!("a copy window of {size} bytes")))?
            }
        };
        Ok(Window { buf, len })
    }

    fn give(&mut self, w: Window) {
        self.spare.push(w.buf);
    }
}

/// A temporary name next to a destination, removed on drop unless committed.
struct TempPath {
    path: PathBuf,
    committed: bool,
}

/// Bytes of the destination's name kept in the temporary name (which must fit `NAME_MAX`, 255).
const TEMP_NAME_KEEP: usize = 200;

impl TempPath {
    /// Makes something at a fresh temporary name next to `dst` with `make` (which must fail with
    /// `AlreadyExists` when the name is taken), trying new names until one is free.
    fn create(dst: &Path, mut make: impl FnMut(&Path) -> io::Result<()>) -> Result<TempPath> {
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

    fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the temporary file over `dst`.
    fn commit(mut self, dst: &Path) -> Result<()> {
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
    fn segments_cover_extents_in_order_in_about_equal_parts() {
        // Three extents, 1000 bytes of data, four parts cut at multiples of 10.
        let ext = [(0u64, 300u64), (500, 900), (1000, 1300)];
        let parts = split_extents(&ext, 4, 10);
        assert_eq!(
            parts,
            vec![
                vec![(0, 250)],
                vec![(250, 300), (500, 700)],
                vec![(700, 900), (1000, 1050)],
                vec![(1050, 1300)],
            ]
        );
        // Fewer parts than asked when the data runs out first; one part for k = 1 or no data.
        assert_eq!(split_extents(&[(0, 25)], 4, 10).len(), 3);
        assert_eq!(split_extents(&ext, 1, 4096), vec![ext.to_vec()]);
        assert_eq!(split_extents(&[], 3, 10), vec![Vec::<(u64, u64)>::new()]);
    }

    #[test]
    fn windows_cover_extents_exactly() {
        let ext = [(0u64, 10u64), (4096, 4096 + 25), (100, 100)];
        let w: Vec<_> = windows(&ext, 8).collect();
        assert_eq!(
            w,
            vec![(0, 8), (8, 2), (4096, 8), (4104, 8), (4112, 8), (4120, 1)]
        );
    }

    #[test]
    fn first_difference_finds_the_offset() {
        let a = vec![7u8; 10_000];
        let mut b = a.clone();
        assert_eq!(first_difference(&a, &b), None);
        b[9_001] = 0;
        assert_eq!(first_difference(&a, &b), Some(9_001));
        assert_eq!(first_difference(&a, &a[..5_000]), Some(5_000));
    }

    #[test]
    fn verify_reports_where_files_differ() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let mut bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&a, &bytes).unwrap();
        fs::write(&b, &bytes).unwrap();
        let (fa, fb) = (File::open(&a, "r").unwrap(), File::open(&b, "r").unwrap());
        let mut ring = Ring::new(1 << 20, 2);
        let progress = CopyProgress::default();
        verify_files(&fa, &fb, 3_000_000, 1 << 20, &mut ring, &progress).unwrap();
        bytes[2_345_678] ^= 1;
        fs::write(&b, &bytes).unwrap();
        let e = verify_files(&fa, &fb, 3_000_000, 1 << 20, &mut ring, &progress).unwrap_err();
        match &e {
            Error::Io { offset, path, .. } => {
                assert_eq!(*offset, 2_345_678);
                assert_eq!(path, &b);
            }
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains("differs"), "{e}");
    }

    #[test]
    fn scheduler_spreads_over_groups() {
        let s = Scheduler::new(vec![VecDeque::from([0, 1, 2]), VecDeque::from([3, 4])]);
        let a = s.next().unwrap();
        let b = s.next().unwrap();
        assert_ne!(a.0, b.0, "the second file comes from the idle group");
        s.done(a.0);
        let c = s.next().unwrap();
        assert_eq!(c.0, a.0);
        let mut rest = vec![a.1, b.1, c.1];
        while let Some((g, i)) = s.next() {
            rest.push(i);
            s.done(g);
        }
        rest.sort();
        assert_eq!(rest, vec![0, 1, 2, 3, 4]);
    }

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
