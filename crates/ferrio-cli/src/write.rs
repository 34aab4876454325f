//! `ferrio write PATH... --size SIZE`: writes generated data, to several files at once.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::progress::Progress;
use crate::{check_interrupt, gibps, out, parse_size, IoFlags};

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

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let settings = a.io.settings();
    let files = a
        .paths
        .iter()
        .map(|p| {
            ferrio::File::options()
                .settings(settings.clone())
                .open(p, "w")
        })
        .collect::<ferrio::Result<Vec<_>>>()?;
    let mut windows: Vec<Vec<Vec<u8>>> = files.iter().map(|_| generate(a.size)).collect();
    for f in &files {
        // Blocks allocated in one go: direct writes then neither extend the file nor allocate.
        f.allocate(a.size)?;
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
            .map(|(p, (n, t))| json!({"path": p, "bytes": n, "seconds": t, "gib_per_s": gibps(*n, *t)}))
            .collect();
        out(&json!({
            "bytes": written, "seconds": secs, "gib_per_s": gibps(written, secs),
            "cpu_seconds_per_gib": cpu / (written.max(1) as f64 / (1u64 << 30) as f64),
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
/// before any clock starts (generating data is not I/O).
pub(crate) fn generate(size: u64) -> Vec<Vec<u8>> {
    let window = size.clamp(1, WINDOW) as usize;
    (1..=2)
        .map(|seed| {
            let mut b = vec![0u8; window];
            fill(&mut b, seed);
            b
        })
        .collect()
}

/// Writes `size` bytes from `windows` (see [`generate`]) to `f`, keeping every window in flight
/// so the device never waits for the next one; stops at Ctrl-C. The windows are handed back in
/// `windows` when all went well.
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
    while done < size {
        check_interrupt()?;
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
            anyhow::bail!("no window to write with");
        };
        let (result, mut buf) = fut.into_buffer();
        done += result? as u64;
        buf.resize(window, 0);
        free.push_back(buf);
        progress.set(done);
    }
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
