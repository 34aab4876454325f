//! The read and write policy: the one place that decides whether a file's bytes go through the
//! page cache or bypass it, per open ([`decide`]: keep or bypass, from the `cache` setting and
//! the file's size against available memory) and per task (`read_path`, `write_direct`:
//! buffered, `O_DIRECT`, or buffered and then dropped, from that decision, the `direct_*`
//! settings and what the page cache already holds).
//!
//! The rule: `cache=keep` reads and writes cold ranges through the page cache, so the next read
//! (in this process or another) is a memory copy; `cache=bypass` reads cold ranges with
//! `O_DIRECT` (buffered and then dropped where `O_DIRECT` is unavailable), so nothing that was
//! not cached before is cached after; `cache=auto` is `keep` for a file of at most half the
//! available memory and `bypass` above that. Buffered cold reads run at the disk's direct-read
//! rate on the machines measured, so keeping costs the first read nothing but a copy, and it
//! makes the second read a page-cache read (measured: see benchmarks/RESULTS.md). Ranges
//! already in the page cache are always read from it.
//!
//! Writes keep under `cache=keep`, and bypass under `cache=bypass`. Under `auto` it depends on
//! the device, because machines differ: on the dev VM buffered writes ran at a third of direct
//! ones, on the GPU machines a buffered write returned 1.7× sooner (and a synced one later). So
//! the first `auto` write of the process to a device that could go either way times a few MiB
//! each way ([`WriteProbe`], measured by `direct.rs`, remembered by the device's pool), and
//! writes that end within [`CacheDecision::write_keep_limit`] go through the page cache when it
//! was clearly faster there: the file is then hot for the next read, and a stream past the limit
//! still bypasses.
//!
//! `direct_read`/`direct_write` `on` and `off` still force the mechanism; `auto` (the default)
//! leaves it to this module. This module reads `/proc/meminfo` and the cgroup's memory files;
//! it asks the page cache through `direct.rs` and does no I/O of its own.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::OnceLock;

use crate::config::{CacheMode, DirectMode, FillReads};
use crate::direct::{self, Probe};

/// A file is kept in the page cache under `auto` when it is at most this share of the
/// available memory: room is left for the process's own buffers and for other files.
pub const AUTO_KEEP_SHARE: f64 = 0.5;

/// Memory that the page cache may grow into: the smaller of the system's `MemAvailable` and the
/// room left under the cgroup's memory limit (a container), with where each came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    /// Bytes available.
    pub available: u64,
    /// Where the number came from, e.g. `MemAvailable` or `cgroup memory.max`.
    pub source: String,
}

impl Memory {
    /// Dirty page cache the kernel lets writers build up before it makes them wait for the
    /// device: `vm.dirty_bytes`, or `vm.dirty_ratio` percent (default 20) of the available
    /// memory (read once per process). Buffered writes past it run at the device's rate, plus a
    /// copy.
    pub fn dirty_limit(&self) -> u64 {
        static SYSCTL: OnceLock<(Option<u64>, Option<u64>)> = OnceLock::new();
        let (bytes, ratio) = *SYSCTL.get_or_init(|| {
            let read = |name: &str| -> Option<u64> {
                std::fs::read_to_string(Path::new("/proc/sys/vm").join(name))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            (read("dirty_bytes"), read("dirty_ratio"))
        });
        match bytes {
            Some(bytes) if bytes > 0 => bytes.min(self.available),
            _ => self.available / 100 * ratio.unwrap_or(20).min(100),
        }
    }
}

/// Buffered writes are chosen under `auto` only when the probe found them this much faster than
/// direct ones: the page cache still has to write the bytes back later, and the probe's few MiB
/// vary by more than 10% from run to run.
pub const BUFFERED_WRITE_MARGIN: f64 = 1.25;

/// The smallest write that measures its device ([`WriteProbe`]) when none has yet: the probe
/// writes 16 MiB, which a smaller write should not pay for.
pub const WRITE_PROBE_MIN_WRITE: u64 = 16 << 20;

/// Bytes of `auto` writes through the page cache after which their own rate replaces the
/// probe's buffered one (`DevicePool::measured_writes`): on the dev VM the probe's 16 MiB ran at
/// 2–6 GiB/s where 2 GiB then ran at 0.4–1.3 (fresh memory, which the hypervisor backs page by
/// page), so the verdict must follow what the writes do; 64 MiB costs at most ~0.15 s there
/// before it turns to direct writes.
pub const WRITE_RATE_WINDOW: u64 = 64 << 20;

/// What the first `auto` write to a device measured: bytes per second of a few MiB written
/// through the page cache and of the same written with `O_DIRECT`, one after the other on one
/// thread, into an unnamed temporary file beside the file written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteProbe {
    /// Bytes per second through the page cache.
    pub buffered: f64,
    /// Bytes per second with `O_DIRECT`.
    pub direct: f64,
}

impl WriteProbe {
    /// Whether writes that may keep their pages go through the page cache.
    pub fn prefers_buffered(&self) -> bool {
        self.buffered >= BUFFERED_WRITE_MARGIN * self.direct
    }
}

impl std::fmt::Display for WriteProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |r: f64| r / (1u64 << 30) as f64;
        write!(
            f,
            "measured on this device: buffered {:.2} GiB/s, direct {:.2} GiB/s",
            gib(self.buffered),
            gib(self.direct)
        )
    }
}

/// The policy's decision for one open file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDecision {
    /// The `cache` setting asked for.
    pub asked: CacheMode,
    /// What it resolved to: [`CacheMode::Keep`] or [`CacheMode::Bypass`].
    pub resolved: CacheMode,
    /// Files up to this many bytes are kept under `auto` (`u64::MAX` for `keep`, 0 for
    /// `bypass`).
    pub keep_limit: u64,
    /// Under `auto`, writes that end within this many bytes of the file's start may go through
    /// the page cache (where the device's [`WriteProbe`] prefers it): the keep limit, or the
    /// kernel's dirty limit ([`Memory::dirty_limit`]) where that is lower. 0 otherwise.
    pub write_keep_limit: u64,
    /// Why, in one line.
    pub reason: String,
}

impl CacheDecision {
    /// Whether cold data read from this file stays in the page cache.
    pub fn keeps(&self) -> bool {
        self.resolved == CacheMode::Keep
    }
}

impl std::fmt::Display for CacheDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.keeps() {
            "reads fill the page cache"
        } else {
            "cold data bypasses the page cache"
        };
        write!(
            f,
            "{} → {} ({}): {what}",
            self.asked, self.resolved, self.reason
        )
    }
}

/// Decides keep or bypass for a file of `size` bytes under `mode`, given the memory the page
/// cache may use (`None`: unknown, which keeps).
pub fn decide(mode: CacheMode, size: u64, memory: Option<&Memory>) -> CacheDecision {
    let fmt = crate::config::format_size;
    match mode {
        CacheMode::Keep => CacheDecision {
            asked: mode,
            resolved: CacheMode::Keep,
            keep_limit: u64::MAX,
            write_keep_limit: 0,
            reason: "asked for".into(),
        },
        CacheMode::Bypass => CacheDecision {
            asked: mode,
            resolved: CacheMode::Bypass,
            keep_limit: 0,
            write_keep_limit: 0,
            reason: "asked for".into(),
        },
        CacheMode::Auto => {
            let Some(m) = memory else {
                return CacheDecision {
                    asked: mode,
                    resolved: CacheMode::Keep,
                    keep_limit: u64::MAX,
                    // Without knowing the memory, writes do not guess: they bypass.
                    write_keep_limit: 0,
                    reason: "available memory unknown".into(),
                };
            };
            let limit = (m.available as f64 * AUTO_KEEP_SHARE) as u64;
            let keep = size <= limit;
            CacheDecision {
                asked: mode,
                resolved: if keep {
                    CacheMode::Keep
                } else {
                    CacheMode::Bypass
                },
                keep_limit: limit,
                write_keep_limit: limit.min(m.dirty_limit()),
                reason: format!(
                    "file {} {} half of {} available, {}",
                    fmt(size),
                    if keep { "≤" } else { ">" },
                    fmt(m.available),
                    m.source
                ),
            }
        }
    }
}

/// How one read task moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadPath {
    /// Through the page cache.
    Buffered,
    /// `O_DIRECT` for the aligned middle (the file must support it).
    Direct,
    /// Through the page cache, then the range's pages are dropped (`bypass` without `O_DIRECT`:
    /// the range was cold, so nobody else had it cached).
    BufferedThenDrop,
}

/// Whether any read of a file may go direct: never under `direct_read=off`, and a kept file's
/// only under `direct_read=on` (see [`read_path`]).
pub(crate) fn reads_may_go_direct(direct_mode: DirectMode, decision: &CacheDecision) -> bool {
    direct_mode != DirectMode::Off && (!decision.keeps() || direct_mode == DirectMode::On)
}

/// How a read task on `[offset, offset+len)` moves its bytes. `fd` is the buffered descriptor
/// (for the residency query), `direct_ok` whether `O_DIRECT` works on the file.
pub(crate) fn read_path(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    direct_ok: bool,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) -> ReadPath {
    let direct = direct_ok && reads_may_go_direct(direct_mode, decision);
    if decision.keeps() && !direct {
        // Kept files read every range through the page cache: no need to ask it anything.
        return ReadPath::Buffered;
    }
    match (direct_mode, coldness(fd, offset, len as u64)) {
        (DirectMode::On, _) if direct => ReadPath::Direct,
        (_, Coldness::Cached) => ReadPath::Buffered,
        (_, Coldness::MostlyCold) if direct => ReadPath::Direct,
        // Some of the range was cached, by someone else: dropping it would take their pages.
        (_, Coldness::MostlyCold) => ReadPath::Buffered,
        (_, Coldness::Cold) if direct => ReadPath::Direct,
        (_, Coldness::Cold) => ReadPath::BufferedThenDrop,
    }
}

/// How a cold read that fills the page cache is scheduled: few, large, sequential tasks.
///
/// Tasks of such a read are read front to back, so that the page cache ends up holding large
/// folios: under `fill_reads=populate` each task reads 2 MiB blocks one after the other into
/// huge folios; under `readahead` the kernel's readahead ramps up within each task. (Many small
/// buffered reads at scattered offsets of one file defeat readahead: the page cache then holds
/// 4 KiB pages, and the next read of the file copies out of it at half speed.) Their size is the
/// `fill_task_size` setting and how many run at once `fill_in_flight` (measured: see
/// benchmarks/RESULTS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillShape {
    /// Bytes per task.
    pub task_bytes: u64,
    /// Tasks of the request in flight at once.
    pub in_flight: usize,
}

impl FillShape {
    /// The shape `settings` ask for (`fill_task_size`, `fill_in_flight`).
    pub fn from_settings(settings: &crate::config::Settings) -> FillShape {
        FillShape {
            task_bytes: settings.fill_task_size.max(1),
            in_flight: settings.fill_in_flight.max(1),
        }
    }
}

/// The way `fill_reads` (`asked`) fills the page cache: `auto` resolved (to `populate`), the
/// others as they are. A file the kernel cannot map for `populate` still fills through
/// readahead ([`crate::File::fill_reads`]).
///
/// Why `populate` everywhere, a virtio balloon that reports free pages to its hypervisor
/// included (sessions 15-19 filled through readahead there): on the dev VM, a 2 GiB file read
/// cold and again in new processes, alternating, 6 rounds (benchmarks/RESULTS.md, "Cache
/// policy", session 20), right after the caches were dropped `populate` read cold 10-15% faster
/// and again 1.2-1.5× faster; once the balloon had handed the freed memory back it read cold
/// 8-11% slower and again as fast or faster (up to 1.5×: the cache holds huge folios).
pub fn fill_reads_here(asked: FillReads) -> FillReads {
    match asked {
        FillReads::Auto => FillReads::Populate,
        other => other,
    }
}

/// The shape of a read of `[offset, offset+len)` when it fills the page cache: `wanted` (see
/// [`FillShape::from_settings`]) for a kept file (not forced to `O_DIRECT`) whose range is
/// mostly cold and at least one fill task long. `None`: plan the read as usual (many tasks in
/// parallel: hot data is a memory copy and scales with threads).
pub(crate) fn fill_shape(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: u64,
    wanted: FillShape,
) -> Option<FillShape> {
    if !decision.keeps() || direct_mode == DirectMode::On || len < wanted.task_bytes {
        return None;
    }
    // Mostly cold counts: reading a checkpoint's header brings the first pages of its data
    // into the cache (readahead), and its tensors are no less cold for that.
    matches!(
        coldness(fd, offset, len),
        Coldness::Cold | Coldness::MostlyCold
    )
    .then_some(wanted)
}

/// Whether cold ranges of a file are read buffered and then dropped ([`ReadPath::BufferedThenDrop`]),
/// so its buffered descriptor should read no further than asked.
pub(crate) fn buffered_bypass(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    direct_ok: bool,
) -> bool {
    !decision.keeps() && (direct_mode == DirectMode::Off || !direct_ok)
}

/// How much of a range the page cache holds.
enum Coldness {
    /// Most of it.
    Cached,
    /// Some of it, less than [`direct::AUTO_RESIDENT_SHARE`].
    MostlyCold,
    /// None of the probed pages.
    Cold,
}

fn coldness(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Coldness {
    match direct::probe(fd, offset, len) {
        Probe::Cached => Coldness::Cached,
        Probe::Cold => Coldness::Cold,
        Probe::Mixed => {
            if direct::resident_share(fd, offset, len)
                .is_some_and(|s| s < direct::AUTO_RESIDENT_SHARE)
            {
                Coldness::MostlyCold
            } else {
                Coldness::Cached
            }
        }
    }
}

/// Whether a write task on `[offset, offset+len)` should use `O_DIRECT`. `on`/`off` force it.
/// Under `auto`: `cache=keep` writes through the page cache, so write-then-read is hot.
/// `cache=auto` does too for a write that ends within [`CacheDecision::write_keep_limit`] when
/// the device's `probe` found buffered writes clearly faster ([`WriteProbe::prefers_buffered`]).
/// Otherwise (buffered writes ran at a third of direct ones on the dev VM and cost several times
/// the CPU, measured: see benchmarks/RESULTS.md) a write goes direct on a local file system (a
/// block device under it: direct writes are known to hurt on network file systems) when less
/// than half of the range is cached ([`direct::AUTO_RESIDENT_SHARE`], as for reads: a page or
/// two of a small header written just before does not count; a direct write flushes and drops
/// the pages it covers, and a reader of a mostly cached range would lose its cache), which also
/// keeps a streaming writer from evicting everything else.
pub(crate) fn write_direct(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    probe: Option<&WriteProbe>,
    local: bool,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) -> bool {
    writes_may_go_direct(direct_mode, decision, probe, offset + len as u64)
        && (direct_mode == DirectMode::On
            || (local && !matches!(coldness(fd, offset, len as u64), Coldness::Cached)))
}

/// Whether writes of this file that end at `end` may go direct at all (for preallocation and
/// the write cap): not under `direct_write=off` or `cache=keep`, nor under `cache=auto` where
/// the device prefers the page cache for them.
pub(crate) fn writes_may_go_direct(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    probe: Option<&WriteProbe>,
    end: u64,
) -> bool {
    match direct_mode {
        DirectMode::Off => false,
        DirectMode::On => true,
        DirectMode::Auto => match decision.asked {
            CacheMode::Keep => false,
            CacheMode::Bypass => true,
            CacheMode::Auto => {
                !(end <= decision.write_keep_limit
                    && probe.is_some_and(WriteProbe::prefers_buffered))
            }
        },
    }
}

/// How a write of cold data to a file would go, and why ([`describe_write`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WriteChoice {
    /// Whether it uses `O_DIRECT` (else it goes through the page cache and stays there).
    pub direct: bool,
    /// Why, in one line.
    pub reason: String,
}

impl std::fmt::Display for WriteChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.direct {
            "direct"
        } else {
            "through the page cache"
        };
        write!(f, "{how} ({})", self.reason)
    }
}

/// How a write of cold data ending at `end` goes under these choices (what `write_direct`
/// decides for each of its tasks, where nothing of the range is cached), and why.
pub fn describe_write(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    probe: Option<&WriteProbe>,
    local: bool,
    direct_ok: bool,
    end: u64,
) -> WriteChoice {
    let direct = direct_ok
        && writes_may_go_direct(direct_mode, decision, probe, end)
        && (local || direct_mode == DirectMode::On);
    let reason = if !direct_ok {
        "no O_DIRECT on this file".to_string()
    } else if direct_mode != DirectMode::Auto {
        format!("direct_write={direct_mode}")
    } else if decision.asked != CacheMode::Auto {
        format!("cache={}", decision.asked)
    } else if !local {
        "not a local file system".to_string()
    } else if end > decision.write_keep_limit {
        format!(
            "a write past {} (the smaller of half the available memory and the kernel's dirty \
             limit) bypasses",
            crate::config::format_size(decision.write_keep_limit)
        )
    } else {
        match probe {
            Some(p) => p.to_string(),
            None => "writes on this device could not be measured".to_string(),
        }
    };
    WriteChoice { direct, reason }
}

/// Whether a write that ends at `end` needs the device's [`WriteProbe`] to choose its path: an
/// `auto` write, within the write keep limit, to a local file that `O_DIRECT` works on.
pub(crate) fn write_needs_probe(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    local: bool,
    direct_ok: bool,
    end: u64,
) -> bool {
    direct_mode == DirectMode::Auto
        && decision.asked == CacheMode::Auto
        && local
        && direct_ok
        && end <= decision.write_keep_limit
}

/// The memory the page cache may grow into now: `MemAvailable`, or less where the process's
/// cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`) leaves less room above its anonymous
/// memory. `None` when neither can be read.
pub fn available_memory() -> Option<Memory> {
    let system = meminfo_available().map(|b| Memory {
        available: b,
        source: "MemAvailable".into(),
    });
    let cgroup = cgroup_room();
    match (system, cgroup) {
        (Some(s), Some(c)) if c.available < s.available => Some(c),
        (Some(s), _) => Some(s),
        (None, c) => c,
    }
}

fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Room under the cgroup's memory limit: the limit less the anonymous memory charged to it
/// (page cache is reclaimable, so it does not count against the room).
fn cgroup_room() -> Option<Memory> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            let dir = Path::new("/sys/fs/cgroup").join(path);
            if let Some(m) = room(&dir, "memory.max", "anon", "cgroup memory.max") {
                return Some(m);
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path);
            return room(
                &dir,
                "memory.limit_in_bytes",
                "total_rss",
                "cgroup memory.limit_in_bytes",
            );
        }
    }
    None
}

fn room(dir: &Path, limit_file: &str, anon_key: &str, source: &str) -> Option<Memory> {
    let limit: u64 = std::fs::read_to_string(dir.join(limit_file))
        .ok()?
        .trim()
        .parse()
        .ok()?; // "max" (v2, no limit) does not parse: no cgroup room
                // v1 reports "no limit" as a huge number.
    if limit >= 1 << 60 {
        return None;
    }
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let anon = stat
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == anon_key).then(|| v.trim().parse::<u64>().ok())?
        })
        .unwrap_or(0);
    Some(Memory {
        available: limit.saturating_sub(anon),
        source: source.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(gib: u64) -> Memory {
        Memory {
            available: gib << 30,
            source: "test".into(),
        }
    }

    #[test]
    fn a_cold_kept_read_is_filled_by_few_large_tasks_and_a_hot_one_is_not() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = std::fs::File::create(&path).unwrap();
        let shape = FillShape {
            task_bytes: 64 << 20,
            in_flight: 3,
        };
        f.write_all(&vec![7u8; (shape.task_bytes * 2) as usize])
            .unwrap();
        f.sync_all().unwrap();
        let fd = f.as_fd();
        let len = shape.task_bytes * 2;
        let keep = decide(CacheMode::Keep, len, None);
        let bypass = decide(CacheMode::Bypass, len, None);
        // Written and synced, the pages are cached: a hot read is planned as usual.
        assert_eq!(fill_shape(DirectMode::Auto, &keep, fd, 0, len, shape), None);
        crate::sys::fadvise_dontneed(fd, 0, 0).unwrap();
        if direct::probe(fd, 0, len) != Probe::Cold {
            eprintln!("skipped: this file system keeps the pages after POSIX_FADV_DONTNEED");
            return;
        }
        assert_eq!(
            fill_shape(DirectMode::Auto, &keep, fd, 0, len, shape),
            Some(shape)
        );
        assert_eq!(
            fill_shape(DirectMode::Off, &keep, fd, 0, len, shape),
            Some(shape)
        );
        // A range whose first pages are cached (a header read just before it) is still filled.
        let mut head = [0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(
            &std::fs::File::open(&path).unwrap(),
            &mut head,
            0,
        )
        .unwrap();
        assert_ne!(direct::probe(fd, 0, len), Probe::Cold);
        assert_eq!(
            fill_shape(DirectMode::Auto, &keep, fd, 0, len, shape),
            Some(shape)
        );
        // Not for a file that bypasses, a forced O_DIRECT, or a read shorter than one task.
        assert_eq!(
            fill_shape(DirectMode::Auto, &bypass, fd, 0, len, shape),
            None
        );
        assert_eq!(fill_shape(DirectMode::On, &keep, fd, 0, len, shape), None);
        assert_eq!(
            fill_shape(DirectMode::Auto, &keep, fd, 0, 1 << 20, shape),
            None
        );
        // Smaller fill tasks fill shorter reads.
        let small = FillShape {
            task_bytes: 1 << 20,
            in_flight: 16,
        };
        assert_eq!(
            fill_shape(DirectMode::Auto, &keep, fd, 0, 1 << 20, small),
            Some(small)
        );
    }

    #[test]
    fn auto_keeps_a_file_of_half_the_available_memory_and_bypasses_a_larger_one() {
        let d = decide(CacheMode::Auto, 2 << 30, Some(&mem(4)));
        assert!(d.keeps(), "{d}");
        let d = decide(CacheMode::Auto, (2 << 30) + 1, Some(&mem(4)));
        assert!(!d.keeps(), "{d}");
        assert!(d.to_string().contains("auto → bypass"), "{d}");
    }

    #[test]
    fn auto_writes_may_keep_up_to_the_smaller_of_the_keep_and_dirty_limits() {
        let m = mem(40);
        let d = decide(CacheMode::Auto, 0, Some(&m));
        assert_eq!(d.write_keep_limit, (20u64 << 30).min(m.dirty_limit()));
        assert!(m.dirty_limit() > 0 && m.dirty_limit() <= m.available);
        for mode in [CacheMode::Keep, CacheMode::Bypass] {
            assert_eq!(decide(mode, 0, Some(&m)).write_keep_limit, 0);
        }
        assert_eq!(decide(CacheMode::Auto, 0, None).write_keep_limit, 0);
    }

    #[test]
    fn writes_go_direct_unless_kept_or_measured_faster_through_the_page_cache() {
        use CacheMode::{Auto, Bypass, Keep};
        let faster = WriteProbe {
            buffered: 3.0,
            direct: 2.0,
        };
        let slower = WriteProbe {
            buffered: 2.4,
            direct: 2.0,
        };
        assert!(faster.prefers_buffered() && !slower.prefers_buffered());
        let auto = decide(Auto, 0, Some(&mem(40)));
        let limit = auto.write_keep_limit;
        let may = |mode: DirectMode, d: &CacheDecision, p: Option<&WriteProbe>, end: u64| {
            writes_may_go_direct(mode, d, p, end)
        };
        // auto: direct unless the device measured buffered writes faster and the write ends
        // within the limit.
        assert!(may(DirectMode::Auto, &auto, None, 1));
        assert!(may(DirectMode::Auto, &auto, Some(&slower), 1));
        assert!(!may(DirectMode::Auto, &auto, Some(&faster), 1));
        assert!(!may(DirectMode::Auto, &auto, Some(&faster), limit));
        assert!(may(DirectMode::Auto, &auto, Some(&faster), limit + 1));
        // keep and bypass do what they say, whatever was measured.
        let keep = decide(Keep, 0, None);
        let bypass = decide(Bypass, 0, None);
        assert!(!may(DirectMode::Auto, &keep, Some(&slower), 1));
        assert!(may(DirectMode::Auto, &bypass, Some(&faster), 1));
        // direct_write on/off force it.
        assert!(may(DirectMode::On, &keep, Some(&faster), 1));
        assert!(!may(DirectMode::Off, &bypass, None, 1));
        // The probe is wanted only where its answer matters.
        assert!(write_needs_probe(
            DirectMode::Auto,
            &auto,
            true,
            true,
            limit
        ));
        assert!(!write_needs_probe(
            DirectMode::Auto,
            &auto,
            true,
            true,
            limit + 1
        ));
        assert!(!write_needs_probe(DirectMode::Auto, &auto, false, true, 1));
        assert!(!write_needs_probe(DirectMode::Auto, &auto, true, false, 1));
        assert!(!write_needs_probe(DirectMode::Auto, &bypass, true, true, 0));
        assert!(!write_needs_probe(DirectMode::On, &auto, true, true, 1));
    }

    #[test]
    fn keep_and_bypass_do_not_look_at_memory() {
        assert!(decide(CacheMode::Keep, u64::MAX, Some(&mem(1))).keeps());
        assert!(!decide(CacheMode::Bypass, 1, Some(&mem(100))).keeps());
        assert!(decide(CacheMode::Auto, 1 << 40, None).keeps());
    }

    #[test]
    fn read_paths_follow_the_cache_decision_and_the_direct_setting() {
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        f.sync_all().unwrap();
        let keep = decide(CacheMode::Keep, 0, None);
        let bypass = decide(CacheMode::Bypass, 0, None);
        let path_of = |mode, d: &CacheDecision, direct_ok| {
            read_path(mode, d, direct_ok, f.as_fd(), 0, 1 << 20)
        };
        use DirectMode::{Auto, Off, On};
        // Whatever the page cache holds:
        assert_eq!(path_of(Auto, &keep, true), ReadPath::Buffered);
        assert_eq!(path_of(Off, &keep, true), ReadPath::Buffered);
        assert_eq!(path_of(On, &keep, true), ReadPath::Direct);
        assert_eq!(path_of(On, &keep, false), ReadPath::Buffered);
        assert_eq!(path_of(On, &bypass, true), ReadPath::Direct);
        // Cold (where the kernel lets us drop it: tmpfs keeps its pages).
        let _ = crate::sys::fadvise_dontneed(f.as_fd(), 0, 0);
        if is_cold_here(&f) {
            assert_eq!(path_of(Auto, &bypass, true), ReadPath::Direct);
            assert_eq!(path_of(Auto, &bypass, false), ReadPath::BufferedThenDrop);
            assert_eq!(path_of(Off, &bypass, true), ReadPath::BufferedThenDrop);
        }
        // Hot: always the page cache.
        let _ = std::fs::read(&path).unwrap();
        assert_eq!(path_of(Auto, &bypass, true), ReadPath::Buffered);
        assert_eq!(path_of(Off, &bypass, true), ReadPath::Buffered);
    }

    fn is_cold_here(f: &std::fs::File) -> bool {
        use std::os::fd::AsFd;
        direct::probe(f.as_fd(), 0, 1 << 20) == Probe::Cold
    }

    #[test]
    fn available_memory_is_known_here() {
        let m = available_memory().expect("/proc/meminfo");
        assert!(m.available > 0, "{m:?}");
    }
}
