//! `ferrio write PATH... --size SIZE`: writes generated data, to several files at once.
//!
//! Every target is checked before any is opened (a bad one is a usage error and touches
//! nothing). Files are written in place; when the write fails or is interrupted, the files this
//! run created are removed, and files that were there before are named as partly overwritten.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io::{Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;

use crate::progress::Progress;
use crate::{
    check_interrupt, gibps, json_path, out, parse_size, wait_polled, Interrupted, IoFlags,
    UsageError,
};

/// Bytes generated and written per step.
const WINDOW: u64 = 256 << 20;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Files to create (or overwrite), all written at once, each on its device's pool
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// How much to write to each file, e.g. 2GiB
    #[arg(long, value_parser = parse_size)]
    size: u64,
    /// Do not flush to the device at the end (measures the page cache, not the disk)
    #[arg(long)]
    no_sync: bool,
    #[command(flatten)]
    io: IoFlags,
}

pub(crate) fn run(mut a: Args) -> anyhow::Result<()> {
    a.paths = crate::local_paths(std::mem::take(&mut a.paths))?;
    let settings = a.io.settings()?;
    let mut existed = Vec::with_capacity(a.paths.len());
    if let Some(url) = a
        .paths
        .iter()
        .filter_map(|p| p.to_str())
        .find(|p| ferrio::remote::is_remote_url(p))
    {
        return Err(UsageError(format!(
            "{url}: write makes local files; upload a file with `ferrio cp FILE {url}`"
        ))
        .into());
    }
    for p in &a.paths {
        existed.push(check_target(p, a.size)?);
    }
    check_space(&a.paths, a.size)?;
    let mut opened = Opened {
        targets: Vec::new(),
    };
    let result = write_all(&a, &settings, &existed, &mut opened);
    if let Err(e) = result {
        return Err(opened.undo(e));
    }
    Ok(())
}

/// The targets this run has opened (and so truncated or created), to undo on failure.
struct Opened {
    /// Each path, and whether it existed before this run.
    targets: Vec<(PathBuf, bool)>,
}

impl Opened {
    /// Removes the files this run created and names the ones it partly overwrote, in `e` (or on
    /// their own line after Ctrl-C, whose message is fixed).
    fn undo(&self, e: anyhow::Error) -> anyhow::Error {
        let mut damaged = Vec::new();
        for (p, existed) in &self.targets {
            if *existed {
                damaged.push(p.display().to_string());
            } else {
                // Best effort: the error being reported matters more than a failed removal.
                let _ = std::fs::remove_file(p);
            }
        }
        if damaged.is_empty() {
            return e;
        }
        let note = format!(
            "{} existed before and {} now truncated or partly overwritten",
            damaged.join(", "),
            if damaged.len() == 1 { "is" } else { "are" }
        );
        if e.downcast_ref::<Interrupted>().is_some() {
            say!("ferrio: {note}");
            return e;
        }
        e.context(note)
    }
}

/// Checks that `size` bytes can be written to `p` without touching it: not a directory, in an
/// existing, writable directory, writable itself if it exists, large enough if it is a block
/// device. Returns whether it exists.
fn check_target(p: &Path, size: u64) -> anyhow::Result<bool> {
    let bad =
        |why: String| -> anyhow::Error { UsageError(format!("{}: {why}", p.display())).into() };
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => return Err(bad("is a directory".into())),
        // The library refuses these when it opens them; found here, no other target is
        // touched first.
        Ok(m) if !m.is_file() && !m.file_type().is_block_device() => {
            let ft = m.file_type();
            let kind = if ft.is_fifo() {
                "is a FIFO"
            } else if ft.is_char_device() {
                "is a character device"
            } else if ft.is_socket() {
                "is a socket"
            } else {
                "is not a regular file"
            };
            return Err(bad(format!(
                "{kind} (only regular files and block devices can be written)"
            )));
        }
        Ok(m) => {
            if let Some(why) = write_refused(p) {
                return Err(bad(format!("{why} (not writable)")));
            }
            // A device cannot grow: a write past its end would fail after the device was
            // opened for writing (the kernel says only EINVAL).
            if m.file_type().is_block_device() {
                let held = std::fs::File::open(p).and_then(|mut f| f.seek(SeekFrom::End(0)));
                if let Ok(held) = held {
                    if size > held {
                        return Err(bad(format!(
                            "--size {} is more than the device holds ({})",
                            ferrio::config::format_size(size),
                            ferrio::config::format_size(held)
                        )));
                    }
                }
            }
            return Ok(true);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(e.to_string())),
    }
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad(format!("{} is not a directory", parent.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(format!(
                "directory {} does not exist",
                parent.display()
            )))
        }
        Err(e) => return Err(bad(format!("{}: {e}", parent.display()))),
    }
    if let Some(why) = write_refused(parent) {
        return Err(bad(format!(
            "cannot create files in {}: {why}",
            parent.display()
        )));
    }
    // A dangling symlink is "not found" yet is there: writing would create its target.
    Ok(std::fs::symlink_metadata(p).is_ok())
}

/// Checks, before any target is truncated, that each file system has room for `size` bytes in
/// each of its target files, counting the blocks the existing ones hold now. A write that
/// cannot fit fails here, leaving the old files whole, rather than after truncating them.
/// Block devices, and file systems that report no size (a FUSE one without `statfs`), are not
/// checked.
fn check_space(paths: &[PathBuf], size: u64) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // Per file system (device number): a target in it, the bytes wanted, the bytes held now.
    let mut per_fs: Vec<(u64, &Path, u64, u64)> = Vec::new();
    for p in paths {
        let held = match std::fs::metadata(p) {
            Ok(m) if m.file_type().is_block_device() => continue,
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        };
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let Ok(dev) = std::fs::metadata(parent).map(|m| m.dev()) else {
            continue;
        };
        match per_fs.iter_mut().find(|e| e.0 == dev) {
            Some(e) => {
                e.2 = e.2.saturating_add(size);
                e.3 += held;
            }
            None => per_fs.push((dev, parent, size, held)),
        }
    }
    for (_, dir, wanted, held) in per_fs {
        let Some(free) = crate::host::writable_bytes(dir) else {
            continue;
        };
        if wanted > free.saturating_add(held) {
            return Err(UsageError(format!(
                "{}: no room for --size {}: the file system has {} free{}, {} needed",
                dir.display(),
                ferrio::config::format_size(size),
                ferrio::config::format_size(free),
                if held > 0 {
                    format!(
                        " and the files to overwrite hold {}",
                        ferrio::config::format_size(held)
                    )
                } else {
                    String::new()
                },
                ferrio::config::format_size(wanted)
            ))
            .into());
        }
    }
    Ok(())
}

/// Why this process may not write `p` (a directory: create entries in it), by `access(2)`:
/// `None` where it may, else what the kernel said ("permission denied", "read-only file
/// system"), in lower case as the other reasons here are.
fn write_refused(p: &Path) -> Option<String> {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return Some("the path holds a NUL byte".into());
    };
    // SAFETY: `c` is a NUL-terminated string that lives across the call; access only reads it.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        return None;
    }
    let e = std::io::Error::last_os_error();
    Some(match e.raw_os_error() {
        Some(libc::EROFS) => "read-only file system".into(),
        Some(libc::EACCES | libc::EPERM) => "permission denied".into(),
        _ => e.to_string(),
    })
}

fn write_all(
    a: &Args,
    settings: &ferrio::Settings,
    existed: &[bool],
    opened: &mut Opened,
) -> anyhow::Result<()> {
    let mut files = Vec::with_capacity(a.paths.len());
    for (p, &was_there) in a.paths.iter().zip(existed) {
        let cache = if a.no_sync {
            settings.cache
        } else {
            settings.cache.for_synced_writes()
        };
        let f = ferrio::File::options()
            .settings(settings.clone())
            .cache(cache)
            .open(p, "w");
        // Recorded even when the open failed: it may have created or truncated the file first.
        // A device, FIFO or socket the open refused was left as it was: not to be named as
        // overwritten.
        let touched = f.is_ok() || !was_there || std::fs::metadata(p).is_ok_and(|m| m.is_file());
        if touched {
            opened.targets.push((p.clone(), was_there));
        }
        files.push(f?);
    }
    let mut windows = Vec::with_capacity(files.len());
    for _ in &files {
        windows.push(generate(a.size)?);
    }
    for f in &files {
        // Blocks allocated in one go: direct writes then neither extend the file nor allocate.
        // Nothing to allocate for an empty file (and fallocate refuses a length of 0).
        if a.size > 0 {
            f.allocate(a.size)?;
        }
    }
    let cpu0 = crate::host::process_cpu_seconds();
    let t0 = Instant::now();
    let quiet = a.io.json || files.len() > 1;
    let outcomes: Vec<(u64, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .zip(windows.iter_mut())
            .map(|(f, w)| {
                s.spawn(move || -> anyhow::Result<(u64, f64)> {
                    let t = Instant::now();
                    let n = write_generated(f, a.size, w, quiet)?;
                    if !a.no_sync {
                        f.sync()?;
                    }
                    // A network or FUSE file system may report a failed write only at close.
                    f.clone().close()?;
                    Ok((n, t.elapsed().as_secs_f64()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("writer thread panicked")))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = crate::host::process_cpu_seconds() - cpu0;
    let written: u64 = outcomes.iter().map(|o| o.0).sum();
    if a.io.json {
        let per_file: Vec<_> = a
            .paths
            .iter()
            .zip(&outcomes)
            .map(|(p, (n, t))| json!({"path": json_path(p), "bytes": n, "seconds": t, "gib_per_s": gibps(*n, *t)}))
            .collect();
        out(&json!({
            "bytes": written, "seconds": secs, "gib_per_s": gibps(written, secs),
            "cpu_seconds_per_gib": crate::cpu_per_gib(cpu, written),
            "synced": !a.no_sync, "files": per_file, "pools": crate::info::pools_json(),
        })
        .to_string())?;
    } else {
        let note = if a.no_sync { " (not synced)" } else { "" };
        for (p, (n, t)) in a.paths.iter().zip(&outcomes) {
            out(&format!(
                "{}: wrote {} in {:.3} s, {:.2} GiB/s{note}",
                p.display(),
                ferrio::config::format_size(*n),
                t,
                gibps(*n, *t)
            ))?;
        }
        if outcomes.len() > 1 {
            out(&format!(
                "total: {} in {:.3} s, {:.2} GiB/s{note}",
                ferrio::config::format_size(written),
                secs,
                gibps(written, secs)
            ))?;
        }
    }
    Ok(())
}

/// Two windows of generated, incompressible-looking bytes for writing `size` bytes: made once,
/// before any clock starts (generating data is not I/O). Stops at Ctrl-C.
pub(crate) fn generate(size: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    let window = size.clamp(1, WINDOW) as usize;
    let mut windows = Vec::with_capacity(2);
    for seed in 1..=2u64 {
        let mut b = crate::host::zeroed(window)?;
        // In slices, so that Ctrl-C is noticed while a large window is filled.
        for (i, chunk) in b.chunks_mut(8 << 20).enumerate() {
            check_interrupt()?;
            fill(chunk, seed.wrapping_mul(1 << 32) + i as u64);
        }
        windows.push(b);
    }
    Ok(windows)
}

/// Writes `size` bytes from `windows` (see [`generate`]) to `f`, keeping every window in flight
/// so the device never waits for the next one; stops promptly at Ctrl-C (queued tasks are
/// cancelled). The windows are handed back in `windows` when all went well.
pub(crate) fn write_generated(
    f: &ferrio::File,
    size: u64,
    windows: &mut Vec<Vec<u8>>,
    quiet: bool,
) -> anyhow::Result<u64> {
    let window = windows.first().map_or(0, Vec::len);
    let mut free: VecDeque<Vec<u8>> = windows.drain(..).collect();
    let mut in_flight: VecDeque<ferrio::IoFuture<Vec<u8>>> = VecDeque::new();
    let mut progress = Progress::new("write", size, quiet);
    let (mut issued, mut done, mut step) = (0u64, 0u64, 0u64);
    let result = loop {
        if done >= size {
            break Ok(());
        }
        if let Err(e) = check_interrupt() {
            break Err(e);
        }
        if issued < size {
            if let Some(mut buf) = free.pop_front() {
                let n = (size - issued).min(window as u64) as usize;
                buf.truncate(n);
                // Stamp each window so no two are equal (defeats dedup and compression).
                step += 1;
                let stamp = step.to_le_bytes();
                let k = stamp.len().min(n);
                buf[..k].copy_from_slice(&stamp[..k]);
                in_flight.push_back(f.pwrite(buf, issued));
                issued += n as u64;
                continue;
            }
        }
        let Some(fut) = in_flight.pop_front() else {
            break Err(anyhow::anyhow!("no window to write with"));
        };
        if let Err(e) = wait_polled(&fut) {
            // Back with the others, all cancelled below before any is dropped (see `read`).
            in_flight.push_front(fut);
            break Err(e);
        }
        let (result, mut buf) = fut.into_buffer();
        match result {
            Ok(n) => done += n as u64,
            Err(e) => break Err(e.into()),
        }
        buf.resize(window, 0);
        free.push_back(buf);
        progress.set(done);
    };
    if result.is_err() {
        // Stop every window in flight, then drop them: the drops wait only for running tasks.
        for fut in &in_flight {
            fut.cancel();
        }
    }
    drop(in_flight);
    result?;
    windows.extend(free);
    Ok(done)
}

/// Fills `buf` with xorshift bytes from `seed`.
pub(crate) fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}
