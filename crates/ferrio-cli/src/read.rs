//! `ferrio read PATH...`: reads files in parallel into host memory, or with `--gpu N` into the
//! memory of GPU N (the file -> GPU rate, no Python needed). A PATH that is a URL (`s3://`,
//! `gs://`, `az://`, `http(s)://`) is read from remote storage with parallel ranged GETs.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::progress::Progress;
use crate::{check_interrupt, existing, gibps, json_path, out, wait_polled, IoFlags};

/// Host memory for the windows of all files together: a read of many or huge files must fit in
/// a small machine (or cgroup) rather than be killed for memory.
const BUDGET: u64 = 512 << 20;

/// Windows in flight per file: while one is waited on, the next is already queued, so the pool
/// never drains between windows.
const WINDOWS_PER_FILE: u64 = 2;

/// The largest window: many tasks per window, so that few requests are queued (the pool serves
/// queued requests round-robin, task by task: every extra request is another stream for the
/// device to interleave).
const MAX_WINDOW: u64 = 128 << 20;

/// The smallest window, when many files share the budget; windows are whole multiples of it,
/// so that every window starts at an offset that suits `O_DIRECT`.
const MIN_WINDOW: u64 = 8 << 20;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Files to read (all at once, each on its device's pool), or URLs of objects in remote
    /// storage (s3://, gs://, az://, http(s)://; credentials from AWS_*, GOOGLE_*, AZURE_*)
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Drop each file's pages from the page cache first (a cold read; URLs are always cold)
    #[arg(long)]
    cold: bool,
    /// Read into the memory of GPU N (one device buffer the size of each file, filled through
    /// ferrio's pinned bounce buffers) instead of host memory
    #[arg(long, value_name = "N")]
    gpu: Option<usize>,
    #[command(flatten)]
    io: IoFlags,
}

struct Outcome {
    path: PathBuf,
    bytes: u64,
    secs: f64,
}

/// What `read` reads from: a local file or an object in remote storage.
enum Source {
    Local(ferrio::File),
    Remote(ferrio::RemoteFile),
}

impl Source {
    /// Opens `p`: a URL of a remote object, else a local file (its pages dropped first if
    /// `cold`).
    fn open(p: &PathBuf, settings: &ferrio::Settings, cold: bool) -> anyhow::Result<Self> {
        if let Some(url) = p.to_str().filter(|u| ferrio::remote::is_remote_url(u)) {
            return Ok(Source::Remote(ferrio::RemoteFile::open_with(
                url,
                settings.clone(),
            )?));
        }
        existing(p)?;
        if cold {
            ferrio::pagecache::drop_file(p)?;
        }
        Ok(Source::Local(
            ferrio::File::options()
                .settings(settings.clone())
                .open(p, "r")?,
        ))
    }

    fn path(&self) -> &std::path::Path {
        match self {
            Source::Local(f) => f.path(),
            Source::Remote(f) => std::path::Path::new(f.url()),
        }
    }

    fn len(&self) -> ferrio::Result<u64> {
        match self {
            Source::Local(f) => f.len(),
            Source::Remote(f) => Ok(f.len()),
        }
    }

    fn pread<B: ferrio::IoBufMut>(&self, buf: B, offset: u64) -> ferrio::IoFuture<B> {
        match self {
            Source::Local(f) => f.pread(buf, offset),
            Source::Remote(f) => f.pread(buf, offset),
        }
    }

    /// # Safety
    /// As [`ferrio::File::pread_device`].
    unsafe fn pread_device(
        &self,
        dst: ferrio::cuda::DevicePtr,
        len: usize,
        offset: u64,
    ) -> ferrio::IoFuture {
        match self {
            // SAFETY: forwarded from this function's contract.
            Source::Local(f) => unsafe { f.pread_device(dst, len, offset) },
            // SAFETY: forwarded from this function's contract.
            Source::Remote(f) => unsafe { f.pread_device(dst, len, offset) },
        }
    }
}

pub(crate) fn run(mut a: Args) -> anyhow::Result<()> {
    a.paths = crate::local_paths(std::mem::take(&mut a.paths))?;
    let settings = a.io.settings()?;
    let files = a
        .paths
        .iter()
        .map(|p| Source::open(p, &settings, a.cold))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let lens = files
        .iter()
        .map(|f| f.len())
        .collect::<ferrio::Result<Vec<u64>>>()?;
    let total: u64 = lens.iter().sum();
    if let Some(gpu) = a.gpu {
        let outcomes = read_to_gpu(&files, &lens, gpu, total, a.io.json)?;
        return report(&outcomes, Some(gpu), a.io.json);
    }
    // Remote objects stream without windows (`read_streamed`): only files need them.
    let file_lens: Vec<u64> = files
        .iter()
        .zip(&lens)
        .map(|(f, &len)| {
            if matches!(f, Source::Local(_)) {
                len
            } else {
                0
            }
        })
        .collect();
    let (window, per_file, at_once) = plan(&file_lens);
    // A read of files the page cache holds is a memory copy: windows small enough to stay in
    // the CPU's cache (as `dd`'s block does) copy faster than large ones, which stream through
    // memory. A cold read keeps the large windows its fill tasks need.
    let window = match hot_window(&files, a.cold) {
        Some(hot) => window.min(hot as usize),
        None => window,
    };
    // Buffers are allocated and touched before the clock starts: page faults on fresh memory
    // are the allocator's cost, not the read's. Each reader owns its windows and reuses them
    // from file to file.
    let mut windows_of: Vec<Vec<Window>> = Vec::with_capacity(at_once);
    for _ in 0..at_once {
        let mut w = Vec::with_capacity(per_file);
        for _ in 0..per_file {
            match prefaulted(window) {
                Some(b) => w.push(b),
                None => {
                    let want = (window * per_file * at_once) as u64;
                    anyhow::bail!(
                        "cannot allocate {want} bytes ({}) of read windows: out of memory",
                        ferrio::config::format_size(want)
                    );
                }
            }
        }
        windows_of.push(w);
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<anyhow::Result<Outcome>>>> =
        Mutex::new(files.iter().map(|_| None).collect());
    let cpu0 = crate::host::process_cpu_seconds();
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
            progress.set(bytes_read_so_far(total));
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
    report(
        &Finished {
            outcomes,
            secs: t0.elapsed().as_secs_f64(),
            cpu: crate::host::process_cpu_seconds() - cpu0,
        },
        None,
        a.io.json,
    )
}

/// What a whole run did: each file, the wall time and the CPU time of all of them.
struct Finished {
    outcomes: Vec<Outcome>,
    secs: f64,
    cpu: f64,
}

/// Prints the per-file lines and the total (or one JSON object).
fn report(done: &Finished, gpu: Option<usize>, json_out: bool) -> anyhow::Result<()> {
    let (outcomes, secs, cpu) = (&done.outcomes, done.secs, done.cpu);
    let bytes: u64 = outcomes.iter().map(|o| o.bytes).sum();
    let into = gpu.map_or_else(|| "host".to_string(), |g| format!("cuda:{g}"));
    if json_out {
        let files: Vec<_> = outcomes
            .iter()
            .map(|o| json!({"path": json_path(&o.path), "bytes": o.bytes, "seconds": o.secs, "gib_per_s": gibps(o.bytes, o.secs)}))
            .collect();
        let v = json!({
            "bytes": bytes, "seconds": secs, "gib_per_s": gibps(bytes, secs), "into": into,
            "cpu_seconds_per_gib": crate::cpu_per_gib(cpu, bytes),
            "files": files, "pools": crate::info::pools_json(),
        });
        out(&v.to_string())?;
    } else {
        for o in outcomes {
            out(&format!(
                "{}: {} in {:.3} s, {:.2} GiB/s{}",
                o.path.display(),
                ferrio::config::format_size(o.bytes),
                o.secs,
                gibps(o.bytes, o.secs),
                gpu.map_or_else(String::new, |g| format!(" into GPU {g}"))
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

/// The window size, windows per file and files read at once, so that at most [`BUDGET`] bytes
/// of windows exist: every file at once with windows of up to [`MAX_WINDOW`] when that fits,
/// else windows of [`MIN_WINDOW`] and as many files at a time as the budget allows.
fn plan(lens: &[u64]) -> (usize, usize, usize) {
    let largest = lens.iter().copied().max().unwrap_or(0);
    let at_once = (lens.len() as u64).clamp(1, BUDGET / (WINDOWS_PER_FILE * MIN_WINDOW));
    let window = (BUDGET / (WINDOWS_PER_FILE * at_once)).clamp(MIN_WINDOW, MAX_WINDOW) / MIN_WINDOW
        * MIN_WINDOW;
    // A small file needs no more than its own length, rounded up to whole pages.
    let window = window.min(largest.div_ceil(4096).max(1) * 4096);
    let per_file = WINDOWS_PER_FILE.min(largest.div_ceil(window).max(1));
    (window as usize, per_file as usize, at_once as usize)
}

/// Share of a file the page cache must hold for its read to count as hot.
const HOT_SHARE: f64 = 0.9;

/// The window for files that are all local and all in the page cache: each worker of the
/// largest pool gets one task in flight over the [`WINDOWS_PER_FILE`] windows, and no more, so
/// the windows stay in the CPU's cache. `None` when any file is remote, read cold, or not held.
fn hot_window(files: &[Source], cold: bool) -> Option<u64> {
    if cold {
        return None;
    }
    let mut widest = 0u64;
    for f in files {
        let Source::Local(f) = f else { return None };
        let held = ferrio::pagecache::residency(f.path(), 0, None).ok()?;
        if held.share() < HOT_SHARE {
            return None;
        }
        let threads = f.pool().stats().max_threads.max(1) as u64;
        widest = widest.max(threads * f.task_size());
    }
    Some((widest / WINDOWS_PER_FILE).clamp(MIN_WINDOW, MAX_WINDOW) / MIN_WINDOW * MIN_WINDOW)
}

/// Streams a local file the page cache holds through windows of [`hot_window`]'s size, as
/// `ferrio read` does; for `ferrio bench`'s hot row, where `dd` streams through its block the
/// same way. The windows are sized, allocated and touched once, before any clock starts.
pub(crate) struct HotReader {
    src: Source,
    bufs: Vec<Window>,
}

impl HotReader {
    /// Windows for `f`, which should be in the page cache by now (else they are cold-sized).
    pub(crate) fn new(f: &ferrio::File) -> anyhow::Result<HotReader> {
        let src = [Source::Local(f.clone())];
        let window = hot_window(&src, false).unwrap_or(MAX_WINDOW);
        let bufs = (0..WINDOWS_PER_FILE)
            .map(|_| prefaulted(window as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| anyhow::anyhow!("cannot allocate read windows: out of memory"))?;
        let [src] = src;
        Ok(HotReader { src, bufs })
    }

    /// Reads the whole file once; returns the bytes read.
    pub(crate) fn read_all(&mut self) -> anyhow::Result<u64> {
        Ok(read_one(&self.src, &mut self.bufs)?.bytes)
    }
}

/// A buffer of `len` bytes whose pages are all mapped, or `None` when the memory is not there
/// (the caller reports it in one line, instead of the allocator's abort).
fn prefaulted(len: usize) -> Option<Window> {
    let mut buf = ferrio::AlignedBuf::new(len, WINDOW_ALIGN)?;
    // Writing a byte per page maps every page now, before any clock starts (the allocator hands
    // out zeroed pages that are mapped only when first touched).
    for i in (0..len).step_by(4096) {
        buf.as_mut_slice()[i] = 0;
    }
    Some(Window { buf, len })
}

/// Page-aligned window memory (so `O_DIRECT` reads land in it without a copy through scratch
/// memory), of which the first `len` bytes are read into.
struct Window {
    buf: ferrio::AlignedBuf,
    len: usize,
}

/// Alignment of window memory: a page suits `O_DIRECT` on every file system.
const WINDOW_ALIGN: usize = 4096;

// SAFETY: `AlignedBuf` memory never moves while it lives and only `&mut self` reaches it; `len`
// never exceeds the buffer's length (set only from lengths at most the window size).
unsafe impl ferrio::IoBufMut for Window {
    fn io_ptr_mut(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr()
    }
    fn io_len(&self) -> usize {
        self.len
    }
}

/// Reads every file at once into its own buffer on GPU `gpu`; stops promptly at Ctrl-C. The
/// device buffers are allocated before the clock starts.
fn read_to_gpu(
    files: &[Source],
    lens: &[u64],
    gpu: usize,
    total: u64,
    json_out: bool,
) -> anyhow::Result<Finished> {
    // The rings' memory is faulted in while the driver starts (`prepare_pinned_soon`).
    ferrio::prepare_pinned_soon();
    let info = ferrio::cuda::driver_info()?;
    if gpu >= info.device_count {
        return Err(crate::UsageError(format!(
            "--gpu {gpu}: this machine has {} GPU(s), numbered from 0",
            info.device_count
        ))
        .into());
    }
    let buffers = files
        .iter()
        .zip(lens)
        .map(|(f, &len)| {
            let len = usize::try_from(len)?;
            ferrio::cuda::DeviceBuffer::new(gpu, len, false).with_context(|| {
                format!(
                    "cannot allocate {} of GPU memory on GPU {gpu} for {}",
                    ferrio::config::format_size(len as u64),
                    f.path().display()
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let cpu0 = crate::host::process_cpu_seconds();
    let t0 = Instant::now();
    let mut progress = Progress::new("read", total, json_out);
    let mut futures: Vec<Option<ferrio::IoFuture>> = files
        .iter()
        .zip(&buffers)
        .map(|(f, buf)| {
            // SAFETY: `buf` is device memory of `buf.len()` bytes that nothing else writes; it
            // outlives the future, which is waited on (or dropped, which waits) below.
            Some(unsafe { f.pread_device(buf.ptr(), buf.len(), 0) })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let Some(fut) = futures[i].take() else {
            continue;
        };
        while !fut.wait_timeout(Duration::from_millis(25)) {
            progress.set(bytes_read_so_far(total));
            if let Err(e) = check_interrupt() {
                fut.cancel();
                futures.iter().flatten().for_each(|f| {
                    f.cancel();
                });
                return Err(e);
            }
        }
        let n = fut
            .wait()
            .with_context(|| format!("reading {} into GPU {gpu}", f.path().display()))?;
        outcomes.push(Outcome {
            path: f.path().to_path_buf(),
            bytes: n as u64,
            secs: t0.elapsed().as_secs_f64(),
        });
    }
    drop(progress);
    let finished = Finished {
        outcomes,
        secs: t0.elapsed().as_secs_f64(),
        cpu: crate::host::process_cpu_seconds() - cpu0,
    };
    drop(futures);
    drop(buffers);
    Ok(finished)
}

/// Reads all of `f` through the windows in `bufs`, all of them in flight, reusing them;
/// stops promptly at Ctrl-C. The windows are handed back in `bufs` when all went well.
fn read_one(f: &Source, bufs: &mut Vec<Window>) -> anyhow::Result<Outcome> {
    if let Source::Remote(r) = f {
        return read_streamed(r);
    }
    let len = f.len()?;
    let window = bufs.first().map_or(0, |w| w.buf.len()).max(1);
    let t0 = Instant::now();
    let mut free: VecDeque<Window> = bufs.drain(..).collect();
    let mut in_flight: VecDeque<(ferrio::IoFuture<Window>, usize)> = VecDeque::new();
    let (mut issued, mut done, mut at_end) = (0u64, 0u64, false);
    let result = loop {
        if let Err(e) = check_interrupt() {
            break Err(e);
        }
        if !at_end && issued < len {
            if let Some(mut buf) = free.pop_front() {
                let want = (len - issued).min(window as u64) as usize;
                buf.len = want;
                in_flight.push_back((f.pread(buf, issued), want));
                issued += want as u64;
                continue;
            }
        }
        let Some((fut, want)) = in_flight.pop_front() else {
            break Ok(());
        };
        if let Err(e) = wait_polled(&fut) {
            // Back with the others, all cancelled below before any is dropped: dropping this
            // one first waited for its tasks while the pool's threads ran the other window's.
            in_flight.push_front((fut, want));
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
        buf.len = window;
        free.push_back(buf);
    };
    if result.is_err() {
        // Stop every window in flight, then drop them: the drops wait only for the tasks that
        // were running, which stop between blocks.
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

/// Reads a remote object through host memory with every GET in flight at once: each piece of
/// each body is copied into a scratch buffer of the thread that received it (windows, as for a
/// file, would cap the GETs in flight at what they hold, and drain at each window's end).
fn read_streamed(f: &ferrio::RemoteFile) -> anyhow::Result<Outcome> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 1 << 20]);
    }
    let t0 = Instant::now();
    let len = usize::try_from(f.len()).unwrap_or(usize::MAX);
    let fut = f.read_to(0, len, |_, bytes| {
        SCRATCH.with_borrow_mut(|scratch| {
            for piece in bytes.chunks(scratch.len()) {
                scratch[..piece.len()].copy_from_slice(piece);
            }
        });
        Ok(())
    });
    wait_polled(&fut)?;
    let done = fut.wait().with_context(|| format!("reading {}", f.url()))?;
    Ok(Outcome {
        path: PathBuf::from(f.url()),
        bytes: done as u64,
        secs: t0.elapsed().as_secs_f64(),
    })
}

/// Bytes the worker pools and the remote reads have read so far (at most `total`), for the
/// progress bar.
fn bytes_read_so_far(total: u64) -> u64 {
    let pools: u64 = ferrio::stats().iter().map(|p| p.bytes_read).sum();
    (pools + ferrio::remote::bytes_read()).min(total)
}
