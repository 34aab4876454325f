//! Settings: every knob ferrio has, its `FERRIO_*` variable, unit, default and parser.
//!
//! There is one [`Settings`] value in force per thread: the process-wide one ([`Settings::global`],
//! read from the environment on first use, changed with [`Settings::set_global`]) unless the
//! thread has pushed a scoped override with [`Settings::scope`]. An operation takes a snapshot
//! of the settings when it is issued, so changing them never affects I/O already under way.
//!
//! [`SETTINGS`] is the one table of settings: name, variable, unit, default, doc and parser of
//! each. Getting, setting, the environment, the defaults, Python's `ferrio.config`, the CLI's
//! help and the README's settings table (checked by a test) all follow from it.
//!
//! Human sizes (`4MiB`, `16M`, `2GiB`) are parsed here and nowhere else ([`parse_size`]).

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use crate::error::{Error, Result};

/// A setting whose value is one of a few names: the enum, with `FORMS` (the accepted spellings,
/// for error messages), `as_str` (the canonical name: each variant's first spelling),
/// `Display`, and `FromStr` (any spelling, trimmed, in any case).
macro_rules! named_values {
    (
        $(#[$meta:meta])*
        pub enum $name:ident, forms $forms:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $canon:literal $(| $alias:literal)*, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// The accepted spellings, for error messages.
            pub const FORMS: &'static str = $forms;

            /// The canonical name of this value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $canon, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ();
            fn from_str(s: &str) -> std::result::Result<Self, ()> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $( $canon $(| $alias)* => Ok($name::$variant), )+
                    _ => Err(()),
                }
            }
        }
    };
}

named_values! {
    /// When to bypass the page cache with `O_DIRECT`.
    pub enum DirectMode, forms "off|on|auto (also false/true, 0/1, no/yes)" {
        /// Always through the page cache.
        Off = "off" | "false" | "0" | "no",
        /// `O_DIRECT` for every aligned byte (falls back to buffered where the file system
        /// refuses it).
        On = "on" | "true" | "1" | "yes",
        /// Per task: buffered when the range is mostly in the page cache, `O_DIRECT` when it is
        /// cold.
        Auto = "auto",
    }
}

named_values! {
    /// What the page cache should hold after ferrio read or wrote a file (see
    /// [`crate::policy`]).
    pub enum CacheMode, forms "auto|keep|bypass" {
        /// The data ends up in the page cache (cold ranges are read and written through it).
        Keep = "keep",
        /// Data that was not cached before is not cached after (cold ranges bypass the page
        /// cache).
        Bypass = "bypass",
        /// Reads: `keep` for a file that fits comfortably in available memory, `bypass` for one
        /// that does not, so that a stream larger than memory does not evict everything else.
        /// Writes: through the page cache (kept) up to a limit where the device measured that
        /// faster, else `bypass` (see [`crate::policy`]).
        Auto = "auto",
    }
}

impl CacheMode {
    /// The mode for a file whose writes the caller flushes to the device ([`crate::File::sync`])
    /// before it relies on them: `auto` becomes `bypass`, since buffered writes and then a flush
    /// took longer than direct writes on every machine measured (benchmarks/RESULTS.md); an
    /// explicit `keep` or `bypass` stays.
    pub fn for_synced_writes(self) -> CacheMode {
        match self {
            CacheMode::Auto => CacheMode::Bypass,
            other => other,
        }
    }
}

named_values! {
    /// How the pinned bounce buffers for GPU transfers are made.
    pub enum PinnedMemory, forms "mapped|driver" {
        /// ferrio maps the memory itself, where that pins faster or places it better, and
        /// registers it with the driver (`cuMemHostRegister`): buffers of at least 2 MiB in
        /// transparent huge pages, and on a machine of several NUMA nodes every buffer, on the
        /// GPU's node. Other buffers, and all of them once the driver refuses to register, as
        /// `Driver`.
        Mapped = "mapped",
        /// The driver allocates it (`cuMemHostAlloc`), wherever it likes.
        Driver = "driver",
    }
}

named_values! {
    /// How a cold read that keeps the file asks the disk for it (see `fill_in_flight`).
    pub enum FillReads, forms "auto|readahead|populate" {
        /// `Populate` (a file the kernel cannot map for it fills through readahead): the cache
        /// then holds huge folios, which read back from it faster
        /// ([`crate::policy::fill_reads_here`] says what was measured).
        Auto = "auto",
        /// Plain buffered reads: the kernel's readahead decides how much is in flight (up to a
        /// window or two of the disk's `read_ahead_kb` per task).
        Readahead = "readahead",
        /// Each task has the kernel read the next 2 MiB block into the page cache
        /// (`MADV_POPULATE_READ` on a huge-page mapping) before copying it out, so exactly one
        /// read per task is in flight and the cache holds huge folios. Where the kernel cannot,
        /// as `Readahead`.
        Populate = "populate",
    }
}

/// All of ferrio's knobs. Construct with [`Settings::default`], [`Settings::from_env`] or
/// [`Settings::current`], change fields directly or by name with [`Settings::set`].
///
/// Each field's variable, unit, default and parser are in its [`SETTINGS`] entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// Bytes per task: a request is split into tasks of this size that run in parallel.
    pub task_size: u64,
    /// Worker threads per device pool; 0 picks by device kind.
    pub threads_per_device: usize,
    /// Threads for named pools, overriding `threads_per_device`: `nvme0=16,loop3=2`.
    pub device_threads: Vec<(String, usize)>,
    /// Cap on I/O worker threads across all pools.
    pub max_threads: usize,
    /// One worker pool per block device (true) or one pool for everything (false).
    pub per_device_pools: bool,
    /// What the page cache holds after a read or write; decides the mechanism when the
    /// matching `direct_*` setting is `auto`.
    pub cache: CacheMode,
    /// `O_DIRECT` policy for reads.
    pub direct_read: DirectMode,
    /// `O_DIRECT` policy for writes.
    pub direct_write: DirectMode,
    /// Read unaligned heads and tails with `O_DIRECT` too, into aligned scratch memory.
    pub direct_overread: bool,
    /// Bytes per pinned bounce buffer for GPU transfers, and per pinned piece of a remote read
    /// into GPU memory; 0 (the default): by host, see [`Settings::bounce_buffer_bytes`].
    pub bounce_buffer_size: u64,
    /// Tasks in flight per request when a cold read fills the page cache (see `cache` and
    /// `fill_task_size`).
    pub fill_in_flight: usize,
    /// Bytes per task when a cold read fills the page cache; shorter cold reads are planned
    /// as usual.
    pub fill_task_size: u64,
    /// How those tasks read: through the kernel's readahead or block by block.
    pub fill_reads: FillReads,
    /// Pinned bounce buffers per worker (the ring's depth).
    pub bounce_buffers: usize,
    /// Cap on pinned host memory held by all bounce rings and by the pinned pieces of remote
    /// reads into GPU memory.
    pub pinned_limit: u64,
    /// How the bounce rings' pinned memory is made.
    pub pinned_memory: PinnedMemory,
    /// Fault in one GPU's worth of ring memory ahead, in the background, where a GPU read may
    /// come (see [`crate::prepare_pinned_soon`]).
    pub pinned_ahead: bool,
    /// Rings that may get fresh pinned memory at once (0: any number).
    pub pinning_threads: usize,
    /// Bytes per ranged GET when reading a remote object: the shortest ones of a large object.
    pub remote_range_size: u64,
    /// Longest ranged GET of a large remote object (its first ones).
    pub remote_max_range_size: u64,
    /// Ranged GETs in flight per remote store (all objects of one bucket or server share them).
    pub remote_concurrency: usize,
    /// Longest wait for a connection to a remote store.
    pub remote_connect_timeout: Duration,
    /// Longest time one request to a remote store may take, its body included.
    pub remote_timeout: Duration,
    /// Retries of one failed request (429, 5xx, dropped connection) before the read fails.
    pub remote_retries: usize,
    /// Longest time one request may spend being retried, waits included.
    pub remote_retry_timeout: Duration,
    /// Bytes of tensors a safetensors `safe_open` reads ahead of `get_tensor` calls that come
    /// in file or `keys()` order (Python's `ferrio.safetensors`); 0: none.
    pub tensor_read_ahead: u64,
    /// Pinned host memory that the torch host tensors of a safetensors `safe_open` may hold
    /// at once, in a process that already uses CUDA and whose loop lets tensors go (Python's
    /// `ferrio.safetensors`); 0: never pinned.
    pub pinned_tensor_limit: u64,
}

impl Default for Settings {
    /// The defaults of [`SETTINGS`]: each entry's parser applied to its default text, so the
    /// table is the one place a default is written.
    fn default() -> Self {
        // Placeholders only: every field is overwritten from its table entry below.
        let mut s = Settings {
            task_size: 0,
            threads_per_device: 0,
            device_threads: Vec::new(),
            max_threads: 0,
            per_device_pools: false,
            cache: CacheMode::Auto,
            direct_read: DirectMode::Off,
            direct_write: DirectMode::Off,
            direct_overread: false,
            bounce_buffer_size: 0,
            bounce_buffers: 0,
            fill_in_flight: 0,
            fill_task_size: 0,
            fill_reads: FillReads::Auto,
            pinned_limit: 0,
            pinned_memory: PinnedMemory::Driver,
            pinned_ahead: false,
            pinning_threads: 0,
            remote_range_size: 0,
            remote_max_range_size: 0,
            remote_concurrency: 0,
            remote_connect_timeout: Duration::ZERO,
            remote_timeout: Duration::ZERO,
            remote_retries: 0,
            remote_retry_timeout: Duration::ZERO,
            tensor_read_ahead: 0,
            pinned_tensor_limit: 0,
        };
        for info in SETTINGS {
            let parsed = (info.set)(&mut s, info.default);
            // A default the table's own parser refuses is a bug in the table; the
            // `defaults_come_from_the_table` test catches it.
            debug_assert!(parsed.is_ok(), "bad default for {}", info.name);
        }
        s
    }
}

/// One setting: its name, variable, unit, default, meaning, and how to read and parse it.
///
/// [`SETTINGS`] holds one per field of [`Settings`]; [`Settings::get`], [`Settings::set`],
/// [`Settings::from_env`], [`Settings::default`], Python's `ferrio.config`, the CLI's help and
/// the README test all read this table.
#[derive(Debug, Clone, Copy)]
pub struct SettingInfo {
    /// Name used by [`Settings::get`]/[`Settings::set`] and by Python's `ferrio.config`.
    pub name: &'static str,
    /// The environment variable.
    pub env: &'static str,
    /// Unit or kind of value.
    pub unit: &'static str,
    /// The default, as text the variable accepts (empty for an empty list).
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
    /// The value of this setting as text the parser accepts back.
    get: fn(&Settings) -> String,
    /// Parses text into this setting, or returns the accepted forms and changes nothing.
    set: fn(&mut Settings, &str) -> std::result::Result<(), &'static str>,
}

/// Every setting, in the order the README lists them. Adding a setting is a field of
/// [`Settings`] and one entry here.
pub const SETTINGS: &[SettingInfo] = &[
    SettingInfo {
        name: "task_size",
        env: "FERRIO_TASK_SIZE",
        unit: "bytes",
        default: "4 MiB",
        doc: "a request is split into tasks of this size that run on the pool's threads",
        get: |s| s.task_size.to_string(),
        set: |s, v| {
            // One task per page at most: 1-byte tasks would plan (and hold) 24 bytes of task
            // per byte read.
            s.task_size = size(v, 4096, "a size of at least 4 KiB")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "threads_per_device",
        env: "FERRIO_THREADS_PER_DEVICE",
        unit: "threads (0 = by device kind)",
        default: "0",
        doc: "worker threads of each device's pool",
        get: |s| s.threads_per_device.to_string(),
        set: |s, v| {
            s.threads_per_device = count(v, 0, COUNT_FORMS)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "device_threads",
        env: "FERRIO_DEVICE_THREADS",
        unit: "NAME=N[,NAME=N...] (pool names as `ferrio info` shows them)",
        default: "",
        doc: "threads for named pools, overriding threads_per_device",
        get: |s| {
            let items: Vec<String> = s
                .device_threads
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            items.join(",")
        },
        set: |s, v| {
            s.device_threads = pool_threads(v)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "max_threads",
        env: "FERRIO_MAX_THREADS",
        unit: "threads",
        default: "64",
        doc: "cap on I/O threads across all pools (each pool keeps at least one)",
        get: |s| s.max_threads.to_string(),
        set: |s, v| {
            s.max_threads = count(v, 1, "at least 1 thread")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "per_device_pools",
        env: "FERRIO_PER_DEVICE_POOLS",
        unit: "on/off",
        default: "on",
        doc: "one pool per block device; off = one global pool",
        get: |s| on_off(s.per_device_pools).to_string(),
        set: |s, v| {
            s.per_device_pools = flag(v)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "cache",
        env: "FERRIO_CACHE",
        unit: "auto/keep/bypass",
        default: "auto",
        doc: "page cache after I/O: keep = data stays cached, bypass = cold data is not cached, \
              auto = reads keep a file of at most half the available memory, else bypass; \
              writes keep up to that or the dirty limit where the device measured buffered \
              writes faster, else bypass",
        get: |s| s.cache.to_string(),
        set: |s, v| {
            s.cache = v.parse().map_err(|_| CacheMode::FORMS)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "fill_in_flight",
        env: "FERRIO_FILL_IN_FLIGHT",
        unit: "tasks",
        default: "4",
        doc: "tasks in flight per request when a cold read fills the page cache \
              (under fill_reads=populate, the reads in flight on the disk)",
        get: |s| s.fill_in_flight.to_string(),
        set: |s, v| {
            s.fill_in_flight = count(v, 1, "at least 1 task")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "fill_task_size",
        env: "FERRIO_FILL_TASK_SIZE",
        unit: "bytes",
        default: "64 MiB",
        doc: "bytes per task when a cold read fills the page cache, each read front to back; \
              a shorter cold read is planned as usual",
        get: |s| s.fill_task_size.to_string(),
        set: |s, v| {
            s.fill_task_size = size(v, 4096, "a size of at least 4 KiB")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "fill_reads",
        env: "FERRIO_FILL_READS",
        unit: "auto/readahead/populate",
        default: "auto",
        doc: "how the tasks of a cold read that fills the page cache read: readahead = buffered \
              reads, the kernel's readahead sets the depth; populate = one 2 MiB block per task \
              at a time, read into huge folios; auto = populate",
        get: |s| s.fill_reads.to_string(),
        set: |s, v| {
            s.fill_reads = v.parse().map_err(|_| FillReads::FORMS)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "direct_read",
        env: "FERRIO_DIRECT_READ",
        unit: "off/on/auto",
        default: "auto",
        doc: "O_DIRECT for reads; on/off force the mechanism, auto = as `cache` decides",
        get: |s| s.direct_read.to_string(),
        set: |s, v| {
            s.direct_read = mode(v)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "direct_write",
        env: "FERRIO_DIRECT_WRITE",
        unit: "off/on/auto",
        default: "auto",
        doc: "O_DIRECT for writes; on/off force the mechanism, auto = as `cache` decides",
        get: |s| s.direct_write.to_string(),
        set: |s, v| {
            s.direct_write = mode(v)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "direct_overread",
        env: "FERRIO_DIRECT_OVERREAD",
        unit: "on/off",
        default: "off",
        doc: "read unaligned heads/tails with O_DIRECT into aligned scratch too",
        get: |s| on_off(s.direct_overread).to_string(),
        set: |s, v| {
            s.direct_overread = flag(v)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "bounce_buffer_size",
        env: "FERRIO_BOUNCE_BUFFER_SIZE",
        unit: "bytes (0 = by host)",
        default: "0",
        doc: "size of each pinned bounce buffer for GPU transfers (and of each pinned piece a \
              remote read into GPU memory lands in); 0: 4 MiB on a host with one GPU, 2 MiB on \
              a host with several",
        get: |s| s.bounce_buffer_size.to_string(),
        set: |s, v| {
            s.bounce_buffer_size = match v.trim() {
                "0" => 0,
                _ => size(v, 4096, "0 (by host) or at least 4KiB")?,
            };
            Ok(())
        },
    },
    SettingInfo {
        name: "bounce_buffers",
        env: "FERRIO_BOUNCE_BUFFERS",
        unit: "buffers per worker",
        default: "2",
        doc: "depth of each worker's pinned bounce-buffer ring",
        get: |s| s.bounce_buffers.to_string(),
        set: |s, v| {
            s.bounce_buffers = count(v, 1, "at least 1 buffer")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "pinned_limit",
        env: "FERRIO_PINNED_LIMIT",
        unit: "bytes",
        default: "1 GiB",
        doc: "cap on pinned host memory held by all bounce rings and by the pinned pieces of \
              remote reads into GPU memory",
        get: |s| s.pinned_limit.to_string(),
        set: |s, v| {
            s.pinned_limit = size(v, 0, SIZE_FORMS)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "pinned_memory",
        env: "FERRIO_PINNED_MEMORY",
        unit: "mapped/driver",
        default: "mapped",
        doc: "how bounce buffers are pinned: mapped = ferrio maps them (huge pages, the GPU's \
              NUMA node) and registers them with the driver where that pays, driver = \
              cuMemHostAlloc",
        get: |s| s.pinned_memory.to_string(),
        set: |s, v| {
            s.pinned_memory = v.parse().map_err(|_| PinnedMemory::FORMS)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "pinned_ahead",
        env: "FERRIO_PINNED_AHEAD",
        unit: "on/off",
        default: "on",
        doc: "on a machine with an NVIDIA driver, fault in the memory of one GPU's bounce rings \
              on a background thread at `import ferrio` and when the CLI starts a GPU read \
              (not once the process has started CUDA), so that the first GPU read of a process \
              only has to pin it (pinned_memory=mapped)",
        get: |s| on_off(s.pinned_ahead).to_string(),
        set: |s, v| {
            s.pinned_ahead = flag(v)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "pinning_threads",
        env: "FERRIO_PINNING_THREADS",
        unit: "threads (0: no limit)",
        default: "2",
        doc: "how many workers may get a bounce buffer at once: fresh pinned memory comes at the \
              rate the kernel zeroes pages, so a few rings at a time start copying sooner than \
              all of them together",
        get: |s| s.pinning_threads.to_string(),
        set: |s, v| {
            s.pinning_threads = count(v, 0, "0 or more threads")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "remote_range_size",
        env: "FERRIO_REMOTE_RANGE_SIZE",
        unit: "bytes",
        default: "8 MiB",
        doc: "a read of a remote object (s3://, gs://, az://, http(s)://) is split into ranged \
              GETs of this size; an upload's parts are this size too (at least 5 MiB)",
        get: |s| s.remote_range_size.to_string(),
        set: |s, v| {
            s.remote_range_size = size(v, 4096, "at least 4KiB")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "remote_max_range_size",
        env: "FERRIO_REMOTE_MAX_RANGE_SIZE",
        unit: "bytes",
        default: "32 MiB",
        doc: "longest ranged GET of a large remote object: a read is split into even shares \
              among remote_concurrency GETs, each between remote_range_size and this, so each \
              GET's wait for its first byte is spread over more bytes; at or below \
              remote_range_size every GET is remote_range_size",
        get: |s| s.remote_max_range_size.to_string(),
        set: |s, v| {
            s.remote_max_range_size = size(v, 4096, "at least 4KiB")?;
            Ok(())
        },
    },
    SettingInfo {
        name: "remote_concurrency",
        env: "FERRIO_REMOTE_CONCURRENCY",
        unit: "requests (1 to 1024)",
        default: "64",
        doc: "ranged GETs in flight per remote store: all objects of one bucket, container or \
              server opened with the same value share this many",
        get: |s| s.remote_concurrency.to_string(),
        set: |s, v| {
            let n = count(v, 1, "at least 1 request")?;
            if n > MAX_REMOTE_CONCURRENCY {
                return Err("at most 1024 requests");
            }
            s.remote_concurrency = n;
            Ok(())
        },
    },
    SettingInfo {
        name: "remote_connect_timeout",
        env: "FERRIO_REMOTE_CONNECT_TIMEOUT",
        unit: "seconds (e.g. 5, 500ms, 2m)",
        default: "5s",
        doc: "longest wait for a connection to a remote store; then the request fails (and is \
              retried)",
        get: |s| format_duration(s.remote_connect_timeout),
        set: |s, v| {
            s.remote_connect_timeout = duration(v, true)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "remote_timeout",
        env: "FERRIO_REMOTE_TIMEOUT",
        unit: "seconds (e.g. 120, 90s, 2m)",
        default: "120s",
        doc: "longest time one request may take (a ranged GET, an upload's part), body \
              included; then it fails (and is retried), in the end with TimeoutError",
        get: |s| format_duration(s.remote_timeout),
        set: |s, v| {
            s.remote_timeout = duration(v, true)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "remote_retries",
        env: "FERRIO_REMOTE_RETRIES",
        unit: "count (0 to 100)",
        default: "5",
        doc: "times one failed request to a remote store (429, 5xx, dropped connection) is \
              retried, with backoff, before the read fails",
        get: |s| s.remote_retries.to_string(),
        set: |s, v| {
            let n = count(v, 0, "at least 0")?;
            if n > MAX_REMOTE_RETRIES {
                return Err("at most 100 retries");
            }
            s.remote_retries = n;
            Ok(())
        },
    },
    SettingInfo {
        name: "remote_retry_timeout",
        env: "FERRIO_REMOTE_RETRY_TIMEOUT",
        unit: "seconds (e.g. 60, 30s, 5m)",
        default: "60s",
        doc: "longest time one request may spend being retried, waits included; 0 retries no \
              request",
        get: |s| format_duration(s.remote_retry_timeout),
        set: |s, v| {
            s.remote_retry_timeout = duration(v, false)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "tensor_read_ahead",
        env: "FERRIO_TENSOR_READ_AHEAD",
        unit: "bytes (0 = none)",
        default: "1 GiB",
        doc: "tensors a safetensors safe_open reads ahead, in bytes, while its get_tensor calls \
              come in file or keys() order; each tensor still gets memory of its own",
        get: |s| s.tensor_read_ahead.to_string(),
        set: |s, v| {
            s.tensor_read_ahead = size(v, 0, SIZE_FORMS)?;
            Ok(())
        },
    },
    SettingInfo {
        name: "pinned_tensor_limit",
        env: "FERRIO_PINNED_TENSOR_LIMIT",
        unit: "bytes (0 = never)",
        default: "2 GiB",
        doc: "pinned host memory the torch host tensors of safe_open may hold at once, in a \
              process that already uses CUDA, once the caller lets tensors go, so that copying \
              each to a GPU runs at the link's rate",
        get: |s| s.pinned_tensor_limit.to_string(),
        set: |s, v| {
            s.pinned_tensor_limit = size(v, 0, SIZE_FORMS)?;
            Ok(())
        },
    },
];

/// Most retries of one remote request: past this a dead endpoint only takes longer to report.
const MAX_REMOTE_RETRIES: usize = 100;

/// Longest remote timeout accepted: a day; a larger value is a typo, not a wish.
const MAX_REMOTE_WAIT: Duration = Duration::from_secs(24 * 3600);

const DURATION_FORMS: &str =
    "a time such as 5, 5s, 500ms, 2m or 1h (whole numbers; a bare number is seconds; at most 24h)";

/// A time of at most a day; zero only if `positive` is false.
fn duration(v: &str, positive: bool) -> std::result::Result<Duration, &'static str> {
    let d = parse_duration(v).ok_or(DURATION_FORMS)?;
    if d > MAX_REMOTE_WAIT {
        return Err(DURATION_FORMS);
    }
    if positive && d.is_zero() {
        return Err("more than 0 (e.g. 5s or 500ms)");
    }
    Ok(d)
}

/// Parses a human time: `5` and `5s` (seconds), `500ms`, `2m`, `1h`. Case-insensitive; whole
/// numbers only.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    match unit.trim().to_ascii_lowercase().as_str() {
        "" | "s" | "sec" | "secs" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" | "min" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

/// A time as [`parse_duration`] reads it back: `5s`, or `500ms` below whole seconds.
fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Most ranged GETs in flight per remote store: more would only queue in the client.
const MAX_REMOTE_CONCURRENCY: usize = 1024;

const SIZE_FORMS: &str = "a byte count such as 4194304, 4MiB, 4M, 512KiB, 2GiB or 1G";
const COUNT_FORMS: &str = "a whole number such as 0, 4 or 16";
const DEVICE_THREADS_FORMS: &str =
    "NAME=N[,NAME=N...], a pool name and N >= 1, e.g. nvme0=16,loop3=2";
const BOOL_FORMS: &str = "on|off (also true/false, 1/0, yes/no)";

/// A human size of at least `min` bytes; `too_small` is the message for a smaller one.
fn size(v: &str, min: u64, too_small: &'static str) -> std::result::Result<u64, &'static str> {
    let n = parse_size(v).ok_or(SIZE_FORMS)?;
    if n < min {
        return Err(too_small);
    }
    if n > MAX_SIZE {
        return Err("at most 1024TiB");
    }
    Ok(n)
}

/// The largest size a setting takes (1 PiB, written 1024TiB): more than any machine's memory or
/// file, and far enough from `u64::MAX` that offsets plus a setting's size never overflow.
const MAX_SIZE: u64 = 1 << 50;

/// A whole number of at least `min`; `too_small` is the message for a smaller one.
fn count(v: &str, min: usize, too_small: &'static str) -> std::result::Result<usize, &'static str> {
    let n = v.trim().parse::<usize>().map_err(|_| COUNT_FORMS)?;
    if n < min {
        return Err(too_small);
    }
    Ok(n)
}

fn flag(v: &str) -> std::result::Result<bool, &'static str> {
    parse_bool(v).ok_or(BOOL_FORMS)
}

fn mode(v: &str) -> std::result::Result<DirectMode, &'static str> {
    v.parse::<DirectMode>().map_err(|_| DirectMode::FORMS)
}

/// `nvme0=16, loop3=2` as pool keys and thread counts of at least 1.
fn pool_threads(v: &str) -> std::result::Result<Vec<(String, usize)>, &'static str> {
    let mut map = Vec::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, n) = item.split_once('=').ok_or(DEVICE_THREADS_FORMS)?;
        let k = k.trim();
        if k.is_empty() {
            return Err(DEVICE_THREADS_FORMS);
        }
        let n = n.trim().parse::<usize>().ok().filter(|&n| n > 0);
        // Named twice: which count was meant cannot be told (the last one silently won).
        if map.iter().any(|(named, _)| named == k) {
            return Err("each pool named once: NAME=N[,NAME=N...], e.g. nvme0=16,loop3=2");
        }
        map.push((k.to_string(), n.ok_or(DEVICE_THREADS_FORMS)?));
    }
    Ok(map)
}

/// The setting called `name` (`task_size`) or whose variable is `name` (`FERRIO_TASK_SIZE`),
/// ignoring case.
pub fn setting(name: &str) -> Option<&'static SettingInfo> {
    let key = name.trim();
    SETTINGS
        .iter()
        .find(|i| i.name.eq_ignore_ascii_case(key) || i.env.eq_ignore_ascii_case(key))
}

/// `FERRIO_*` variables that name no setting and are still no mistake: `FERRIO_TRACE` (the
/// bounce rings' timing trace) and the project's own test and benchmark tools' prefixes.
const OTHER_VARIABLES: [&str; 3] = ["FERRIO_TRACE", "FERRIO_TEST_*", "FERRIO_BENCH_*"];

/// [`Settings::env_warnings`] for the variable names `names`, sorted.
fn unknown_variables(names: impl Iterator<Item = String>) -> Vec<String> {
    let known = |name: &str| {
        SETTINGS.iter().any(|i| i.env == name)
            || OTHER_VARIABLES.iter().any(|o| match o.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == *o,
            })
    };
    let mut unknown: Vec<String> = names
        .filter(|n| n.starts_with("FERRIO_") && !known(n))
        .collect();
    unknown.sort();
    unknown
        .into_iter()
        .map(|name| {
            let nearest = SETTINGS
                .iter()
                .map(|i| (strsim::damerau_levenshtein(&name, i.env), i.env))
                .min();
            match nearest {
                // A few letters apart: a typo rather than another tool's variable.
                Some((d, env)) if d <= 3 => {
                    format!("{name} is no ferrio setting and is ignored (did you mean {env}?)")
                }
                _ => format!("{name} is no ferrio setting and is ignored"),
            }
        })
        .collect()
}

impl SettingInfo {
    /// Parses `value` into this setting of `settings`; a bad value is an error naming
    /// `shown_name` (the variable or name the user gave), the value and the accepted forms, and
    /// changes nothing.
    fn apply(&self, settings: &mut Settings, value: &str, shown_name: &str) -> Result<()> {
        (self.set)(settings, value).map_err(|expected| Error::InvalidSetting {
            name: shown_name.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        })
    }
}

impl Settings {
    /// Default settings overridden by every `FERRIO_*` variable that is set.
    ///
    /// A variable with a bad value is an error naming the variable, the value and the accepted
    /// forms; unknown `FERRIO_*` variables are ignored (see [`Settings::env_warnings`]).
    pub fn from_env() -> Result<Settings> {
        let mut s = Settings::default();
        for info in SETTINGS {
            match std::env::var(info.env) {
                Ok(value) => info.apply(&mut s, &value, info.env)?,
                // Not text: no accepted form is, so it is a bad value, not an absent one.
                Err(std::env::VarError::NotUnicode(raw)) => {
                    info.apply(&mut s, &raw.to_string_lossy(), info.env)?
                }
                Err(std::env::VarError::NotPresent) => {}
            }
        }
        Ok(s)
    }

    /// The process-wide settings, read from the environment on first use.
    ///
    /// If the environment holds a bad value, the defaults are used and the error is returned by
    /// [`Settings::env_error`]; the CLI and Python package report it at start-up.
    pub fn global() -> Settings {
        (**global_cell().read().unwrap_or_else(|p| p.into_inner())).clone()
    }

    /// The error in the `FERRIO_*` environment, if one was found when the settings were loaded.
    pub fn env_error() -> Option<String> {
        global_cell();
        ENV_ERROR.get().and_then(|e| e.clone())
    }

    /// One line per `FERRIO_*` variable in the environment that names no setting (a misspelt
    /// `FERRIO_THREAD_PER_DEVICE`, say), which ferrio ignores, with the setting variable it is
    /// closest to where one is near. The CLI and the Python package print them at start-up.
    pub fn env_warnings() -> Vec<String> {
        unknown_variables(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
    }

    /// Replaces the process-wide settings (operations already issued are unaffected).
    pub fn set_global(settings: Settings) {
        *global_cell().write().unwrap_or_else(|p| p.into_inner()) = Arc::new(settings);
    }

    /// The settings in force on this thread: the innermost [`Settings::scope`] override, or the
    /// process-wide settings.
    pub fn current() -> Settings {
        SCOPED
            .with(|stack| stack.borrow().last().cloned())
            .unwrap_or_else(Settings::global)
    }

    /// Makes `settings` the ones in force on this thread until the guard is dropped; guards nest.
    /// Meant for tests and for code that wants different settings for a few calls.
    pub fn scope(settings: Settings) -> ScopedSettings {
        SCOPED.with(|stack| stack.borrow_mut().push(settings));
        ScopedSettings {
            _not_send: std::marker::PhantomData,
        }
    }

    /// The value of a setting by name (`task_size`) or variable (`FERRIO_TASK_SIZE`), as text.
    pub fn get(&self, name: &str) -> Result<String> {
        Ok((find(name)?.get)(self))
    }

    /// Sets a setting by name or variable from text, with the same parser as the environment.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        find(name)?.apply(self, value, name)
    }
}

/// [`Settings::bounce_buffer_bytes`] on a host with one GPU (or none).
pub const BOUNCE_BUFFER_ONE_GPU: u64 = 4 << 20;

/// [`Settings::bounce_buffer_bytes`] on a host with several GPUs.
pub const BOUNCE_BUFFER_SEVERAL_GPUS: u64 = 2 << 20;

impl Settings {
    /// The bounce buffer size in force: [`Settings::bounce_buffer_size`], or where that is 0
    /// (the default) the host's: [`BOUNCE_BUFFER_ONE_GPU`] (4 MiB) where it has one NVIDIA GPU
    /// or none, [`BOUNCE_BUFFER_SEVERAL_GPUS`] (2 MiB) where it has several
    /// ([`crate::topology::host_gpus`]). Larger buffers feed one GPU faster, but every GPU of a
    /// host fed at once with them was much slower (the README's settings table has the numbers).
    pub fn bounce_buffer_bytes(&self) -> u64 {
        match self.bounce_buffer_size {
            0 if crate::topology::host_gpus() > 1 => BOUNCE_BUFFER_SEVERAL_GPUS,
            0 => BOUNCE_BUFFER_ONE_GPU,
            n => n,
        }
    }

    /// The `device_threads` entry for pool `key`, if any.
    pub fn device_threads_for(&self, key: &str) -> Option<usize> {
        self.device_threads
            .iter()
            .find(|(k, _)| k == key)
            .map(|&(_, n)| n)
    }
}

/// Restores the previous settings of this thread when dropped. Returned by [`Settings::scope`].
#[must_use = "the override ends when the guard is dropped"]
pub struct ScopedSettings {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ScopedSettings {
    fn drop(&mut self) {
        SCOPED.with(|stack| {
            stack.borrow_mut().pop();
        });
    }
}

thread_local! {
    static SCOPED: RefCell<Vec<Settings>> = const { RefCell::new(Vec::new()) };
}

static GLOBAL: OnceLock<RwLock<Arc<Settings>>> = OnceLock::new();
static ENV_ERROR: OnceLock<Option<String>> = OnceLock::new();

fn global_cell() -> &'static RwLock<Arc<Settings>> {
    GLOBAL.get_or_init(|| {
        let (settings, err) = match Settings::from_env() {
            Ok(s) => (s, None),
            Err(e) => (Settings::default(), Some(e.to_string())),
        };
        let _ = ENV_ERROR.set(err);
        RwLock::new(Arc::new(settings))
    })
}

fn find(name: &str) -> Result<&'static SettingInfo> {
    setting(name).ok_or_else(|| Error::InvalidSetting {
        name: name.to_string(),
        value: String::new(),
        expected: format!(
            "one of the settings {}",
            SETTINGS
                .iter()
                .map(|i| i.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Parses `on/off/true/false/1/0/yes/no`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Some(true),
        "off" | "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

/// Parses a human byte count: `4194304`, `4096B`, `4K`/`4KiB` (1024), `4KB` (1000), `16M`,
/// `16MiB`, `16MB`, `2G`, `2GiB`, `2GB`, `1T`, `1TiB`, `1TB`. Case-insensitive; no fractions.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1_000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Formats a byte count for people: `4.0 MiB`, `2.00 GiB`, `512 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_ferrio_variables_are_named_with_the_nearest_setting() {
        let names = [
            "FERRIO_THREAD_PER_DEVICE",
            "FERRIO_FERRIO_CACHE",
            "FERRIO_TASK_SIZE",
            "FERRIO_TRACE",
            "FERRIO_TEST_DIR",
            "FERRIO_BENCH_BIN",
            "FERRIO_SOMETHING_ELSE_ENTIRELY",
            "PATH",
            "ferrio_cache",
        ];
        let lines = unknown_variables(names.iter().map(|n| n.to_string()));
        assert_eq!(
            lines,
            [
                "FERRIO_FERRIO_CACHE is no ferrio setting and is ignored",
                "FERRIO_SOMETHING_ELSE_ENTIRELY is no ferrio setting and is ignored",
                "FERRIO_THREAD_PER_DEVICE is no ferrio setting and is ignored (did you mean \
                 FERRIO_THREADS_PER_DEVICE?)",
            ]
        );
        // Every setting's own variable is known.
        assert!(unknown_variables(SETTINGS.iter().map(|i| i.env.to_string())).is_empty());
    }

    #[test]
    fn sizes_parse_in_every_form() {
        assert_eq!(parse_size("4194304"), Some(4 << 20));
        assert_eq!(parse_size("4MiB"), Some(4 << 20));
        assert_eq!(parse_size("4m"), Some(4 << 20));
        assert_eq!(parse_size("16M"), Some(16 << 20));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("4KB"), Some(4000));
        assert_eq!(parse_size(" 512 KiB "), Some(512 << 10));
        assert_eq!(parse_size("1.5G"), None);
        assert_eq!(parse_size("MiB"), None);
        assert_eq!(parse_size("4XB"), None);
        assert_eq!(parse_size("99999999999999999999"), None);
        assert_eq!(parse_size("20000000T"), None);
    }

    #[test]
    fn bad_values_name_the_variable_value_and_forms() {
        let mut s = Settings::default();
        let e = s.set("FERRIO_TASK_SIZE", "lots").unwrap_err().to_string();
        assert!(
            e.contains("FERRIO_TASK_SIZE") && e.contains("\"lots\"") && e.contains("4MiB"),
            "{e}"
        );
        let e = s.set("direct_read", "maybe").unwrap_err().to_string();
        assert!(
            e.contains("direct_read") && e.contains("off|on|auto"),
            "{e}"
        );
        let e = s.set("FERRIO_FILL_READS", "mmap").unwrap_err().to_string();
        assert!(
            e.contains("FERRIO_FILL_READS") && e.contains("readahead|populate"),
            "{e}"
        );
        let e = s.set("no_such_knob", "1").unwrap_err().to_string();
        assert!(e.contains("task_size"), "{e}");
        assert!(s.set("task_size", "0").is_err());
        // Under a page, a request would plan a task (24 bytes) per few bytes it reads.
        let e = s.set("task_size", "1").unwrap_err().to_string();
        assert!(e.contains("at least 4 KiB"), "{e}");
        assert!(s.set("max_threads", "0").is_err());
        assert_eq!(s, Settings::default(), "a refused value changes nothing");
    }

    #[test]
    fn every_setting_round_trips_by_name() {
        let mut s = Settings::default();
        for info in SETTINGS {
            let v = s.get(info.name).unwrap();
            s.set(info.env, &v).unwrap();
            assert_eq!(s.get(info.name).unwrap(), v, "{}", info.name);
        }
        assert_eq!(s, Settings::default());
        s.set("direct_read", "on").unwrap();
        assert_eq!(s.direct_read, DirectMode::On);
        s.set("per_device_pools", "no").unwrap();
        s.set("FERRIO_DEVICE_THREADS", "nvme0=16, loop3=2").unwrap();
        assert_eq!(s.device_threads_for("loop3"), Some(2));
        assert_eq!(s.get("device_threads").unwrap(), "nvme0=16,loop3=2");
        assert!(s.set("device_threads", "nvme0").is_err());
        assert!(s.set("device_threads", "nvme0=0").is_err());
        let twice = s
            .set("device_threads", "nvme0=4,loop3=2, nvme0=8")
            .unwrap_err();
        assert!(
            twice.to_string().contains("each pool named once"),
            "{twice}"
        );
        assert_eq!(
            s.device_threads_for("loop3"),
            Some(2),
            "a refused value changes nothing"
        );
        assert!(!s.per_device_pools);
    }

    #[test]
    fn device_threads_needs_a_pool_name() {
        let mut s = Settings::default();
        for bad in ["=3", " = 3", "nvme0=2,=3"] {
            for name in ["device_threads", "FERRIO_DEVICE_THREADS"] {
                let e = s.set(name, bad).unwrap_err().to_string();
                assert!(
                    e.contains("FERRIO_DEVICE_THREADS") || e.contains(name),
                    "{e}"
                );
                assert!(e.contains("NAME=N[,NAME=N...]"), "{e}");
            }
        }
        assert!(s.device_threads.is_empty());
    }

    #[test]
    fn defaults_come_from_the_table() {
        let d = Settings::default();
        for info in SETTINGS {
            let mut s = d.clone();
            s.set(info.name, info.default)
                .unwrap_or_else(|e| panic!("{}'s default does not parse: {e}", info.name));
            assert_eq!(s, d, "{}", info.name);
            assert_eq!(info.env, format!("FERRIO_{}", info.name.to_uppercase()));
        }
        // The values the rest of the crate was tuned for.
        assert_eq!(d.task_size, 4 << 20);
        assert_eq!(d.threads_per_device, 0);
        assert!(d.device_threads.is_empty());
        assert_eq!(d.max_threads, 64);
        assert!(d.per_device_pools);
        assert_eq!(d.direct_read, DirectMode::Auto);
        assert_eq!(d.direct_write, DirectMode::Auto);
        assert!(!d.direct_overread);
        assert_eq!(d.bounce_buffer_size, 0);
        assert_eq!(d.bounce_buffers, 2);
        assert_eq!(d.pinned_limit, 1 << 30);
        assert_eq!(d.remote_connect_timeout, Duration::from_secs(5));
        assert_eq!(d.remote_timeout, Duration::from_secs(120));
        assert_eq!(d.remote_retries, 5);
        assert_eq!(d.remote_retry_timeout, Duration::from_secs(60));
    }

    #[test]
    fn remote_times_parse_and_bad_ones_name_the_variable() {
        assert_eq!(parse_duration("5"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration(" 90s "), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1H"), Some(Duration::from_secs(3600)));
        for bad in ["", "s", "1.5s", "5 days", "-1", "99999999999999999999h"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        let mut s = Settings::default();
        s.set("remote_timeout", "500ms").unwrap();
        assert_eq!(s.get("remote_timeout").unwrap(), "500ms");
        s.set("FERRIO_REMOTE_RETRY_TIMEOUT", "0").unwrap();
        assert_eq!(s.remote_retry_timeout, Duration::ZERO);
        s.set("remote_retries", "0").unwrap();
        let before = s.clone();
        for (name, bad, forms) in [
            ("FERRIO_REMOTE_TIMEOUT", "soon", "500ms"),
            ("FERRIO_REMOTE_TIMEOUT", "0", "more than 0"),
            ("FERRIO_REMOTE_CONNECT_TIMEOUT", "25h", "at most 24h"),
            ("FERRIO_REMOTE_RETRIES", "101", "at most 100"),
            ("FERRIO_REMOTE_RETRIES", "-1", "whole number"),
        ] {
            let e = s.set(name, bad).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(forms), "{e}");
        }
        assert_eq!(s, before, "a refused value changes nothing");
    }

    #[test]
    fn scopes_nest_and_restore() {
        let base = Settings::current();
        {
            let mut a = base.clone();
            a.task_size = 123;
            let _g = Settings::scope(a);
            assert_eq!(Settings::current().task_size, 123);
            {
                let mut b = base.clone();
                b.task_size = 456;
                let _g2 = Settings::scope(b);
                assert_eq!(Settings::current().task_size, 456);
            }
            assert_eq!(Settings::current().task_size, 123);
        }
        assert_eq!(Settings::current(), base);
    }
}
