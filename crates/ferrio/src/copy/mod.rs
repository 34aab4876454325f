//! Copying files and directory trees ([`copy`]): the rules of `cp` for where things go, a walk of
//! the sources, and one copy per file that is renamed into place only when it is complete.
//!
//! This file owns the entry point, the copy under way (its state and the order of its steps) and
//! its report. Each step has a file of its own: `options` (what is asked and told back), `dest`
//! (where things go), `walk` (what there is to copy), `dirs` (destination directories),
//! `schedule` (which file next, how many at once), `entry` (one file or symlink, start to end),
//! `data` (moving the bytes), `ring` (the windows they move through), `url` (copies to and from
//! remote storage), `verify`, `meta` (mode,
//! owner, times) and `temp` (temporary names). None of them makes a syscall itself (those live in
//! the crate's `sys` module) or reaches the worker pools other than through [`File`](crate::File).
//!
//! # How a file is copied
//! The source is opened as a [`File`](crate::File) (its reads run on the source device's pool)
//! and a temporary file `.NAME.ferrio-XXXXXX` is created next to the destination and opened as a
//! second [`File`](crate::File) (its writes run on the destination device's pool). Only the
//! source's data extents are copied (`SEEK_DATA`/`SEEK_HOLE`), so holes stay holes, and a
//! trailing hole is kept by setting the length. Each extent is cut into windows and a few windows
//! are in flight at once: window *i+1* is being read while window *i* is being written, so each
//! device works at its own pace. Where source and destination share a file system the kernel
//! copies instead (`copy_file_range`, unless [`CopyMethod::ReadWrite`] is asked for): the data
//! is cut into a few contiguous segments copied at once, each one sequentially through its own
//! file description so that page-cache readahead keeps ahead of it, each on a thread of the copy
//! (the calls block in the kernel and move no bytes through ferrio), which on one disk is faster
//! than copying through memory (measured: see benchmarks/RESULTS.md).
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
//! benchmarks/RESULTS.md). [`CopyOptions::verify`] implies it, since the check must read what
//! the device holds, not the page cache.

mod data;
mod dest;
mod dirs;
mod entry;
mod meta;
mod options;
mod ring;
mod schedule;
mod temp;
mod url;
mod verify;
mod walk;

pub use options::{CopyError, CopyMethod, CopyOptions, CopyProgress, CopyReport, DeviceTraffic};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::sys;

use dest::{nearest_dev, plan_roots, Root};
use walk::{Entry, Kind};

/// Copies `sources` to `dest` the way `cp` would, fast: see the [module docs](self).
///
/// Destination rules: one source and `dest` an existing directory (or a symlink to one) puts
/// the copy inside it as `dest/NAME`; otherwise the copy is `dest` itself. Several sources need
/// `dest` to be a directory. A directory source needs [`CopyOptions::recursive`]; into an existing
/// directory it is merged. Copying a directory into itself is refused. Copying a file over an
/// existing file replaces it when the new copy is complete; without `preserve` the replacement
/// keeps the old file's mode (and owner, where permitted), as `cp` does.
///
/// A source or `dest` may be a URL of remote storage (`s3://`, `gs://`, `az://`; `http(s)://`
/// as a source only): a file is uploaded by multipart upload, completed only when the whole file
/// is sent; an object is downloaded into a temporary file renamed into place; an object is copied
/// inside its store when source and destination share a bucket. A `dest` URL ending in `/` is a
/// prefix the copies go under by name. With [`CopyOptions::recursive`] a directory is uploaded
/// file by file under a destination prefix (`prefix/relative/path`) and a prefix is downloaded
/// object by object into a directory (made as needed; an existing directory gets the tree by
/// name, as `cp -r` does); a prefix with no objects is a not-found error naming the URL, and a
/// key that would land outside the directory (`..`, an empty component) refuses the copy.
///
/// Errors before anything is copied (a missing source, a bad destination) are returned as
/// `Err`; errors of single files are listed in the report and the copy goes on. A directory
/// source without `recursive` is an [`Error::Fs`] of `EISDIR`, as `cp` without `-r` refuses it;
/// a file copied onto itself (by any name or link) is an [`Error::SameFile`] in the report.
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
    // `file://` URLs name local paths, copied as those are.
    let sources: Vec<PathBuf> = sources
        .into_iter()
        .map(|p| crate::file::local_path(p.as_ref()).map(|p| p.into_owned()))
        .collect::<Result<_>>()?;
    let dest = crate::file::local_path(dest.as_ref())?;
    // As `cp a ''` says, before anything is read (a copy would be made, then fail its rename).
    if dest.as_ref().as_os_str().is_empty() {
        return Err(Error::Fs {
            action: "copy to",
            path: PathBuf::new(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
    }
    if url::involves_urls(&sources, dest.as_ref()) {
        return url::copy(&sources, dest.as_ref(), options);
    }
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
        swept: Mutex::default(),
    };
    copier.run(roots);
    let mut report = copier.into_report();
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// The error for a directory source named without [`CopyOptions::recursive`]: `EISDIR`, as
/// opening a directory to copy it as a file would fail (Python's `IsADirectoryError`).
fn needs_recursive(dir: &Path) -> Error {
    Error::Fs {
        action: "a directory is copied only with recursive (-r):",
        path: dir.to_path_buf(),
        source: std::io::Error::from_raw_os_error(libc::EISDIR),
    }
}

/// Smallest and largest pipeline window picked by default.
const MIN_WINDOW: u64 = 1 << 20;
const MAX_WINDOW: u64 = 64 << 20;

/// Windows in flight per file by default: enough that a read and a write of the same file
/// overlap with room for both devices to queue.
const DEFAULT_WINDOWS_IN_FLIGHT: usize = 4;

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
    /// Destination directories already swept of stale temporary files (see [`temp`]).
    swept: Mutex<std::collections::HashSet<PathBuf>>,
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

    /// Before the first file goes into `dst`'s directory, removes what dead copies left there.
    fn sweep_stale(&self, dst: &Path) {
        let dir = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // A poisoned set only means a sweep may run twice, which is harmless.
        let first = self
            .swept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(dir.clone());
        if first {
            temp::remove_stale(&dir);
        }
    }

    fn cancelled(&self) -> bool {
        self.progress.is_cancelled()
    }

    /// Walks every root, makes the directories, copies the files and symlinks, then gives the
    /// directories their final modes: directories stay owner-only while they are filled.
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
        let (files, bytes) = entries
            .iter()
            .filter(|e| e.kind != Kind::Dir)
            .fold((0u64, 0u64), |(n, b), e| {
                (n + 1, b + if e.kind == Kind::File { e.len } else { 0 })
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
