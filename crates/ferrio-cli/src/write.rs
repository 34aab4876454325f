//! `ferrio write PATH... --size SIZE`: writes generated data, to several files at once.

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
    let cpu0 = ferrio::sys::process_cpu_seconds();
    let t0 = Instant::now();
    let quiet = a.io.json || files.len() > 1;
    let outcomes: Vec<(u64, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .map(|f| {
                s.spawn(move || -> anyhow::Result<(u64, f64)> {
                    let t = Instant::now();
                    let n = write_generated(f, a.size, quiet)?;
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
    let cpu = ferrio::sys::process_cpu_seconds() - cpu0;
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

/// Writes `size` bytes of generated, incompressible-looking data to `f`; stops at Ctrl-C.
pub(crate) fn write_generated(f: &ferrio::File, size: u64, quiet: bool) -> anyhow::Result<u64> {
    let window = size.min(WINDOW) as usize;
    let mut buf = vec![0u8; window];
    fill(&mut buf, 1);
    let mut progress = Progress::new("write", size, quiet);
    let mut off = 0u64;
    let mut step = 0u64;
    while off < size {
        check_interrupt()?;
        let n = (size - off).min(window as u64) as usize;
        // Vary each window cheaply so no two windows are equal (defeats dedup/compression).
        step += 1;
        buf[..8].copy_from_slice(&step.to_le_bytes());
        f.write_at(&buf[..n], off)?;
        off += n as u64;
        progress.set(off);
    }
    Ok(off)
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
