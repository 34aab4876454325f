//! How many worker threads a pool gets: the one thread-count policy.
//!
//! A pool's size comes, in this order, from the `device_threads` setting for its key, from
//! `threads_per_device` times the disks behind it, or from the kinds of those disks
//! ([`default_threads`], summed over the pool's members by [`suggested_threads`]). A device
//! whose disks are unknown — a file system with no block device (tmpfs, NFS, FUSE) as much as a
//! device sysfs cannot describe (it vanished, a container without `/sys`) — gets the default of
//! [`DiskKind::Unknown`]. This module only counts: it never resolves devices (that is
//! [`crate::blockdev`]) and never starts threads (that is the pool).

use std::collections::HashMap;

use crate::blockdev::{DeviceStack, DiskKind};
use crate::config::Settings;

/// Suggested worker threads for one disk of this kind, used when
/// [`Settings::threads_per_device`] is 0.
///
/// A cold read of a disk peaks at a few requests in flight, while a hot read (page cache to
/// memory) is CPU-bound and scales with cores, and many threads lose nothing cold (measured: see
/// benchmarks/RESULTS.md). So solid-state, virtual and unknown disks get one thread per core, at
/// least 4 and at most 16 (NVMe up to 32: deep hardware queues); a rotating disk gets 2 (more
/// only adds head movement); a loop device 4 (its backing file's own disk is the limit).
pub fn default_threads(kind: DiskKind) -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    match kind {
        DiskKind::Hdd => 2,
        DiskKind::Loop => 4,
        DiskKind::Nvme => cores.clamp(8, 32),
        DiskKind::Ssd | DiskKind::Virtio | DiskKind::Unknown => cores.clamp(4, 16),
    }
}

/// Suggested worker threads for the pool of a device stack: [`default_threads`] summed over the
/// pool's members (the largest of a member's disks when it has several, like NVMe namespaces of
/// one controller). A stack with no disks (no block device) and `None` (a device sysfs cannot
/// describe) both get the default of [`DiskKind::Unknown`].
pub fn suggested_threads(stack: Option<&DeviceStack>) -> usize {
    let mut per_member: HashMap<&str, usize> = HashMap::new();
    for disk in stack.map_or(&[][..], |s| &s.disks[..]) {
        let threads = per_member.entry(disk.pool_member()).or_default();
        *threads = (*threads).max(default_threads(disk.kind));
    }
    let total: usize = per_member.values().sum();
    if total == 0 {
        default_threads(DiskKind::Unknown)
    } else {
        total
    }
}

/// Threads for the pool named `key` that serves `stack` (`None`: a device sysfs cannot
/// describe): the `device_threads` entry for `key` if there is one, else `threads_per_device`
/// for each disk behind it (a RAID-0 of four disks gets four times as many), else
/// [`suggested_threads`].
pub(crate) fn pool_threads(key: &str, stack: Option<&DeviceStack>, settings: &Settings) -> usize {
    if let Some(n) = settings.device_threads_for(key) {
        return n;
    }
    if settings.threads_per_device > 0 {
        let disks = stack.map_or(1, |s| s.pool.disk_count().max(1));
        return settings.threads_per_device * disks;
    }
    suggested_threads(stack)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_sysfs_cannot_describe_gets_the_unknown_kind_default() {
        assert_eq!(suggested_threads(None), default_threads(DiskKind::Unknown));
        let settings = Settings::default();
        assert_eq!(
            pool_threads("dev:7:7", None, &settings),
            default_threads(DiskKind::Unknown)
        );
    }

    #[test]
    fn settings_override_the_suggestion_in_order() {
        let mut settings = Settings {
            threads_per_device: 3,
            ..Settings::default()
        };
        assert_eq!(pool_threads("dev:7:7", None, &settings), 3);
        settings.device_threads = vec![("dev:7:7".into(), 9)];
        assert_eq!(pool_threads("dev:7:7", None, &settings), 9);
        assert_eq!(pool_threads("other", None, &settings), 3);
    }
}
