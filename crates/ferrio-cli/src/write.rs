//! `ferrio write PATH --size SIZE`: writes generated data.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::progress::Progress;
use crate::{check_interrupt, gibps, out, parse_size, IoFlags};

/// Bytes generated and written per step.
const WINDOW: u64 = 256 << 20;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// File to create (or overwrite)
    path: PathBuf,
    /// How much to write, e.g. 2GiB
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
    let f = ferrio::File::options()
        .settings(settings)
        .open(&a.path, "w")?;
    let cpu0 = ferrio::sys::process_cpu_seconds();
    let t0 = Instant::now();
    let written = write_generated(&f, a.size, a.io.json)?;
    if !a.no_sync {
        f.sync()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = ferrio::sys::process_cpu_seconds() - cpu0;
    if a.io.json {
        out(&json!({
            "path": a.path, "bytes": written, "seconds": secs, "gib_per_s": gibps(written, secs),
            "cpu_seconds_per_gib": cpu / (written.max(1) as f64 / (1u64 << 30) as f64),
            "synced": !a.no_sync,
        })
        .to_string())?;
    } else {
        out(&format!(
            "{}: wrote {} in {:.3} s, {:.2} GiB/s{}",
            a.path.display(),
            ferrio::config::format_size(written),
            secs,
            gibps(written, secs),
            if a.no_sync { " (not synced)" } else { "" }
        ))?;
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
