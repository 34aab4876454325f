//! ferrio moves file bytes into and out of host and GPU memory as fast as the hardware allows.
//!
//! A [`File`] splits each read or write into tasks ([`Settings::task_size`], 4 MiB by default)
//! that run in parallel on the worker pool of the file's block device and complete one
//! [`IoFuture`]. Each task chooses between the page cache and `O_DIRECT` by itself
//! ([`policy`]): hot data is served from memory; cold data stays in the page cache when the file
//! fits in memory ([`CacheMode`]), so the next read is fast, and skips it when it does not.
//!
//! ```no_run
//! # fn main() -> ferrio::Result<()> {
//! let file = ferrio::File::open("/data/weights.bin", "r")?;
//! let mut buf = vec![0u8; file.len()? as usize];
//! let n = file.read_at(&mut buf, 0)?;          // parallel, blocking
//! let fut = file.pread(vec![0u8; 1 << 20], 0);  // parallel, returns at once
//! let (result, buf) = fut.into_buffer();
//! # let _ = (n, result, buf);
//! # Ok(()) }
//! ```
#![deny(rustdoc::broken_intra_doc_links)]

/// Declares modules that are private to the crate, and public (hidden from the docs) when the
/// `testing` feature is on: the integration tests, examples and benchmarks turn it on to reach
/// the planner, the syscall layer, the bounce ring and the emulated GPU. Users never need it.
macro_rules! internal_modules {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        #[doc(hidden)]
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        mod $name;
    )*};
}

internal_modules!(bounce, buffer, direct, file, plan, pool, sys);

pub mod blockdev;
pub mod config;
pub mod copy;
pub mod cuda;
pub mod error;
pub mod memory;
pub mod pagecache;
pub mod policy;
pub mod remote;
pub mod safetensors;
pub mod topology;

pub use bounce::prepare_pinned_soon;
pub use buffer::{AlignedBuf, IoBuf, IoBufMut};
pub use config::{CacheMode, DirectMode, FillReads, PinnedMemory, Settings};
pub use copy::{copy, CopyError, CopyMethod, CopyOptions, CopyProgress, CopyReport, DeviceTraffic};
pub use direct::DirectSupport;
pub use error::{Error, Op, Result};
pub use file::{local_path, stats, File, Mode, OpenOptions};
pub use pool::{wait_all, IoFuture, PoolStats};
pub use remote::{RemoteFile, RemoteWriter};
