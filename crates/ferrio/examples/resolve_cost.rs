//! Prints what resolving a file to its block devices costs, through the cache and without it.
//!
//! ```text
//! cargo run --release -p ferrio --example resolve_cost -- [PATH ...]
//! ```
//!
//! With no paths it measures this example's own executable. Timings are printed, never checked:
//! they go into `benchmarks/` with the machine and the command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ferrio::blockdev::Resolver;

const CACHED_CALLS: u32 = 200_000;
const UNCACHED_CALLS: u32 = 2_000;

fn per_call(total: Duration, calls: u32) -> String {
    let nanos = total.as_nanos() / u128::from(calls);
    if nanos >= 10_000 {
        format!("{:.1} µs", nanos as f64 / 1000.0)
    } else {
        format!("{nanos} ns")
    }
}

fn measure(path: &Path) -> ferrio::Result<()> {
    // A resolver of its own, so the first call really walks sysfs.
    let resolver = Resolver::new(ferrio::blockdev::SYSFS_ROOT, ferrio::blockdev::MOUNTINFO);

    let start = Instant::now();
    let chain = resolver.resolve(path)?;
    let first = start.elapsed();
    println!("{chain}");

    let start = Instant::now();
    for _ in 0..UNCACHED_CALLS {
        std::hint::black_box(resolver.resolve_uncached(std::hint::black_box(path))?);
    }
    let uncached = start.elapsed();

    let start = Instant::now();
    for _ in 0..CACHED_CALLS {
        std::hint::black_box(resolver.resolve(std::hint::black_box(path))?);
    }
    let cached = start.elapsed();

    println!(
        "  first (cold) {:>10}   uncached {:>10}/call ({UNCACHED_CALLS} calls)   \
         cached {:>10}/call ({CACHED_CALLS} calls)",
        per_call(first, 1),
        per_call(uncached, UNCACHED_CALLS),
        per_call(cached, CACHED_CALLS),
    );
    Ok(())
}

fn main() -> ExitCode {
    let mut paths: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        match std::env::current_exe() {
            Ok(exe) => paths.push(exe),
            Err(e) => {
                eprintln!("error: cannot find this executable: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut status = ExitCode::SUCCESS;
    for path in &paths {
        if let Err(e) = measure(path) {
            eprintln!("error: {e}");
            status = ExitCode::FAILURE;
        }
    }
    status
}
