//! Scheduling: how many files are copied at once, and which file a free copy thread takes next,
//! so that every source and destination device has files under way.
//!
//! It hands out entries; copying one is `entry`'s business.

use std::collections::VecDeque;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use super::ring::Ring;
use super::walk::Entry;
use super::{Copier, CopyMethod};

/// Files copied at once by default: a small file's copy is mostly metadata calls, which overlap,
/// so more files at once than devices pays (measured: see benchmarks/RESULTS.md).
pub(super) const DEFAULT_PARALLEL_FILES: usize = 8;

/// Files copied at once by default when every file stays within its file system
/// (`copy_file_range`, which holds no buffers): more streams keep the disk's queue fuller than
/// `DEFAULT_PARALLEL_FILES`, and more than this gained nothing (measured: see
/// benchmarks/RESULTS.md).
const KERNEL_COPY_PARALLEL_FILES: usize = 12;

/// Most files copied at once by default.
const MAX_PARALLEL_FILES: usize = 16;

impl Copier<'_> {
    /// Copies the files and symlinks of `work` on several threads, spreading them over device
    /// pairs so that every source and destination device has files under way.
    pub(super) fn copy_all(&self, entries: &[Entry], work: &[usize]) {
        if work.is_empty() {
            return;
        }
        let mut groups: Vec<((u64, u64), VecDeque<usize>)> = Vec::new();
        for &i in work {
            let key = (entries[i].meta.dev(), entries[i].dst_dev);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, q)) => q.push_back(i),
                None => groups.push((key, VecDeque::from([i]))),
            }
        }
        let kernel_copies = self.options.method != CopyMethod::ReadWrite
            && groups
                .iter()
                .all(|((src_dev, dst_dev), _)| src_dev == dst_dev);
        let threads = if self.options.parallel_files > 0 {
            self.options.parallel_files
        } else if kernel_copies {
            (2 * groups.len()).clamp(KERNEL_COPY_PARALLEL_FILES, MAX_PARALLEL_FILES)
        } else {
            (2 * groups.len()).clamp(DEFAULT_PARALLEL_FILES, MAX_PARALLEL_FILES)
        }
        .min(work.len())
        .max(1);
        let sched = Scheduler::new(groups.into_iter().map(|(_, q)| q).collect());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut ring = Ring::new(self.window, self.depth);
                    while let Some((g, i)) = sched.next() {
                        if !self.cancelled() {
                            self.copy_entry(&entries[i], &mut ring);
                        }
                        sched.done(g);
                    }
                });
            }
        });
    }
}

/// Hands out files to copy threads: the next file comes from the device pair with the fewest
/// files under way, so that one device's many files do not keep the others idle.
pub(super) struct Scheduler {
    groups: Mutex<Vec<(VecDeque<usize>, usize)>>,
}

impl Scheduler {
    pub(super) fn new(queues: Vec<VecDeque<usize>>) -> Scheduler {
        Scheduler {
            groups: Mutex::new(queues.into_iter().map(|q| (q, 0)).collect()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(VecDeque<usize>, usize)>> {
        // Whole pops and counter changes only: a poisoned lock is consistent.
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `(group, entry)` to copy next, or `None` when all have been handed out.
    pub(super) fn next(&self) -> Option<(usize, usize)> {
        let mut groups = self.lock();
        let g = (0..groups.len())
            .filter(|&g| !groups[g].0.is_empty())
            .min_by_key(|&g| groups[g].1)?;
        let i = groups[g].0.pop_front()?;
        groups[g].1 += 1;
        Some((g, i))
    }

    pub(super) fn done(&self, g: usize) {
        let mut groups = self.lock();
        if let Some(group) = groups.get_mut(g) {
            group.1 = group.1.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_spreads_over_groups() {
        let s = Scheduler::new(vec![VecDeque::from([0, 1, 2]), VecDeque::from([3, 4])]);
        let a = s.next().unwrap();
        let b = s.next().unwrap();
        assert_ne!(a.0, b.0, "the second file comes from the idle group");
        s.done(a.0);
        let c = s.next().unwrap();
        assert_eq!(c.0, a.0);
        let mut rest = vec![a.1, b.1, c.1];
        while let Some((g, i)) = s.next() {
            rest.push(i);
            s.done(g);
        }
        rest.sort();
        assert_eq!(rest, vec![0, 1, 2, 3, 4]);
    }
}
