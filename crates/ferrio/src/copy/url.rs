//! Copies where a source or the destination is a URL of remote storage: a local file uploaded
//! to an object (read by the engine, sent as a multipart upload that only a complete copy
//! completes), an object downloaded to a local file (parallel ranged GETs into a temporary file
//! renamed into place when complete), and an object copied to another (inside the store when
//! both are in one bucket, else streamed through memory).
//!
//! With `recursive`, a local directory is walked and each regular file under it uploaded as
//! `prefix/relative/path`, and a prefix is listed and each object under it downloaded as
//! `DIR/relative/path` (directories made as needed; a key that is not a safe relative path
//! refuses the whole copy before anything is written). Where a tree goes follows `cp -r`:
//! into an existing local directory by the tree's name, else as the destination itself; a
//! prefix has no existence of its own, so a tree lands under it (`tree_root`). Several files
//! are copied at once, handed out by the copy's own [`Scheduler`].
//!
//! It owns the plan of such a copy and the loop over its files; the bytes move through
//! [`crate::File`], [`crate::RemoteFile`] and [`crate::RemoteWriter`].

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Settings;
use crate::error::{Error, Op, Result};
use crate::remote::{self, is_remote_url, RemoteFile, RemoteWriter};
use crate::sys;

use super::options::{CopyError, CopyOptions, CopyProgress, CopyReport};
use super::schedule::{Scheduler, DEFAULT_PARALLEL_FILES};
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

/// One file to copy.
struct Job {
    src: Source,
    dst: End,
    len: u64,
    /// Whether this is an object of a listed tree, whose destination's parent directories are
    /// made before any file is copied (`make_tree_dirs`).
    make_parents: bool,
}

/// Where a job's bytes come from: a file the caller named, opened while the copy is planned (so
/// a missing one fails before anything is copied), or one found by a walk or a listing, opened
/// by the thread that copies it (a tree may hold more files than may be open at once).
enum Source {
    Local(crate::File),
    Remote(RemoteFile),
    LocalPath(PathBuf),
    Object(remote::ListedObject),
}

impl Source {
    fn name(&self) -> PathBuf {
        match self {
            Source::Local(f) => f.path().to_path_buf(),
            Source::Remote(f) => PathBuf::from(f.url()),
            Source::LocalPath(p) => p.clone(),
            Source::Object(o) => PathBuf::from(&o.url),
        }
    }

    fn is_local(&self) -> bool {
        matches!(self, Source::Local(_) | Source::LocalPath(_))
    }
}

/// The last name of a path or a URL's key (or prefix): what a copy into a directory or prefix
/// is called.
fn base_name(src: &End) -> Result<String> {
    let name = match src {
        End::Local(p) => p.file_name().and_then(|n| n.to_str()).map(str::to_string),
        // The key's own last name: a URL percent-encodes it (`h%23x.bin` names `h#x.bin`,
        // `t%2Fq.bin` the key `t/q.bin`), and a file or a key named after it takes it decoded,
        // as a tree's entries are.
        End::Url(u) => u
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .and_then(|last| object_store::path::Path::from_url_path(last).ok())
            .and_then(|key| key.as_ref().rsplit('/').next().map(str::to_string)),
    };
    name.filter(|n| remote::is_plain_name(n)).ok_or_else(|| {
        Error::InvalidArgument(format!("{}: no file name to copy to", src.name().display()))
    })
}

/// Where the files of a tree (a directory or a prefix) go, as `cp -r` places a directory: into
/// an existing local directory by the tree's name, else as the destination itself. A prefix has
/// no existence of its own, so a tree copied to a URL lands under it as a new directory would
/// (`aws s3 cp --recursive`); with several sources each goes under the prefix by name.
fn tree_root(src: &End, dest: &End, many: bool) -> Result<End> {
    match dest {
        End::Url(u) if many => {
            if !u.ends_with('/') {
                return Err(Error::InvalidArgument(format!(
                    "copying several sources needs a destination prefix ending in '/', not {u}"
                )));
            }
            Ok(End::Url(format!(
                "{u}{}/",
                remote::encode_key_part(&base_name(src)?)
            )))
        }
        End::Url(u) => Ok(End::Url(remote::as_prefix(u))),
        End::Local(p) if p.is_dir() => Ok(End::Local(p.join(base_name(src)?))),
        End::Local(p) if many => Err(Error::InvalidArgument(format!(
            "copying several sources needs a destination directory, not {}",
            p.display()
        ))),
        End::Local(p) if fs::symlink_metadata(p).is_ok() => Err(Error::InvalidArgument(format!(
            "cannot overwrite {}, which is not a directory, with the tree {}",
            p.display(),
            src.name().display()
        ))),
        End::Local(p) => Ok(End::Local(p.clone())),
    }
}

/// `root` with the relative path `parts` (plain names) appended.
fn under(root: &End, parts: &[String]) -> End {
    match root {
        End::Local(p) => End::Local(parts.iter().fold(p.clone(), |p, part| p.join(part))),
        End::Url(u) => {
            let encoded: Vec<String> = parts.iter().map(|p| remote::encode_key_part(p)).collect();
            End::Url(format!("{u}{}", encoded.join("/")))
        }
    }
}

fn not_found(url: &str, why: &str) -> Error {
    Error::Open {
        path: url.into(),
        mode: "r".into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, why.to_string()),
    }
}

/// What a walk of a local tree found: files to upload, and entries that cannot be (each an
/// error in the report).
#[derive(Default)]
struct Walked {
    files: Vec<(PathBuf, Vec<String>, u64)>,
    refused: Vec<(PathBuf, Error)>,
}

/// Walks the directory `dir` (whose path under the tree's root is `rel`) for the regular files
/// to upload. Symlinks to files are followed (an object holds bytes, not links); symlinks to
/// directories only when `follow` is set, and never into a directory being walked.
fn walk_local(
    dir: &Path,
    rel: &mut Vec<String>,
    follow: bool,
    ancestors: &mut Vec<(u64, u64)>,
    out: &mut Walked,
) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let fs_err = |action, path: &Path, source| Error::Fs {
        action,
        path: path.to_path_buf(),
        source,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| fs_err("list", dir, e))? {
        let entry = entry.map_err(|e| fs_err("list", dir, e))?;
        names.push(entry.file_name());
    }
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Some(part) = name.to_str().map(str::to_string) else {
            let why = format!(
                "{}: the name is not UTF-8, so it cannot be an object key",
                path.display()
            );
            out.refused.push((path, Error::InvalidArgument(why)));
            continue;
        };
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                out.refused.push((path.clone(), fs_err("copy", &path, e)));
                continue;
            }
        };
        let meta = if meta.file_type().is_symlink() {
            match fs::metadata(&path) {
                Ok(m) if m.is_dir() && !follow => {
                    let why = format!(
                        "{} is a symlink to a directory: follow it with -L (--dereference)",
                        path.display()
                    );
                    out.refused.push((path, Error::InvalidArgument(why)));
                    continue;
                }
                Ok(m) => m,
                Err(e) => {
                    out.refused
                        .push((path.clone(), fs_err("follow the symlink", &path, e)));
                    continue;
                }
            }
        } else {
            meta
        };
        rel.push(part);
        if meta.is_dir() {
            let id = (meta.dev(), meta.ino());
            if ancestors.contains(&id) {
                let why = format!(
                    "{} leads back into a directory being copied",
                    path.display()
                );
                out.refused.push((path, Error::InvalidArgument(why)));
            } else {
                ancestors.push(id);
                if let Err(e) = walk_local(&path, rel, follow, ancestors, out) {
                    out.refused.push((path, e));
                }
                ancestors.pop();
            }
        } else if meta.is_file() {
            out.files.push((path, rel.clone(), meta.len()));
        } else {
            let why = format!(
                "{} is not a regular file (object storage holds files only)",
                path.display()
            );
            out.refused.push((path, Error::InvalidArgument(why)));
        }
        rel.pop();
    }
    Ok(())
}

/// Copies `sources` to `dest` where one of them is a URL: see the [module docs](self).
pub(super) fn copy(sources: &[PathBuf], dest: &Path, options: &CopyOptions) -> Result<CopyReport> {
    let t0 = Instant::now();
    let settings = options.settings.clone().unwrap_or_else(Settings::current);
    let progress = options.progress.clone().unwrap_or_default();
    let dest_end = End::of(dest);
    // A destination no copy could write to fails once, before any source is walked or opened
    // (a tree of many files would otherwise fail file by file).
    if let End::Url(u) = &dest_end {
        remote::check_writable(u, &settings)?;
    }
    let many = sources.len() > 1;
    let mut jobs = Vec::new();
    let mut report = CopyReport::default();
    // The local directories a download of listed trees needs, parents before children.
    let mut tree_dirs = BTreeSet::new();
    // A Ctrl-C while listings and opens wait on the store ends the copy before anything is
    // written.
    let cancelled = || progress.is_cancelled();
    let stopped = |mut report: CopyReport| {
        report.cancelled = true;
        report.seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    };
    for src in sources {
        let src = End::of(src);
        let (opened, len) = match &src {
            End::Url(u) => {
                if options.recursive && remote::can_list(u) {
                    let listed = match remote::list_prefix_until(u, &settings, &cancelled) {
                        Err(Error::Cancelled) => return stopped(report),
                        other => other?,
                    };
                    if !listed.is_empty() {
                        let root = tree_root(&src, &dest_end, many)?;
                        for o in listed {
                            let parts: Vec<String> =
                                o.relative.split('/').map(str::to_string).collect();
                            if let End::Local(r) = &root {
                                tree_dirs.insert(r.clone());
                                tree_dirs.extend((1..parts.len()).filter_map(|k| {
                                    match under(&root, &parts[..k]) {
                                        End::Local(d) => Some(d),
                                        End::Url(_) => None,
                                    }
                                }));
                            }
                            jobs.push(Job {
                                dst: under(&root, &parts),
                                len: o.size,
                                make_parents: true,
                                src: Source::Object(o),
                            });
                        }
                        continue;
                    }
                    if u.ends_with('/') {
                        return Err(not_found(u, "no objects under this prefix"));
                    }
                    // No keys under `u/`: `u` may name one object, copied as a file.
                } else if u.ends_with('/') && options.recursive {
                    return Err(Error::InvalidArgument(format!(
                        "{}: http(s) servers cannot be listed; copy their objects one by one",
                        remote::redacted(u)
                    )));
                } else if u.ends_with('/') && remote::can_list(u) {
                    return Err(Error::InvalidArgument(format!(
                        "{u} is a prefix: copy it with recursive (-r)"
                    )));
                }
                // A web server's `dir/` is one resource, as `dir` is another.
                let f = match RemoteFile::open_until(u, settings.clone(), &cancelled) {
                    Err(Error::Cancelled) => return stopped(report),
                    // No such object, but keys under `u/`: a "directory", as `cp` says of one.
                    Err(e)
                        if !options.recursive
                            && is_not_found(&e)
                            && remote::holds_objects(u, &settings) =>
                    {
                        return Err(Error::InvalidArgument(format!(
                            "{u} is a prefix: copy it with recursive (-r)"
                        )));
                    }
                    other => other?,
                };
                let len = f.len();
                (Source::Remote(f), len)
            }
            End::Local(p) => {
                let meta = fs::metadata(p).map_err(|source| Error::Open {
                    path: p.clone(),
                    mode: "r".into(),
                    source,
                })?;
                if meta.is_dir() {
                    if !options.recursive {
                        return Err(super::needs_recursive(p));
                    }
                    let root = tree_root(&src, &dest_end, many)?;
                    if matches!(root, End::Local(_)) {
                        return Err(mixed());
                    }
                    let mut walked = Walked::default();
                    {
                        use std::os::unix::fs::MetadataExt;
                        let mut ancestors = vec![(meta.dev(), meta.ino())];
                        walk_local(
                            p,
                            &mut Vec::new(),
                            options.follow_symlinks,
                            &mut ancestors,
                            &mut walked,
                        )?;
                    }
                    for (path, parts, len) in walked.files {
                        jobs.push(Job {
                            src: Source::LocalPath(path),
                            dst: under(&root, &parts),
                            len,
                            make_parents: false,
                        });
                    }
                    for (path, error) in walked.refused {
                        progress.errors.fetch_add(1, Ordering::Relaxed);
                        report.errors.push(CopyError {
                            dest: root.name(),
                            path,
                            error,
                        });
                    }
                    continue;
                }
                let f = crate::File::options()
                    .settings(settings.clone())
                    .open(p, "r")?;
                // A block device's size is the device's (`stat` says 0).
                let len = f.len()?;
                (Source::Local(f), len)
            }
        };
        let dst = match &dest_end {
            // A prefix, or a bucket's root written without its '/' (`s3://bucket`, as `aws s3
            // cp` takes it).
            End::Url(u) if u.ends_with('/') || remote::names_a_store_only(u) => End::Url(format!(
                "{}{}",
                remote::as_prefix(u),
                remote::encode_key_part(&base_name(&src)?)
            )),
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
        if opened.is_local() && matches!(dst, End::Local(_)) {
            return Err(mixed());
        }
        jobs.push(Job {
            src: opened,
            dst,
            len,
            make_parents: false,
        });
    }
    if cancelled() {
        return stopped(report);
    }
    let failed = make_tree_dirs(&tree_dirs, &mut report, &progress);
    jobs.retain(|j| match &j.dst {
        End::Local(d) => !failed.iter().any(|f| d.starts_with(f)),
        End::Url(_) => true,
    });
    progress
        .files_total
        .store(jobs.len() as u64, Ordering::Relaxed);
    progress
        .bytes_total
        .store(jobs.iter().map(|j| j.len).sum(), Ordering::Relaxed);

    let threads = if options.parallel_files > 0 {
        options.parallel_files
    } else {
        DEFAULT_PARALLEL_FILES
    }
    .min(jobs.len())
    .max(1);
    let plan = Plan::new(&settings, threads);
    let report = Mutex::new(report);
    let made = Mutex::new(tree_dirs);
    let sched = Scheduler::new(vec![(0..jobs.len()).collect()]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some((g, i)) = sched.next() {
                    if !progress.is_cancelled() {
                        run_job(&jobs[i], &plan, &progress, &report, &made);
                    }
                    sched.done(g);
                }
            });
        }
    });
    // Counters and a list only: a poisoned lock is consistent.
    let mut report = report.into_inner().unwrap_or_else(|p| p.into_inner());
    report.cancelled = progress.is_cancelled();
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

fn mixed() -> Error {
    // Only reachable with local sources and a local destination mixed with URLs.
    Error::InvalidArgument("mix local-to-local and URL copies in separate commands".into())
}

/// What every file of a copy shares: the settings, and how much memory one file may hold while
/// several are copied at once.
struct Plan {
    settings: Settings,
    /// Settings for uploads: the parts in flight divided among the files copied at once, so
    /// that the memory held stays that of one file's upload.
    writer_settings: Settings,
    /// Bytes a copy between two stores reads at once before uploading them: the window divided
    /// among the files (the GETs in flight are capped per store anyway). A download needs none:
    /// its GETs write straight into the file.
    window: usize,
}

impl Plan {
    fn new(settings: &Settings, files_at_once: usize) -> Plan {
        let mut writer_settings = settings.clone();
        writer_settings.remote_concurrency = (settings.remote_concurrency / files_at_once).max(1);
        let range = usize::try_from(settings.remote_range_size.max(1)).unwrap_or(usize::MAX);
        Plan {
            settings: settings.clone(),
            writer_settings,
            window: (store_window(settings) / files_at_once).max(range),
        }
    }
}

/// Makes the directories a download of listed trees writes into, parents first, and counts
/// each made or merged into, as a local tree copy does. Returns those that could not be made:
/// nothing under them is tried, and each is one error of the report.
fn make_tree_dirs(
    dirs: &BTreeSet<PathBuf>,
    report: &mut CopyReport,
    progress: &CopyProgress,
) -> Vec<PathBuf> {
    let mut failed: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if failed.iter().any(|f| d.starts_with(f)) {
            continue;
        }
        let outcome = match fs::metadata(d) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(Error::Fs {
                action: "cannot replace a non-directory with a directory:",
                path: d.clone(),
                source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir(d).or_else(|source| match fs::metadata(d) {
                    // Made meanwhile by someone else: merged into.
                    Ok(m) if m.is_dir() => Ok(()),
                    _ => Err(Error::Fs {
                        action: "make the directory",
                        path: d.clone(),
                        source,
                    }),
                })
            }
            Err(source) => Err(Error::Fs {
                action: "stat",
                path: d.clone(),
                source,
            }),
        };
        match outcome {
            Ok(()) => report.dirs += 1,
            Err(error) => {
                progress.errors.fetch_add(1, Ordering::Relaxed);
                report.errors.push(CopyError {
                    path: d.clone(),
                    dest: d.clone(),
                    error,
                });
                failed.push(d.clone());
            }
        }
    }
    failed
}

fn run_job(
    job: &Job,
    plan: &Plan,
    progress: &Arc<CopyProgress>,
    report: &Mutex<CopyReport>,
    made: &Mutex<BTreeSet<PathBuf>>,
) {
    let outcome = copy_one(job, plan, progress);
    let mut report = report.lock().unwrap_or_else(|p| p.into_inner());
    match outcome {
        Ok(Copied::File) => {
            report.files += 1;
            report.bytes += job.len;
        }
        // A marker of a directory that also holds objects was made and counted already.
        Ok(Copied::Directory) => {
            let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
            if made.insert(job.dst.name()) {
                report.dirs += 1;
            }
        }
        Err(Error::Cancelled) => {}
        Err(error) => {
            progress.errors.fetch_add(1, Ordering::Relaxed);
            report.errors.push(CopyError {
                path: job.src.name(),
                dest: job.dst.name(),
                error,
            });
        }
    }
    progress.files_done.fetch_add(1, Ordering::Relaxed);
}

/// What one job made.
enum Copied {
    File,
    /// An empty "directory" marker (a key `dir/` with no bytes and nothing under it), which
    /// lists as an empty object `dir` that cannot be fetched: made as an empty directory.
    Directory,
}

fn copy_one(job: &Job, plan: &Plan, progress: &Arc<CopyProgress>) -> Result<Copied> {
    let settings = &plan.settings;
    let cancelled = || progress.is_cancelled();
    let opened;
    let src = match &job.src {
        Source::LocalPath(p) => {
            opened = Source::Local(
                crate::File::options()
                    .settings(settings.clone())
                    .open(p, "r")?,
            );
            &opened
        }
        // A listed object opens from the listing; one of no bytes is asked for by name first,
        // since a directory marker lists the same way (see below).
        Source::Object(o) if o.size > 0 => {
            opened = Source::Remote(RemoteFile::open_listed(o, settings.clone())?);
            &opened
        }
        Source::Object(o) => match RemoteFile::open_until(&o.url, settings.clone(), &cancelled) {
            Ok(file) => {
                opened = Source::Remote(file);
                &opened
            }
            // A listed object of no bytes that is not there under its name is a marker `dir/`
            // (object_store names keys without their trailing `/`): an empty directory.
            Err(e) if job.make_parents && job.len == 0 && is_not_found(&e) => {
                if let End::Local(dst) = &job.dst {
                    fs::create_dir_all(dst).map_err(|source| Error::Fs {
                        action: "make the directory",
                        path: dst.clone(),
                        source,
                    })?;
                }
                return Ok(Copied::Directory);
            }
            Err(e) => return Err(e),
        },
        other => other,
    };
    match (src, &job.dst) {
        (Source::Local(src), End::Url(dst)) => {
            let before = Stamp::of(src)?;
            let mut writer = new_writer(dst, &plan.writer_settings, progress)?;
            let window = writer.part_size();
            let read = |buf: &mut [u8], offset| src.read_at(buf, offset);
            pump(job.len, window, &mut writer, progress, src.path(), read)?;
            if let Err(e) = before.unchanged(src, job.len) {
                // The change matters more than a failed clean-up.
                let _ = writer.abort();
                return Err(e);
            }
            close_counted(writer, progress)
        }
        (Source::Remote(src), End::Local(dst)) => download(src, dst, progress),
        (Source::Remote(src), End::Url(dst)) => {
            if remote::copy_in_store(src.url(), dst, src.len())? {
                progress.add_bytes(src.len());
                return Ok(Copied::File);
            }
            let mut writer = new_writer(dst, &plan.writer_settings, progress)?;
            let window = plan.window.max(writer.part_size());
            let read = |buf: &mut [u8], offset| read_remote(src, buf, offset, progress);
            let name = Path::new(src.url());
            pump(src.len(), window, &mut writer, progress, name, read)?;
            // Its reads are pinned to the version opened: it cannot change under the copy.
            close_counted(writer, progress)
        }
        _ => Err(mixed()),
    }
    .map(|()| Copied::File)
}

/// Whether `e` says the object does not exist.
fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
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

/// Feeds `len` bytes of `source` read by `read` (window by window) into `writer`, for the caller
/// to complete; on any error or a cancel the upload is aborted (the writer does so itself, or on
/// drop).
fn pump(
    len: u64,
    window: usize,
    writer: &mut RemoteWriter,
    progress: &CopyProgress,
    source: &Path,
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
            return Err(super::data::shrank(source, offset));
        }
        let stored = writer.stored();
        writer.write(&buf[..n])?;
        // Progress is what the store has taken, not what waits in the writer's parts.
        progress.add_bytes(writer.stored() - stored);
        offset += n as u64;
    }
    Ok(())
}

/// Completes the upload `writer` fed by [`pump`] and counts the bytes the store took with it.
fn close_counted(mut writer: RemoteWriter, progress: &CopyProgress) -> Result<()> {
    let stored = writer.stored();
    writer.close()?;
    progress.add_bytes(writer.stored() - stored);
    Ok(())
}

/// What a local file to upload looked like when its copy started: a file written while it is
/// read would go up as a mix of old and new bytes, so the upload completes only if the file
/// still has the size planned and the same modification time after the last read (as `rclone`
/// checks); a file that grew is refused too, since an append cannot be told from a rewrite.
struct Stamp {
    modified: (i64, i64),
}

impl Stamp {
    fn of(file: &crate::File) -> Result<Stamp> {
        let st = sys::fstat(file.as_fd()).map_err(|e| Error::io(Op::Stat, file.path(), 0, 0, e))?;
        Ok(Stamp {
            modified: (st.st_mtime, st.st_mtime_nsec),
        })
    }

    /// `Ok` if `file` still has `len` bytes and the modification time it had.
    fn unchanged(&self, file: &crate::File, len: u64) -> Result<()> {
        let now = file.len()?;
        let modified = Stamp::of(file)?.modified;
        if now == len && modified == self.modified {
            return Ok(());
        }
        let why = if now == len {
            "it was modified".to_string()
        } else {
            format!("its size went from {len} to {now} bytes")
        };
        Err(Error::io(
            Op::Read,
            file.path(),
            0,
            len,
            std::io::Error::other(format!(
                "the source file changed while it was being uploaded ({why}); the upload was \
                 aborted, copy it again once it is no longer written to"
            )),
        ))
    }
}

/// Bytes a copy between two stores reads at once: enough ranges to keep every GET slot busy,
/// capped so the memory stays modest.
fn store_window(settings: &Settings) -> usize {
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
/// on an error or a cancel. A `dst` that is a symlink to a file is written through, as a local
/// copy writes it (`dest::write_target`).
fn download(src: &RemoteFile, dst: &Path, progress: &CopyProgress) -> Result<()> {
    let existing = fs::symlink_metadata(dst).ok();
    let dst = &super::dest::write_target(dst, existing.as_ref())?;
    // Refused before any byte is fetched, as a local copy refuses it, rather than at the rename.
    if fs::metadata(dst).is_ok_and(|m| m.is_dir()) {
        return Err(Error::Fs {
            action: "cannot replace a directory with a non-directory:",
            path: dst.to_path_buf(),
            source: std::io::Error::from_raw_os_error(libc::EISDIR),
        });
    }
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
    // Every GET writes each piece of its body at its place in the file as it arrives: the
    // object streams through with all its GETs in flight, and no window waits for its slowest
    // GET before the next starts.
    let file = Arc::new(file);
    let out = file.clone();
    let path = dst.to_path_buf();
    let write = move |at: u64, bytes: &[u8]| {
        std::os::unix::fs::FileExt::write_all_at(out.as_ref(), bytes, at).map_err(|source| {
            Error::Io {
                op: Op::Write,
                path: path.clone(),
                offset: at,
                len: bytes.len() as u64,
                source,
            }
        })
    };
    let fut = src.read_to(0, usize::try_from(len).unwrap_or(usize::MAX), write);
    let mut seen = 0;
    while !fut.wait_timeout(POLL) {
        let now = fut.bytes();
        progress.add_bytes(now - seen);
        seen = now;
        if progress.is_cancelled() {
            fut.cancel();
        }
    }
    let n = fut.wait()? as u64;
    progress.add_bytes(n.saturating_sub(seen));
    if n < len {
        return Err(Error::Io {
            op: Op::Read,
            path: PathBuf::from(src.url()),
            offset: n,
            len: len - n,
            source: std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the object ended early",
            ),
        });
    }
    // A file replaced keeps its permissions, as a local copy (and `cp`, which writes into it)
    // keeps them; a new one gets the umask's.
    let mode = fs::metadata(dst)
        .ok()
        .filter(fs::Metadata::is_file)
        .map_or(0o666 & !sys::umask(), |m| {
            std::os::unix::fs::MetadataExt::mode(&m) & 0o777
        });
    fs::set_permissions(temp.path(), fs::Permissions::from_mode(mode)).map_err(|source| {
        Error::Fs {
            action: "set the mode of",
            path: dst.to_path_buf(),
            source,
        }
    })?;
    // What closing it says comes before it replaces anything (see `File::close`).
    sys::close_checked(file.as_fd()).map_err(|source| Error::Io {
        op: Op::Close,
        path: dst.to_path_buf(),
        offset: 0,
        len: 0,
        source,
    })?;
    drop(file);
    temp.commit(dst)
}

#[cfg(test)]
mod tests {
    use super::{base_name, End};

    #[test]
    fn a_url_names_its_copy_by_the_key_decoded() {
        let name = |u: &str| base_name(&End::Url(u.into()));
        assert_eq!(name("s3://b/src/h%23x.bin").unwrap(), "h#x.bin");
        assert_eq!(name("s3://b/src/%C3%BC.bin").unwrap(), "ü.bin");
        assert_eq!(name("s3://b/sp%20ace/").unwrap(), "sp ace");
        assert_eq!(name("https://h/d/plain.bin").unwrap(), "plain.bin");
        // A '/' written as %2F is part of the key: the copy takes its last name.
        assert_eq!(name("s3://b/t%2Fq%3Fx.bin").unwrap(), "q?x.bin");
        assert!(name("s3://b/..").is_err());
    }
}
