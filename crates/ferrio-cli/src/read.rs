//! `ferrio read PATH...`: reads files in parallel into host memory.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::progress::Progress;
use crate::{check_interrupt, existing, gibps, out, IoFlags};

/// Host memory used per file: files larger than this are read in windows of this size.
const WINDOW: u64 = 1 << 30;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Files to read (all at once, each on its device's pool)
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Drop each file's pages from the page cache first (a cold read)
    #[arg(long)]
    cold: bool,
    #[command(flatten)]
    io: IoFlags,
}

struct Outcome {
    path: PathBuf,
    bytes: u64,
    secs: f64,
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    for p in &a.paths {
        existing(p)?;
    }
    let settings = a.io.settings();
    let files = a
        .paths
        .iter()
        .map(|p| {
            if a.cold {
                ferrio::pagecache::drop_file(p)?;
            }
            ferrio::File::options()
                .settings(settings.clone())
                .open(p, "r")
        })
        .collect::<ferrio::Result<Vec<_>>>()?;
    let total: u64 = files.iter().map(|f| f.len()).sum::<ferrio::Result<u64>>()?;
    // Buffers are allocated and touched before the clock starts: page faults on fresh memory
    // are the allocator's cost, not the read's.
    let mut buffers: Vec<Vec<u8>> = files
        .iter()
        .map(|f| Ok(prefaulted(f.len()?.min(WINDOW) as usize)))
        .collect::<ferrio::Result<_>>()?;
    let cpu0 = crate::host::process_cpu_seconds();
    let t0 = Instant::now();
    let mut progress = Progress::new("read", total, a.io.json);
    let outcomes = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .zip(buffers.iter_mut())
            .map(|(f, buf)| s.spawn(move || read_one(f, buf)))
            .collect();
        loop {
            let done = handles.iter().all(|h| h.is_finished());
            progress.set(
                ferrio::stats()
                    .iter()
                    .map(|p| p.bytes_read)
                    .sum::<u64>()
                    .min(total),
            );
            if done {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("reader thread panicked")))
            })
            .collect::<anyhow::Result<Vec<Outcome>>>()
    })?;
    drop(progress);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = crate::host::process_cpu_seconds() - cpu0;
    let bytes: u64 = outcomes.iter().map(|o| o.bytes).sum();
    if a.io.json {
        let files: Vec<_> = outcomes
            .iter()
            .map(|o| json!({"path": o.path, "bytes": o.bytes, "seconds": o.secs, "gib_per_s": gibps(o.bytes, o.secs)}))
            .collect();
        let v = json!({
            "bytes": bytes, "seconds": secs, "gib_per_s": gibps(bytes, secs),
            "cpu_seconds_per_gib": cpu / (bytes.max(1) as f64 / (1u64 << 30) as f64),
            "files": files, "pools": crate::info::pools_json(),
        });
        out(&v.to_string())?;
    } else {
        for o in &outcomes {
            out(&format!(
                "{}: {} in {:.3} s, {:.2} GiB/s",
                o.path.display(),
                ferrio::config::format_size(o.bytes),
                o.secs,
                gibps(o.bytes, o.secs)
            ))?;
        }
        if outcomes.len() > 1 {
            out(&format!(
                "total: {} in {:.3} s, {:.2} GiB/s",
                ferrio::config::format_size(bytes),
                secs,
                gibps(bytes, secs)
            ))?;
        }
    }
    Ok(())
}

/// A zeroed buffer whose pages are all mapped.
fn prefaulted(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    for i in (0..len).step_by(4096) {
        buf[i] = 1;
    }
    buf
}

fn read_one(f: &ferrio::File, buf: &mut [u8]) -> anyhow::Result<Outcome> {
    let len = f.len()?;
    let window = buf.len();
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < len {
        check_interrupt()?;
        let want = (len - off).min(window as u64) as usize;
        let n = f
            .read_at(&mut buf[..want], off)
            .with_context(|| format!("reading {}", f.path().display()))?;
        if n == 0 {
            break; // truncated under us: report what was there
        }
        off += n as u64;
    }
    Ok(Outcome {
        path: f.path().to_path_buf(),
        bytes: off,
        secs: t0.elapsed().as_secs_f64(),
    })
}
