//! `ferrio read PATH...`: reads files in parallel into host memory.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::progress::Progress;
use crate::{check_interrupt, existing, gibps, out, wait_polled, IoFlags};

/// Windows in flight per file: the next is already queued on the pool when one completes, so
/// the workers never drain between windows.
const WINDOWS_PER_FILE: usize = 2;

/// The largest window: enough tasks per window to keep a fast device's queue full.
const MAX_WINDOW: u64 = 128 << 20;

/// The smallest window when many files share the budget.
const MIN_WINDOW: u64 = 8 << 20;

/// Host memory for the windows of all files together: a read of many or huge files must fit in
/// a small machine (or cgroup) rather than be killed for memory.
const BUDGET: u64 = 512 << 20;

/// Windows are a multiple of this, so that each window's offset suits `O_DIRECT`.
const WINDOW_ALIGN: u64 = 1 << 20;

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
    let settings = a.io.settings()?;
    for p in &a.paths {
        existing(p)?;
    }
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
    let lens = files
        .iter()
        .map(|f| f.len())
        .collect::<ferrio::Result<Vec<u64>>>()?;
    let total: u64 = lens.iter().sum();
    let (window, at_once) = plan(&lens);
    // Buffers are allocated and touched before the clock starts: page faults on fresh memory
    // are the allocator's cost, not the read's. Each reader owns its windows and reuses them
    // from file to file.
    let mut windows_of: Vec<Vec<Vec<u8>>> = Vec::with_capacity(at_once);
    for _ in 0..at_once {
        let mut w = Vec::with_capacity(WINDOWS_PER_FILE);
        for _ in 0..WINDOWS_PER_FILE {
            w.push(prefaulted(window)?);
        }
        windows_of.push(w);
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<anyhow::Result<Outcome>>>> =
        Mutex::new(files.iter().map(|_| None).collect());
    let cpu0 = ferrio::sys::process_cpu_seconds();
    let t0 = Instant::now();
    let mut progress = Progress::new("read", total, a.io.json);
    std::thread::scope(|s| {
        let handles: Vec<_> = windows_of
            .iter_mut()
            .map(|bufs| {
                let (files, next, results) = (&files, &next, &results);
                s.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    let r = read_one(f, bufs);
                    results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
                })
            })
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
            std::thread::sleep(Duration::from_millis(25));
        }
    });
    let outcomes = results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("reader thread panicked"))))
        .collect::<anyhow::Result<Vec<Outcome>>>()?;
    drop(progress);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = ferrio::sys::process_cpu_seconds() - cpu0;
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

/// The window size and how many files are read at once, so that at most [`BUDGET`] bytes of
/// windows exist: every file at once with windows of up to [`MAX_WINDOW`] when that fits,
/// else windows of [`MIN_WINDOW`] and as many files at a time as the budget allows.
fn plan(lens: &[u64]) -> (usize, usize) {
    let per_file = WINDOWS_PER_FILE as u64;
    let at_once = (lens.len() as u64).clamp(1, BUDGET / (per_file * MIN_WINDOW));
    let largest = lens.iter().copied().max().unwrap_or(0);
    let window = (BUDGET / (per_file * at_once))
        .clamp(MIN_WINDOW, MAX_WINDOW)
        .min(largest.div_ceil(WINDOW_ALIGN) * WINDOW_ALIGN)
        .max(WINDOW_ALIGN);
    (window as usize, at_once as usize)
}

/// A buffer of `len` bytes whose pages are all mapped, or the one-line error the command line
/// promises when the memory is not there (instead of the allocator's abort).
fn prefaulted(len: usize) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if buf.try_reserve_exact(len).is_err() {
        anyhow::bail!(
            "cannot allocate {len} bytes ({}) for a read window: out of memory (try fewer files at once)",
            ferrio::config::format_size(len as u64)
        );
    }
    // Writing the zeros maps every page now, before any clock starts.
    buf.resize(len, 0);
    Ok(buf)
}

/// Reads all of `f` through the windows in `bufs`, [`WINDOWS_PER_FILE`] in flight, reusing them;
/// stops promptly at Ctrl-C. The windows are handed back in `bufs` when all went well.
fn read_one(f: &ferrio::File, bufs: &mut Vec<Vec<u8>>) -> anyhow::Result<Outcome> {
    let len = f.len()?;
    let window = bufs.first().map_or(0, Vec::len).max(1);
    let t0 = Instant::now();
    let mut free: VecDeque<Vec<u8>> = bufs.drain(..).collect();
    let mut in_flight: VecDeque<(ferrio::IoFuture<Vec<u8>>, usize)> = VecDeque::new();
    let (mut issued, mut done, mut at_end) = (0u64, 0u64, false);
    let result = loop {
        if let Err(e) = check_interrupt() {
            break Err(e);
        }
        if !at_end && issued < len {
            if let Some(mut buf) = free.pop_front() {
                let want = (len - issued).min(window as u64) as usize;
                buf.truncate(want);
                in_flight.push_back((f.pread(buf, issued), want));
                issued += want as u64;
                continue;
            }
        }
        let Some((fut, want)) = in_flight.pop_front() else {
            break Ok(());
        };
        if let Err(e) = wait_polled(&fut) {
            break Err(e);
        }
        let (r, mut buf) = fut.into_buffer();
        match r.with_context(|| format!("reading {}", f.path().display())) {
            Ok(n) => {
                done += n as u64;
                // Truncated under us: report what was there.
                at_end |= n < want;
            }
            Err(e) => break Err(e),
        }
        buf.resize(window, 0);
        free.push_back(buf);
    };
    if result.is_err() {
        // Stop the windows still queued; dropping them then waits only for running tasks.
        for (fut, _) in &in_flight {
            fut.cancel();
        }
    }
    drop(in_flight);
    result?;
    bufs.extend(free);
    Ok(Outcome {
        path: f.path().to_path_buf(),
        bytes: done,
        secs: t0.elapsed().as_secs_f64(),
    })
}
