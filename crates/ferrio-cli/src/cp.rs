//! `ferrio cp SRC... DST`: copies files and directory trees with [`ferrio::copy`], reads on the
//! sources' device pools and writes on the destination's, several files at once; files to and
//! from URLs of remote storage too.
//!
//! Exit status: 0 when everything was copied, 2 for a bad command line or a source that does not
//! exist (nothing is copied then), 1 when some file failed (each failure gets a line on stderr;
//! the other files are copied), 130 after Ctrl-C, 143 after `SIGTERM` (no partial file is left).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Duration;

use ferrio::{CopyMethod, CopyOptions, CopyProgress, CopyReport};
use serde_json::json;

use crate::progress::Progress;
use crate::{gibps, interrupted, json_path, out, parse_size, Interrupted, IoFlags, UsageError};

/// How `ferrio cp` treats what is already there, shown under `ferrio cp --help`.
const DESTINATION_RULES: &str = "\
Destinations, as with GNU cp:
  - DST an existing directory: each SRC goes inside it; SRC/. copies the contents of SRC into it.
  - Each file is written to a hidden temporary name next to its destination and renamed into
    place when complete, so an existing file is never left half-written.
  - DST a symlink to a file: the copy replaces the link's target and the link stays.
  - DST a dangling symlink: refused (nothing is created where the link points).
  - DST a device, FIFO or socket (/dev/null, a disk): refused, never replaced by a file; to
    read files without keeping them use `ferrio read`.
  - DST a file you may not write: refused (renaming over it would bypass its permissions).
  - A copy killed with SIGKILL leaves its temporary file (.NAME.ferrio-PID-...); the next copy
    into that directory removes it once that process is gone.

URLs (s3://, gs://, az://; http(s):// as a source only) may stand for a SRC or DST file:
  - FILE URL uploads FILE in parallel parts; the object appears only when the whole file is
    sent (an error or Ctrl-C aborts the upload: no object, no leftover parts).
  - URL FILE (or URL DIR/) downloads with parallel ranged GETs into a temporary file renamed
    into place when complete.
  - URL URL copies inside the store when both are in one bucket, else streams the bytes.
  - A DST URL ending in / is a prefix: the copy is named after SRC.
  - -r DIR URL uploads every regular file under DIR as URL/relative/path (symlinks to files
    are followed; to directories only with -L). With several SRC each goes under URL/NAME/.
  - -r URL DIR downloads every object under the prefix URL, making directories: into DIR
    itself when DIR does not exist, into DIR/NAME when it does (as cp -r). A prefix with no
    objects is an error; a key with an empty, . or .. component refuses the whole copy.

Exit status: 0 all copied, 2 bad usage or missing source (nothing copied), 1 some file failed
(one line each on stderr; the others are copied), 130 Ctrl-C, 143 SIGTERM (no partial file is
left).";

#[derive(clap::Args, Debug)]
#[command(override_usage = "ferrio cp [OPTIONS] SRC... DST", after_help = DESTINATION_RULES)]
pub(crate) struct Args {
    /// Sources, then the destination (which must be a directory when there are several sources)
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Copy directories and everything in them
    #[arg(short = 'r', short_alias = 'R', long)]
    recursive: bool,
    /// Keep mode, owner (where permitted) and access/modification times
    #[arg(short = 'p', long)]
    preserve: bool,
    /// Read every copy back from the device and compare it with its source (flushes each file)
    #[arg(long)]
    verify: bool,
    /// Follow symlinks and copy what they point to [default: copy symlinks as symlinks]
    #[arg(short = 'L', long)]
    dereference: bool,
    /// Flush each file to the device before renaming it into place (crash-safe replacement)
    #[arg(long)]
    sync: bool,
    /// How bytes move: auto (copy_file_range within one file system), read-write or
    /// copy-file-range
    #[arg(long, default_value = "auto", value_parser = parse_method)]
    method: CopyMethod,
    /// Files copied at once [default: 12 within one file system, else 8; 2 per device pair when more]
    #[arg(long, value_parser = at_least_one)]
    files: Option<usize>,
    /// Bytes per pipeline window of a file, e.g. 8MiB [default: twice the task size]
    #[arg(long, value_parser = nonzero_size)]
    window: Option<u64>,
    /// Windows in flight per file (being read or written) [default: 4]
    #[arg(long, value_parser = at_least_one)]
    windows: Option<usize>,
    #[command(flatten)]
    io: IoFlags,
}

/// `sources` with any given again (`a ./a`: the same file under the same name) left out, and a
/// warning for each, as GNU cp gives: the second copy would only overwrite the first. Hard
/// links under other names are kept: each has a destination of its own.
fn distinct(sources: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    let mut kept = Vec::with_capacity(sources.len());
    for src in sources {
        // The file itself where it exists (a symlink as the link, as cp copies it without
        // -L) and its name; otherwise, a URL or a missing path, the whole name.
        let key = match std::fs::symlink_metadata(src) {
            Ok(m) => (m.dev(), m.ino(), src.file_name().map(|n| n.to_os_string())),
            Err(_) => (0, 0, Some(src.clone().into_os_string())),
        };
        if seen.insert(key) {
            kept.push(src.clone());
        } else {
            say!(
                "ferrio: warning: source {} given more than once; copied once",
                src.display()
            );
        }
    }
    kept
}

/// A count of at least 1 (`--files`, `--windows`: 0 would copy nothing, or never end).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// A size of at least 1 byte (`--window`).
fn nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("must be at least 1 byte".into()),
        n => Ok(n),
    }
}

fn parse_method(s: &str) -> Result<CopyMethod, String> {
    s.parse().map_err(|e: ferrio::Error| e.to_string())
}

/// How often the progress bar and the Ctrl-C flag are looked at.
const TICK: Duration = Duration::from_millis(100);

/// Failed entries printed one per line before the summary; the rest are counted.
const MAX_ERROR_LINES: usize = 50;

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let Some((dest, sources)) = a.paths.split_last() else {
        return Err(UsageError("cp needs a source and a destination".into()).into());
    };
    let sources = &distinct(sources)[..];
    let progress = CopyProgress::new();
    let mut opts = CopyOptions::new()
        .recursive(a.recursive)
        .preserve(a.preserve)
        .verify(a.verify)
        .follow_symlinks(a.dereference)
        .sync(a.sync)
        .method(a.method)
        .settings(a.io.settings()?)
        .progress(Arc::clone(&progress));
    if let Some(n) = a.files {
        opts = opts.parallel_files(n);
    }
    if let Some(n) = a.window {
        opts = opts.window_bytes(n);
    }
    if let Some(n) = a.windows {
        opts = opts.windows_in_flight(n);
    }
    let mut bar = Progress::new("cp", 0, a.io.json);
    let result = std::thread::scope(|s| {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let opts = &opts;
        s.spawn(move || {
            // The receiver lives until this scope ends; a failed send has no one to tell.
            let _ = done_tx.send(ferrio::copy(sources, dest, opts));
        });
        loop {
            match done_rx.recv_timeout(TICK) {
                Ok(result) => break result,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    break Err(ferrio::Error::InvalidArgument("the copy panicked".into()))
                }
            }
            if interrupted() {
                progress.cancel();
            }
            bar.set_total(progress.bytes_total());
            bar.set_label(format!(
                "cp {}/{} files",
                progress.files_done(),
                progress.files_total()
            ));
            bar.set(progress.bytes_done());
        }
    });
    drop(bar);
    let report = result?;
    if a.io.json {
        out(&summary_json(&report).to_string())?;
    } else if report.files + report.symlinks > 0 {
        for line in summary_lines(&report) {
            out(&line)?;
        }
    }
    if report.cancelled || interrupted() {
        return Err(Interrupted.into());
    }
    match report.errors.len() {
        0 => Ok(()),
        1 => Err(anyhow::anyhow!(
            "{}",
            one_line(&report.errors[0].to_string())
        )),
        n => {
            for e in report.errors.iter().take(MAX_ERROR_LINES) {
                say!("ferrio: {}", one_line(&e.to_string()));
            }
            if n > MAX_ERROR_LINES {
                say!("ferrio: ... and {} more", n - MAX_ERROR_LINES);
            }
            Err(anyhow::anyhow!(
                "{n} of {} entries could not be copied",
                n as u64 + report.files + report.symlinks
            ))
        }
    }
}

/// A message on one line: file names may hold newlines.
fn one_line(s: &str) -> String {
    s.replace('\n', "\\n")
}

fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / (1u64 << 20) as f64
    } else {
        0.0
    }
}

fn summary_json(r: &CopyReport) -> serde_json::Value {
    let devices: Vec<_> = r
        .devices
        .iter()
        .map(|d| {
            json!({
                "pool": d.pool,
                "bytes_read": d.bytes_read,
                "bytes_written": d.bytes_written,
                "read_mib_per_s": mib_per_s(d.bytes_read, r.seconds),
                "write_mib_per_s": mib_per_s(d.bytes_written, r.seconds),
            })
        })
        .collect();
    let errors: Vec<_> = r
        .errors
        .iter()
        .map(|e| json!({"path": json_path(&e.path), "dest": json_path(&e.dest), "error": e.error.to_string()}))
        .collect();
    json!({
        "files": r.files,
        "dirs": r.dirs,
        "symlinks": r.symlinks,
        "bytes": r.bytes,
        "bytes_copy_file_range": r.bytes_copy_file_range,
        "verified": r.verified,
        "seconds": r.seconds,
        "gib_per_s": gibps(r.bytes, r.seconds),
        "devices": devices,
        "errors": errors,
        "cancelled": r.cancelled,
    })
}

fn summary_lines(r: &CopyReport) -> Vec<String> {
    let size = ferrio::config::format_size;
    let mut lines = vec![format!(
        "copied {} files, {} symlinks, {} directories: {} in {:.3} s, {:.2} GiB/s{}",
        r.files,
        r.symlinks,
        r.dirs,
        size(r.bytes),
        r.seconds,
        gibps(r.bytes, r.seconds),
        if r.verified > 0 {
            format!(", {} verified", r.verified)
        } else {
            String::new()
        }
    )];
    for d in &r.devices {
        for (what, bytes) in [("read from", d.bytes_read), ("wrote to", d.bytes_written)] {
            if bytes > 0 {
                lines.push(format!(
                    "  {what} {}: {} ({:.0} MiB/s)",
                    d.pool,
                    size(bytes),
                    mib_per_s(bytes, r.seconds)
                ));
            }
        }
    }
    lines
}
