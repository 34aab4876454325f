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
//! already in the page cache are always read from it. Writes keep only under `cache=keep`:
//! buffered writes were several times slower than direct ones, so `auto` writes bypass.
//!
//! `direct_read`/`direct_write` `on` and `off` still force the mechanism; `auto` (the default)
//! leaves it to this module. This module reads `/proc/meminfo` and the cgroup's memory files;
//! it asks the page cache through `direct.rs` and does no I/O of its own.

use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::config::{CacheMode, DirectMode};
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
            reason: "asked for".into(),
        },
        CacheMode::Bypass => CacheDecision {
            asked: mode,
            resolved: CacheMode::Bypass,
            keep_limit: 0,
            reason: "asked for".into(),
        },
        CacheMode::Auto => {
            let Some(m) = memory else {
                return CacheDecision {
                    asked: mode,
                    resolved: CacheMode::Keep,
                    keep_limit: u64::MAX,
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
    let direct = direct_mode != DirectMode::Off && direct_ok;
    if decision.keeps() && !(direct && direct_mode == DirectMode::On) {
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

/// How a cold read that fills the page cache is scheduled: few, large, sequential requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FillShape {
    /// Bytes per task.
    pub(crate) task_bytes: u64,
    /// Tasks of the request in flight at once.
    pub(crate) in_flight: usize,
}

/// Tasks of a cold read that fills the page cache: large, so that the kernel's readahead ramps
/// up within each and fills the cache with large folios. Many small buffered reads at scattered
/// offsets of one file defeat readahead: the page cache then holds 4 KiB pages, and the next read
/// of the file copies out of it at half speed. How many such tasks run at once is the
/// `fill_in_flight` setting (measured: see benchmarks/RESULTS.md).
pub(crate) const FILL_TASK_BYTES: u64 = 64 << 20;

/// The shape of a read of `[offset, offset+len)` when it fills the page cache: a kept file
/// (not forced to `O_DIRECT`) whose range is cold and at least one fill task long. `None`: plan
/// the read as usual (many tasks in parallel: hot data is a memory copy and scales with threads).
pub(crate) fn fill_shape(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: u64,
    in_flight: usize,
) -> Option<FillShape> {
    if !decision.keeps() || direct_mode == DirectMode::On || len < FILL_TASK_BYTES {
        return None;
    }
    (direct::probe(fd, offset, len) == Probe::Cold).then_some(FillShape {
        task_bytes: FILL_TASK_BYTES,
        in_flight: in_flight.max(1),
    })
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
/// Otherwise (`auto` too: buffered writes ran at a third of direct ones on the dev VM and cost
/// several times the CPU, measured: see benchmarks/RESULTS.md) a write goes direct on a local
/// file system (a block device under it: direct writes are known to hurt on network file
/// systems) when none of the range is cached (a direct write would flush and drop those pages,
/// and a reader of them would lose its cache), which also keeps a streaming writer from
/// evicting everything else.
pub(crate) fn write_direct(
    direct_mode: DirectMode,
    decision: &CacheDecision,
    local: bool,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) -> bool {
    match direct_mode {
        DirectMode::Off => false,
        DirectMode::On => true,
        DirectMode::Auto => {
            decision.asked != CacheMode::Keep
                && local
                && direct::probe(fd, offset, len as u64) == Probe::Cold
        }
    }
}

/// Whether writes of this file may go direct at all (for preallocation and the write cap).
pub(crate) fn writes_may_go_direct(direct_mode: DirectMode, decision: &CacheDecision) -> bool {
    match direct_mode {
        DirectMode::Off => false,
        DirectMode::On => true,
        DirectMode::Auto => decision.asked != CacheMode::Keep,
    }
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
        f.write_all(&vec![7u8; (FILL_TASK_BYTES * 2) as usize])
            .unwrap();
        f.sync_all().unwrap();
        let fd = f.as_fd();
        let len = FILL_TASK_BYTES * 2;
        let keep = decide(CacheMode::Keep, len, None);
        let bypass = decide(CacheMode::Bypass, len, None);
        // Written and synced, the pages are cached: a hot read is planned as usual.
        assert_eq!(fill_shape(DirectMode::Auto, &keep, fd, 0, len, 3), None);
        crate::sys::fadvise_dontneed(fd, 0, 0).unwrap();
        if direct::probe(fd, 0, len) != Probe::Cold {
            eprintln!("skipped: this file system keeps the pages after POSIX_FADV_DONTNEED");
            return;
        }
        let shape = FillShape {
            task_bytes: FILL_TASK_BYTES,
            in_flight: 3,
        };
        assert_eq!(
            fill_shape(DirectMode::Auto, &keep, fd, 0, len, 3),
            Some(shape)
        );
        assert_eq!(
            fill_shape(DirectMode::Off, &keep, fd, 0, len, 3),
            Some(shape)
        );
        // Not for a file that bypasses, a forced O_DIRECT, or a read shorter than one task.
        assert_eq!(fill_shape(DirectMode::Auto, &bypass, fd, 0, len, 3), None);
        assert_eq!(fill_shape(DirectMode::On, &keep, fd, 0, len, 3), None);
        assert_eq!(fill_shape(DirectMode::Auto, &keep, fd, 0, 1 << 20, 3), None);
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
