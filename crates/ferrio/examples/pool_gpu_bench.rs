//! Host-side contention on a real GPU: ferrio's pool (CUDA streams, device memory from
//! `cuMemAlloc`) against the driver's stream-ordered pool (`cuMemAllocAsync`/`cuMemFreeAsync`),
//! T threads × S streams doing allocate/free pairs.
//!
//! Each thread keeps 16 live blocks of 256 B to 256 KiB and replaces one per step, on stream
//! `t % S` (`--rotate`: on stream `(t + n / 256) % S`, so blocks freed on one stream are
//! wanted on another and the pool's events and device waits come into play). No kernels: this
//! measures what each allocate/free pair costs the host. RMM's pool is compared from C++ by
//! `benchmarks/memory_pool/pool_bench.cpp`, which drives ferrio through `examples/pool_capi.rs`.
//!
//! ```text
//! cargo build --release -p ferrio --example pool_gpu_bench
//! pool_gpu_bench [--seconds 0.3] [--threads 1,4,16] [--streams 1,4,16] [--rotate] [--json PATH]
//! ```

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ferrio::memory::{
    CudaStreams, DeviceUpstream, DriverPool, PoolOptions, PoolResource, StreamHandle,
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
/// What the warm pools start with (the same in `pool_bench.cpp`).
const INITIAL_BYTES: usize = 256 << 20;

fn fail(msg: &str) -> ! {
    eprintln!("pool_gpu_bench: {msg}");
    std::process::exit(1)
}

/// What the benchmark needs of an allocator.
trait BenchAlloc: Send + Sync {
    fn alloc(&self, size: usize, stream: &StreamHandle) -> usize;
    fn free(&self, addr: usize, size: usize, stream: &StreamHandle);
    /// Called once a run's streams are done with.
    fn forget(&self, _stream: &StreamHandle) {}
}

impl BenchAlloc for PoolResource<DeviceUpstream, CudaStreams> {
    fn alloc(&self, size: usize, stream: &StreamHandle) -> usize {
        match self.allocate(size, stream) {
            Ok(b) => b.addr(),
            Err(e) => fail(&format!("ferrio allocate: {e}")),
        }
    }
    fn free(&self, addr: usize, size: usize, stream: &StreamHandle) {
        if let Err(e) = self.deallocate(addr, size, stream) {
            fail(&format!("ferrio deallocate: {e}"))
        }
    }
    fn forget(&self, stream: &StreamHandle) {
        if let Err(e) = self.detach_stream(stream) {
            fail(&format!("ferrio detach: {e}"))
        }
    }
}

impl BenchAlloc for DriverPool {
    fn alloc(&self, size: usize, stream: &StreamHandle) -> usize {
        match self.allocate(size, stream) {
            Ok(addr) => addr,
            Err(e) => fail(&format!("cuMemAllocAsync: {e}")),
        }
    }
    fn free(&self, addr: usize, _size: usize, stream: &StreamHandle) {
        // SAFETY: `addr` came from `alloc` on this pool and is freed once; no work uses it.
        if let Err(e) = unsafe { self.deallocate(addr, stream) } {
            fail(&format!("cuMemFreeAsync: {e}"))
        }
    }
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Allocate/free pairs per second of `threads` threads on `streams` fresh streams.
fn run(
    alloc: &Arc<dyn BenchAlloc>,
    cuda: CudaStreams,
    threads: usize,
    streams: usize,
    rotate: bool,
    seconds: f64,
) -> f64 {
    let streams: Arc<Vec<StreamHandle>> = Arc::new(
        (0..streams)
            .map(|_| {
                cuda.create_stream()
                    .unwrap_or_else(|e| fail(&e.to_string()))
            })
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (alloc, streams, stop, total, start) = (
                Arc::clone(alloc),
                Arc::clone(&streams),
                Arc::clone(&stop),
                Arc::clone(&total),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) << 17);
                let mut live: [Option<(usize, usize, usize)>; LIVE_PER_THREAD] =
                    [None; LIVE_PER_THREAD];
                let mut n: u64 = 0;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let si = if rotate {
                            (t + (n / 256) as usize) % streams.len()
                        } else {
                            t % streams.len()
                        };
                        let slot = (n as usize) % LIVE_PER_THREAD;
                        if let Some((addr, size, on)) = live[slot].take() {
                            alloc.free(addr, size, &streams[on]);
                        }
                        let size = SIZES[(next(&mut rng) % SIZES.len() as u64) as usize];
                        live[slot] = Some((alloc.alloc(size, &streams[si]), size, si));
                        n += 1;
                    }
                }
                for (addr, size, on) in live.into_iter().flatten() {
                    alloc.free(addr, size, &streams[on]);
                }
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        if h.join().is_err() {
            fail("a benchmark thread panicked");
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    for s in streams.iter() {
        if let Err(e) = cuda.synchronize(s) {
            fail(&e.to_string());
        }
        alloc.forget(s);
    }
    total.load(Ordering::Relaxed) as f64 / secs
}

fn list(s: &str) -> Vec<usize> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| fail(&format!("not a number: {x:?}")))
        })
        .collect()
}

fn main() {
    let mut seconds = 0.3;
    let mut threads = vec![1, 4, 16];
    let mut streams = vec![1, 4, 16];
    let mut rotate = false;
    let mut json_path = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--seconds" => {
                seconds = value()
                    .parse()
                    .unwrap_or_else(|_| fail("--seconds: not a number"))
            }
            "--threads" => threads = list(&value()),
            "--streams" => streams = list(&value()),
            "--rotate" => rotate = true,
            "--json" => json_path = Some(value()),
            _ => fail(
                "usage: pool_gpu_bench [--seconds 0.3] [--threads 1,4,16] [--streams 1,4,16] \
                 [--rotate] [--json PATH]",
            ),
        }
    }
    let cuda = CudaStreams::for_device(0).unwrap_or_else(|e| fail(&e.to_string()));
    let info = ferrio::cuda::driver_info().unwrap_or_else(|e| fail(&e.to_string()));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let ferrio_pool = PoolResource::new(
        DeviceUpstream::new(cuda.context()).unwrap_or_else(|e| fail(&e.to_string())),
        cuda,
        PoolOptions::default().initial_bytes(INITIAL_BYTES),
    )
    .unwrap_or_else(|e| fail(&e.to_string()));
    let driver_pool = DriverPool::new(cuda.context()).unwrap_or_else(|e| fail(&e.to_string()));
    let allocators: [(&str, Arc<dyn BenchAlloc>); 2] = [
        ("ferrio", Arc::new(ferrio_pool)),
        ("cuMemAllocAsync", Arc::new(driver_pool)),
    ];
    let mut json =
        json_path.map(|p| std::fs::File::create(&p).unwrap_or_else(|e| fail(&format!("{p}: {e}"))));
    println!(
        "# contention on the GPU (driver API {}, {cores} cores): {seconds:.2} s per run, \
         {LIVE_PER_THREAD} live blocks per thread, sizes 256 B..256 KiB, streams {}",
        info.version,
        if rotate { "rotating" } else { "fixed: t % S" }
    );
    println!(
        "{:<16} {:>7} {:>7} {:>14} {:>9}",
        "allocator", "threads", "streams", "pairs/s", "vs async"
    );
    let mut async_rate = std::collections::HashMap::new();
    // The driver's pool first, so ferrio's rows can show the ratio.
    for (name, alloc) in allocators.iter().rev() {
        // Warm up: first use of the pool, the driver's per-thread state, page mappings.
        run(alloc, cuda, 1, 1, false, 0.05);
        for &t in &threads {
            for &s in &streams {
                let rate = run(alloc, cuda, t, s, rotate, seconds);
                let ratio = match async_rate.get(&(t, s)) {
                    Some(base) => format!("{:.2}x", rate / base),
                    None => {
                        async_rate.insert((t, s), rate);
                        "1.00x".to_string()
                    }
                };
                println!("{name:<16} {t:>7} {s:>7} {rate:>14.0} {ratio:>9}");
                if let Some(f) = json.as_mut() {
                    let line = format!(
                        "{{\"scenario\":\"contention-rust\",\"allocator\":\"{name}\",\
                         \"threads\":{t},\"streams\":{s},\"rotate\":{rotate},\
                         \"seconds\":{seconds},\"pairs_per_s\":{rate:.0}}}"
                    );
                    if let Err(e) = writeln!(f, "{line}") {
                        fail(&e.to_string());
                    }
                }
            }
        }
    }
}
