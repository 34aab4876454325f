//! Copies where a source or the destination is a URL of remote storage: a local file uploaded
//! to an object (read by the engine, sent as a multipart upload that only a complete copy
//! completes), an object downloaded to a local file (parallel ranged GETs into a temporary file
//! renamed into place when complete), and an object copied to another (inside the store when
//! both are in one bucket, else streamed through memory).
//!
//! Files only: a directory source or a prefix is refused for now. It owns the plan of such a
//! copy and the loop over its files; the bytes move through [`crate::File`],
//! [`crate::RemoteFile`] and [`crate::RemoteWriter`].

use std::fs;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Settings;
use crate::error::{Error, Op, Result};
use crate::remote::{self, is_remote_url, RemoteFile, RemoteWriter};
use crate::sys;

use super::options::{CopyError, CopyOptions, CopyProgress, CopyReport};
use super::temp::TempPath;

/// Whether any of `paths` is a URL, which makes the copy one of this file's.
pub(super) fn involves_urls(sources: &[PathBuf], dest: &Path) -> bool {
    sources
        .iter()
        .chain([&dest.to_path_buf()])
        .any(|p| url_of(p).is_some())
}

fn url_of(p: &Path) -> Option<&str> {
    p.to_str().filter(|s| is_remote_url(s))
}

/// One end of a copy.
enum End {
    Local(PathBuf),
    Url(String),
}

impl End {
    fn of(p: &Path) -> End {
        match url_of(p) {
            Some(u) => End::Url(u.to_string()),
            None => End::Local(p.to_path_buf()),
        }
    }

    fn name(&self) -> PathBuf {
        match self {
            End::Local(p) => p.clone(),
            End::Url(u) => PathBuf::from(u),
        }
    }
}

/// One file to copy, its source opened (so a missing source fails before anything is copied).
struct Job {
    src: Source,
    dst: End,
    len: u64,
}

enum Source {
    Local(crate::File),
    Remote(RemoteFile),
}

impl Source {
    fn name(&self) -> PathBuf {
        match self {
            Source::Local(f) => f.path().to_path_buf(),
            Source::Remote(f) => PathBuf::from(f.url()),
        }
    }
}

fn unsupported_recursive() -> Error {
    Error::InvalidArgument("recursive copy with URLs is not supported yet".into())
}

/// The last name of a path or a URL's key: what a copy into a directory or prefix is called.
fn base_name(src: &End) -> Result<String> {
    let name = match src {
        End::Local(p) => p.file_name().and_then(|n| n.to_str()).map(str::to_string),
        End::Url(u) => u.rsplit('/').next().map(str::to_string),
    };
    name.filter(|n| !n.is_empty() && n != "." && n != "..")
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{}: no file name to copy to", src.name().display()))
        })
}

/// Copies `sources` to `dest` where one of them is a URL: see the [module docs](self).
pub(super) fn copy(sources: &[PathBuf], dest: &Path, options: &CopyOptions) -> Result<CopyReport> {
    let t0 = Instant::now();
    let settings = options.settings.clone().unwrap_or_else(Settings::current);
    let progress = options.progress.clone().unwrap_or_default();
    let dest_end = End::of(dest);
    let many = sources.len() > 1;
    let mut jobs = Vec::new();
    for src in sources {
        let src = End::of(src);
        let (opened, len) = match &src {
            End::Url(u) => {
                if u.ends_with('/') {
                    return Err(unsupported_recursive());
                }
                let f = RemoteFile::open_with(u, settings.clone())?;
                let len = f.len();
                (Source::Remote(f), len)
            }
            End::Local(p) => {
                let meta = fs::metadata(p).map_err(|source| Error::Fs {
                    action: "copy",
                    path: p.clone(),
                    source,
                })?;
                if meta.is_dir() {
                    return Err(unsupported_recursive());
                }
                let f = crate::File::options()
                    .settings(settings.clone())
                    .open(p, "r")?;
                (Source::Local(f), meta.len())
            }
        };
        let dst = match &dest_end {
            End::Url(u) if u.ends_with('/') => End::Url(format!("{u}{}", base_name(&src)?)),
            End::Url(u) if many => {
                return Err(Error::InvalidArgument(format!(
                    "copying several sources needs a destination prefix ending in '/', not {u}"
                )))
            }
            End::Url(u) => End::Url(u.clone()),
            End::Local(p) if p.is_dir() => End::Local(p.join(base_name(&src)?)),
            End::Local(p) if many => {
                return Err(Error::InvalidArgument(format!(
                    "copying several sources needs a destination directory, not {}",
                    p.display()
                )))
            }
            End::Local(p) => End::Local(p.clone()),
        };
        if let (Source::Local(_), End::Local(_)) = (&opened, &dst) {
            // Only reachable with local sources and a local destination mixed with URLs.
            return Err(Error::InvalidArgument(
                "mix local-to-local and URL copies in separate commands".into(),
            ));
        }
        jobs.push(Job {
            src: opened,
            dst,
            len,
        });
    }
    progress
        .files_total
        .store(jobs.len() as u64, Ordering::Relaxed);
    progress
        .bytes_total
        .store(jobs.iter().map(|j| j.len).sum(), Ordering::Relaxed);

    let mut report = CopyReport::default();
    for job in &jobs {
        if progress.is_cancelled() {
            break;
        }
        let dst = job.dst.name();
        match copy_one(job, &settings, &progress) {
            Ok(()) => {
                report.files += 1;
                report.bytes += job.len;
            }
            Err(Error::Cancelled) => {}
            Err(error) => {
                progress.errors.fetch_add(1, Ordering::Relaxed);
                report.errors.push(CopyError {
                    path: job.src.name(),
                    dest: dst,
                    error,
                });
            }
        }
        progress.files_done.fetch_add(1, Ordering::Relaxed);
    }
    report.cancelled = progress.is_cancelled();
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

fn copy_one(job: &Job, settings: &Settings, progress: &Arc<CopyProgress>) -> Result<()> {
    match (&job.src, &job.dst) {
        (Source::Local(src), End::Url(dst)) => {
            let mut writer = new_writer(dst, settings, progress)?;
            let window = writer.part_size();
            pump(job.len, window, &mut writer, progress, |buf, offset| {
                src.read_at(buf, offset)
            })
        }
        (Source::Remote(src), End::Local(dst)) => download(src, dst, settings, progress),
        (Source::Remote(src), End::Url(dst)) => {
            if remote::copy_in_store(src.url(), dst)? {
                progress.add_bytes(job.len);
                return Ok(());
            }
            let mut writer = new_writer(dst, settings, progress)?;
            let window = download_window(settings).max(writer.part_size());
            pump(job.len, window, &mut writer, progress, |buf, offset| {
                read_remote(src, buf, offset, progress)
            })
        }
        (Source::Local(_), End::Local(_)) => Err(Error::InvalidArgument(
            "local-to-local copies do not go through the URL copier".into(),
        )),
    }
}

fn new_writer(
    url: &str,
    settings: &Settings,
    progress: &Arc<CopyProgress>,
) -> Result<RemoteWriter> {
    let mut writer = RemoteWriter::create_with(url, settings.clone())?;
    let watched = Arc::clone(progress);
    writer.cancel_when(move || watched.is_cancelled());
    Ok(writer)
}

/// Feeds `len` bytes read by `read` (window by window) into `writer` and completes it; on any
/// error or a cancel the upload is aborted (the writer does so itself, or on drop).
fn pump(
    len: u64,
    window: usize,
    writer: &mut RemoteWriter,
    progress: &CopyProgress,
    mut read: impl FnMut(&mut [u8], u64) -> Result<usize>,
) -> Result<()> {
    let mut buf = vec![
        0u8;
        window
            .min(usize::try_from(len).unwrap_or(usize::MAX))
            .max(1)
    ];
    let mut offset = 0u64;
    while offset < len {
        if progress.is_cancelled() {
            writer.abort()?;
            return Err(Error::Cancelled);
        }
        let want = buf.len().min((len - offset) as usize);
        let n = read(&mut buf[..want], offset)?;
        if n == 0 {
            writer.abort()?;
            return Err(Error::Io {
                op: Op::Read,
                path: PathBuf::from(writer.url()),
                offset,
                len: want as u64,
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the source got shorter during the copy",
                ),
            });
        }
        writer.write(&buf[..n])?;
        progress.add_bytes(n as u64);
        offset += n as u64;
    }
    writer.close().map(|_| ())
}

/// Bytes a download asks for at once: enough ranges to keep every GET slot busy, capped so the
/// memory stays modest.
fn download_window(settings: &Settings) -> usize {
    const MAX: u64 = 256 << 20;
    let range = settings.remote_range_size.max(1);
    let n = range.saturating_mul(settings.remote_concurrency.max(1) as u64);
    n.clamp(range.min(MAX), MAX) as usize
}

/// How often a download looks at the cancel switch and reports progress.
const POLL: Duration = Duration::from_millis(20);

/// Reads `buf.len()` bytes at `offset` of `src`, cancelling the GETs in flight on a cancel
/// (progress is counted once the bytes are passed on).
fn read_remote(
    src: &RemoteFile,
    buf: &mut [u8],
    offset: u64,
    progress: &CopyProgress,
) -> Result<usize> {
    // SAFETY: `buf` is exclusively borrowed for this call and the future is waited on (or
    // dropped, which waits) before the borrow ends.
    let fut = unsafe { src.pread_raw(buf.as_mut_ptr(), buf.len(), offset) };
    while !fut.wait_timeout(POLL) {
        if progress.is_cancelled() {
            fut.cancel();
        }
    }
    fut.wait()
}

/// Downloads `src` into a temporary file next to `dst`, renamed over it when complete; removed
/// on an error or a cancel.
fn download(
    src: &RemoteFile,
    dst: &Path,
    settings: &Settings,
    progress: &CopyProgress,
) -> Result<()> {
    let mut created = None;
    let temp = TempPath::create(dst, |p| {
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(p)?;
        created = Some(f);
        Ok(())
    })?;
    let file = created.ok_or_else(|| Error::Fs {
        action: "create a temporary file for",
        path: dst.to_path_buf(),
        source: std::io::Error::other("no file handle"),
    })?;
    let len = src.len();
    let mut buf = vec![0u8; download_window(settings).min(len as usize).max(1)];
    let mut offset = 0u64;
    while offset < len {
        let want = buf.len().min((len - offset) as usize);
        // SAFETY: `buf` is exclusively borrowed here and the future is waited on below (or
        // dropped, which waits) before `buf` is touched again.
        let fut = unsafe { src.pread_raw(buf.as_mut_ptr(), want, offset) };
        let mut seen = 0;
        while !fut.wait_timeout(POLL) {
            let now = fut.bytes();
            progress.add_bytes(now - seen);
            seen = now;
            if progress.is_cancelled() {
                fut.cancel();
            }
        }
        let n = fut.wait()?;
        progress.add_bytes((n as u64).saturating_sub(seen));
        if n < want {
            return Err(Error::Io {
                op: Op::Read,
                path: PathBuf::from(src.url()),
                offset: offset + n as u64,
                len: (want - n) as u64,
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the object ended early",
                ),
            });
        }
        std::os::unix::fs::FileExt::write_all_at(&file, &buf[..n], offset).map_err(|source| {
            Error::Io {
                op: Op::Write,
                path: dst.to_path_buf(),
                offset,
                len: n as u64,
                source,
            }
        })?;
        offset += n as u64;
    }
    let mode = 0o666 & !sys::umask();
    fs::set_permissions(temp.path(), fs::Permissions::from_mode(mode)).map_err(|source| {
        Error::Fs {
            action: "set the mode of",
            path: dst.to_path_buf(),
            source,
        }
    })?;
    drop(file);
    temp.commit(dst)
}
