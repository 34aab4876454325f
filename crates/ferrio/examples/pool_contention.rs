//! Host-side contention benchmark of `ferrio::memory::PoolResource`.
//!
//! Two measurements, both on host memory with emulated streams (no GPU needed):
//!
//! 1. **Contention** (default): T threads × S streams allocate and free random sizes
//!    (256 B to 256 KiB, 16 live blocks per thread) as fast as they can, against ferrio's pool
//!    and against a baseline pool guarded by one `Mutex` (RMM's design, minus its event
//!    records). Prints allocations per second (each one paired with a free).
//! 2. **Event policies** (`--events`): threads rotate over streams, so blocks freed on one
//!    stream are wanted on others, with emulated work pending on every stream. Prints
//!    throughput and driver calls per 1000 frees for each `EventPolicy`; `--call-cost-ns N`
//!    makes every emulated record/query/wait spin N ns like a driver call.
//!
//! ```text
//! cargo run --release -p ferrio --example pool_contention -- [--threads 1,4,16]
//!     [--seconds 0.5] [--events] [--call-cost-ns N]
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use ferrio::memory::{
    EmulatedStream, EmulatedStreams, EventPolicy, HostUpstream, PoolOptions, PoolResource,
    StreamId, StreamOrder, Upstream,
};

const LIVE_PER_THREAD: usize = 16;
const SIZES: [usize; 8] = [
    256,
    512,
    1 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
];
const GROW_BYTES: usize = 64 << 20;
const ALIGN: usize = 256;

/// What the benchmark needs of a pool.
trait BenchPool: Send + Sync {
    fn alloc(&self, size: usize, stream: &EmulatedStream) -> usize;
    fn free(&self, addr: usize, size: usize, stream: &EmulatedStream);
}

impl BenchPool for PoolResource<HostUpstream, EmulatedStreams> {
    fn alloc(&self, size: usize, stream: &EmulatedStream) -> usize {
        match self.allocate(size, stream) {
            Ok(b) => b.addr(),
            Err(e) => fail(&e.to_string()),
        }
    }
    fn free(&self, addr: usize, size: usize, stream: &EmulatedStream) {
        if let Err(e) = self.deallocate(addr, size, stream) {
            fail(&e.to_string())
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("pool_contention: {msg}");
    std::process::exit(1)
}

/// The baseline: per-stream free lists like ferrio's, but all behind one mutex, growth
/// included (what RMM's `pool_memory_resource` does).
struct MutexPool {
    inner: Mutex<MutexInner>,
}

#[derive(Default)]
struct MutexInner {
    lists: HashMap<StreamId, List>,
    chunks: Vec<(usize, usize)>,
}

#[derive(Default)]
struct List {
    by_size: BTreeSet<(usize, usize)>,
    by_addr: BTreeMap<usize, usize>,
}

impl List {
    fn take(&mut self, size: usize) -> Option<(usize, usize)> {
        let &(s, a) = self.by_size.range((size, 0)..).next()?;
        self.by_size.remove(&(s, a));
        self.by_addr.remove(&a);
        Some((a, s))
    }
    fn put(&mut self, mut addr: usize, mut size: usize, chunk_start: bool, chunk_end: usize) {
        if !chunk_start {
            if let Some((&a, &s)) = self.by_addr.range(..addr).next_back() {
                if a + s == addr {
                    self.by_addr.remove(&a);
                    self.by_size.remove(&(s, a));
                    addr = a;
                    size += s;
                }
            }
        }
        if addr + size < chunk_end {
            if let Some(&s) = self.by_addr.get(&(addr + size)) {
                self.by_addr.remove(&(addr + size));
                self.by_size.remove(&(s, addr + size));
                size += s;
            }
        }
        self.by_addr.insert(addr, size);
        self.by_size.insert((size, addr));
    }
}

impl MutexInner {
    fn chunk_of(&self, addr: usize) -> (usize, usize) {
        let i = self.chunks.partition_point(|&(a, _)| a <= addr) - 1;
        self.chunks[i]
    }
}

impl BenchPool for MutexPool {
    fn alloc(&self, size: usize, stream: &EmulatedStream) -> usize {
        let size = size.div_ceil(ALIGN) * ALIGN;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let found = inner.lists.entry(stream.id()).or_default().take(size);
        let found = found.or_else(|| inner.lists.values_mut().find_map(|l| l.take(size)));
        let (addr, got) = match found {
            Some(x) => x,
            None => {
                let bytes = size.max(GROW_BYTES);
                let addr = HostUpstream
                    .allocate(bytes, ALIGN)
                    .unwrap_or_else(|e| fail(&e.to_string()));
                let at = inner.chunks.partition_point(|&(a, _)| a < addr);
                inner.chunks.insert(at, (addr, bytes));
                (addr, bytes)
            }
        };
        if got > size {
            let (c, len) = inner.chunk_of(addr);
            let list = inner.lists.entry(stream.id()).or_default();
            list.put(addr + size, got - size, false, c + len);
        }
        addr
    }
    fn free(&self, addr: usize, size: usize, stream: &EmulatedStream) {
        let size = size.div_ceil(ALIGN) * ALIGN;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (c, len) = inner.chunk_of(addr);
        let list = inner.lists.entry(stream.id()).or_default();
        list.put(addr, size, addr == c, c + len);
    }
}

impl Drop for MutexPool {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        for &(addr, bytes) in &inner.chunks {
            // SAFETY: each chunk came from `HostUpstream.allocate(bytes, ALIGN)`, freed once.
            let _ = unsafe { HostUpstream.deallocate(addr, bytes, ALIGN) };
        }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// How a thread picks its stream for iteration `n`.
#[derive(Clone, Copy)]
enum Streams {
    /// Thread i always uses stream i % S.
    Fixed,
    /// Thread i uses stream (i + n / 256) % S, with emulated work on it, and advances it.
    Rotating,
    /// Thread i allocates on stream i with emulated work on it, and frees on the last stream
    /// (a "sink" no one allocates on) after ordering it behind stream i: every allocation
    /// after the first few has to steal from the sink.
    Sink,
}

/// Runs the workload; returns (allocations, seconds).
fn run(
    pool: Arc<dyn BenchPool>,
    emu: &EmulatedStreams,
    threads: usize,
    streams: usize,
    mode: Streams,
    seconds: f64,
) -> (u64, f64) {
    let streams: Arc<Vec<EmulatedStream>> =
        Arc::new((0..streams).map(|_| emu.create_stream()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (pool, emu, streams, stop, total, start) = (
                Arc::clone(&pool),
                emu.clone(),
                Arc::clone(&streams),
                Arc::clone(&stop),
                Arc::clone(&total),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) << 17));
                let mut live: Vec<Option<(usize, usize, usize)>> = vec![None; LIVE_PER_THREAD];
                let mut n: u64 = 0;
                let handoff = match emu.create_event() {
                    Ok(e) => e,
                    Err(e) => fail(&e.to_string()),
                };
                let sink = &streams[streams.len() - 1];
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let si = match mode {
                            Streams::Fixed => t % streams.len(),
                            Streams::Rotating => (t + (n / 256) as usize) % streams.len(),
                            Streams::Sink => t,
                        };
                        let slot = (n as usize) % LIVE_PER_THREAD;
                        if let Some((addr, size, on)) = live[slot].take() {
                            if let Streams::Sink = mode {
                                // The caller's duty: order the freeing stream after the use.
                                let ordered = emu
                                    .record(&handoff, &streams[on])
                                    .and_then(|()| emu.wait(sink, &handoff));
                                if let Err(e) = ordered {
                                    fail(&e.to_string());
                                }
                                pool.free(addr, size, sink);
                                emu.advance(sink, 1);
                            } else {
                                pool.free(addr, size, &streams[on]);
                            }
                        }
                        let size = SIZES[(rng.next() % SIZES.len() as u64) as usize];
                        let addr = pool.alloc(size, &streams[si]);
                        if let Streams::Rotating | Streams::Sink = mode {
                            emu.launch(&streams[si], addr, size);
                            emu.advance(&streams[si], 1);
                        }
                        live[slot] = Some((addr, size, si));
                        n += 1;
                    }
                }
                for (addr, size, on) in live.into_iter().flatten() {
                    pool.free(addr, size, &streams[on]);
                }
                drop(handoff);
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    for h in handles {
        if h.join().is_err() {
            fail("a benchmark thread panicked");
        }
    }
    (total.load(Ordering::Relaxed), elapsed)
}

type FerrioPool = PoolResource<HostUpstream, EmulatedStreams>;

fn ferrio_pool(emu: &EmulatedStreams, policy: EventPolicy) -> Arc<FerrioPool> {
    let options = PoolOptions::default()
        .grow_bytes(GROW_BYTES)
        .event_policy(policy);
    match PoolResource::new(HostUpstream, emu.clone(), options) {
        Ok(p) => Arc::new(p),
        Err(e) => fail(&e.to_string()),
    }
}

struct Args {
    threads: Vec<usize>,
    seconds: f64,
    events: bool,
    call_cost_ns: u64,
}

fn parse_args() -> Args {
    let mut args = Args {
        threads: vec![1, 4, 16],
        seconds: 0.5,
        events: false,
        call_cost_ns: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .unwrap_or_else(|| fail(&format!("{name} needs a value")))
        };
        match a.as_str() {
            "--threads" => {
                args.threads = value("--threads")
                    .split(',')
                    .map(|t| t.parse().unwrap_or_else(|_| fail("--threads: e.g. 1,4,16")))
                    .collect()
            }
            "--seconds" => {
                args.seconds = value("--seconds")
                    .parse()
                    .unwrap_or_else(|_| fail("--seconds: a number"))
            }
            "--call-cost-ns" => {
                args.call_cost_ns = value("--call-cost-ns")
                    .parse()
                    .unwrap_or_else(|_| fail("--call-cost-ns: an integer"))
            }
            "--events" => args.events = true,
            other => fail(&format!(
                "unknown argument {other:?}; use --threads 1,4,16 --seconds 0.5 --events --call-cost-ns N"
            )),
        }
    }
    args
}

fn main() {
    let args = parse_args();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if args.events {
        events(&args, cores);
    } else {
        contention(&args, cores);
    }
}

fn contention(args: &Args, cores: usize) {
    println!(
        "# contention: {cores} cores, {:.2} s per run, {LIVE_PER_THREAD} live blocks per thread, sizes 256 B..256 KiB",
        args.seconds
    );
    println!(
        "{:<14} {:>7} {:>7} {:>14} {:>10}",
        "pool", "threads", "streams", "allocs/s", "speedup"
    );
    for &threads in &args.threads {
        let mut stream_counts = vec![1, threads];
        stream_counts.dedup();
        for streams in stream_counts {
            let emu = EmulatedStreams::for_benchmarks(Duration::ZERO);
            let (n, s) = run(
                Arc::new(MutexPool {
                    inner: Mutex::new(MutexInner::default()),
                }),
                &emu,
                threads,
                streams,
                Streams::Fixed,
                args.seconds,
            );
            let base = n as f64 / s;
            println!(
                "{:<14} {threads:>7} {streams:>7} {base:>14.0} {:>10}",
                "single-mutex", "1.00x"
            );
            let pool = ferrio_pool(&emu, EventPolicy::OnSteal);
            let (n, s) = run(
                Arc::clone(&pool) as Arc<dyn BenchPool>,
                &emu,
                threads,
                streams,
                Streams::Fixed,
                args.seconds,
            );
            let rate = n as f64 / s;
            let stats = pool.stats();
            let steals: u64 = stats.streams.iter().map(|s| s.steals).sum();
            println!(
                "{:<14} {threads:>7} {streams:>7} {rate:>14.0} {:>9.2}x   ({:.2} steals/k, {} MiB pool)",
                "ferrio",
                rate / base,
                steals as f64 * 1000.0 / n.max(1) as f64,
                stats.pool_bytes >> 20,
            );
        }
    }
}

fn events(args: &Args, cores: usize) {
    println!(
        "# event policies: {cores} cores, {:.2} s per run, emulated call cost {} ns; pool-made \
         driver calls per 1000 allocations",
        args.seconds, args.call_cost_ns
    );
    println!(
        "{:<9} {:<16} {:>7} {:>12} {:>9} {:>9} {:>9} {:>9}",
        "workload",
        "policy",
        "threads",
        "allocs/s",
        "steals/k",
        "records/k",
        "queries/k",
        "waits/k"
    );
    let policies = [
        ("every-free", EventPolicy::EveryFree),
        (
            "every-16th-free",
            EventPolicy::EveryNthFree(NonZeroU32::new(16).unwrap_or(NonZeroU32::MIN)),
        ),
        ("on-steal", EventPolicy::OnSteal),
    ];
    for (workload, mode) in [("rotating", Streams::Rotating), ("sink", Streams::Sink)] {
        for &threads in &args.threads {
            for (name, policy) in policies {
                let emu = EmulatedStreams::for_benchmarks(Duration::from_nanos(args.call_cost_ns));
                let pool = ferrio_pool(&emu, policy);
                let streams = match mode {
                    Streams::Sink => threads + 1,
                    _ => threads.max(2),
                };
                let (n, s) = run(
                    Arc::clone(&pool) as Arc<dyn BenchPool>,
                    &emu,
                    threads,
                    streams,
                    mode,
                    args.seconds,
                );
                let stats = pool.stats();
                let sum = |f: fn(&ferrio::memory::StreamStats) -> u64| -> u64 {
                    stats.streams.iter().map(f).sum()
                };
                let per_k = |x: u64| x as f64 * 1000.0 / n.max(1) as f64;
                println!(
                    "{workload:<9} {name:<16} {threads:>7} {:>12.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                    n as f64 / s,
                    per_k(sum(|s| s.steals)),
                    per_k(sum(|s| s.records)),
                    per_k(emu.calls().queries),
                    per_k(sum(|s| s.waits)),
                );
            }
        }
    }
}
