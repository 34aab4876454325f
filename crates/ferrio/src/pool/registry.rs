//! Finding a pool: the registry of pools by key, one per process, and the choice of a file's
//! pool at open (its device's own pool, or the one `global` pool). Sizes come from
//! [`super::threads`]; the pools themselves (workers, queues, scheduling) are `pool/mod.rs`.
//! Lock order: the registry lock is held only to find or insert a pool, never while a pool's
//! queue lock is taken.
//!
//! Pools belong to the process that built them. A forked child has none of its parent's worker
//! threads, and any of the parent's locks may have been held at the fork by a thread that no
//! longer exists, so a child never locks, drops or joins anything of the parent's: the first
//! time it asks for its registry it leaks the parent's and builds its own, and a file opened in
//! the parent finds the child's pool for the same key ([`pool_in_this_process`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::threads::pool_threads;
use super::{DevicePool, PoolStats};
use crate::blockdev::{DevId, Resolver};
use crate::config::Settings;
use crate::sys;

/// The pools of one process and the threads they have started.
pub(crate) struct Process {
    /// The process these pools belong to.
    pid: u32,
    /// Pools by key. A pool is leaked on creation: it lives as long as the process (its threads
    /// never end while it has work), and so can be lent out as `&'static`.
    pools: Mutex<HashMap<String, &'static Arc<DevicePool>>>,
    /// Threads started by all pools of this process (checked against the global cap).
    pub(super) threads: AtomicUsize,
}

impl Process {
    /// Whether this is the calling process's registry (not one inherited through `fork`).
    /// Compared by identity, not by id: a registry inherited from a process long gone stays
    /// foreign even if this process was given that process's id again.
    pub(super) fn is_current(&self) -> bool {
        std::ptr::eq(self, process())
    }
}

/// The registry of the process that last asked for one: null, or a pointer from `Box::into_raw`
/// that is never freed (a child replaces its parent's and leaks it: see the module docs).
static CURRENT: AtomicPtr<Process> = AtomicPtr::new(std::ptr::null_mut());

/// The calling process's registry, built on first use in each process.
pub(super) fn process() -> &'static Process {
    let pid = sys::process_id();
    loop {
        let seen = CURRENT.load(Ordering::Acquire);
        // SAFETY: `CURRENT` holds null or a pointer published below, which is never freed and
        // only read through shared references.
        if let Some(p) = unsafe { seen.as_ref() } {
            if p.pid == pid {
                return p;
            }
        }
        let fresh = Box::into_raw(Box::new(Process {
            pid,
            pools: Mutex::new(HashMap::new()),
            threads: AtomicUsize::new(0),
        }));
        // The one seen (null, or the parent's) is left as it is: leaked, never locked.
        match CURRENT.compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published; it is never freed.
            Ok(_) => return unsafe { &*fresh },
            // Another thread of this process installed one first: use that one.
            // SAFETY: `fresh` came from `Box::into_raw` above and was never published.
            Err(_) => drop(unsafe { Box::from_raw(fresh) }),
        }
    }
}

/// The key of the one pool every file shares when per-device pools are off.
const GLOBAL_KEY: &str = "global";

/// The pool a file on device `st_dev` belongs to, sized by [`pool_threads`], and whether the
/// file lives on a block device (a local file system, not NFS/FUSE/tmpfs). With per-device pools
/// off, every file shares the pool `global` (sized for the device of the file that opened it).
pub(crate) fn pool_for_device(
    st_dev: u64,
    settings: &Settings,
) -> (&'static Arc<DevicePool>, bool) {
    let dev = DevId::from_st_dev(st_dev);
    let stack = Resolver::system().device(dev).ok();
    let local = stack.as_ref().is_some_and(|s| s.has_block_device());
    let key = match &stack {
        Some(s) => s.pool.to_string(),
        // Unknown to sysfs (a device that vanished, a container without /sys): a pool of its own.
        None => format!("dev:{dev}"),
    };
    let key = if settings.per_device_pools {
        key
    } else {
        GLOBAL_KEY.to_string()
    };
    let threads = pool_threads(&key, stack.as_deref(), settings);
    (pool_for(&key, threads), local)
}

/// This process's pool for `key`, created (without threads, for `threads` threads) if it has
/// none yet.
fn get_or_create(key: &str, threads: usize) -> &'static Arc<DevicePool> {
    let process = process();
    let mut pools = process.pools.lock().unwrap_or_else(|p| p.into_inner());
    pools
        .entry(key.to_string())
        .or_insert_with(|| Box::leak(Box::new(DevicePool::new(key.to_string(), threads))))
}

/// The pool for `key`, created (without threads) on first use, sized for `threads` threads.
/// A later call with another size resizes it: growing takes effect with the next request;
/// shrinking ends surplus threads as soon as they finish their current task.
pub(crate) fn pool_for(key: &str, threads: usize) -> &'static Arc<DevicePool> {
    let pool = get_or_create(key, threads);
    let old = pool.max_threads.swap(threads.max(1), Ordering::Relaxed);
    if threads < old {
        pool.ready.notify_all();
    }
    pool
}

/// The calling process's pool in place of `opened`, a pool another process (the parent this one
/// was forked from) built: the pool for the same key, created with the same size if this process
/// has none yet. Nothing of `opened` is locked; only its key and size are read.
pub(crate) fn pool_in_this_process(opened: &DevicePool) -> &'static Arc<DevicePool> {
    get_or_create(opened.key(), opened.width())
}

/// Statistics of every pool this process has started so far, sorted by key (a forked child
/// shows only its own pools, not its parent's).
pub fn stats() -> Vec<PoolStats> {
    let pools: Vec<&'static Arc<DevicePool>> = {
        let reg = process().pools.lock().unwrap_or_else(|p| p.into_inner());
        reg.values().copied().collect()
    };
    let mut v: Vec<PoolStats> = pools.iter().map(|p| p.stats()).collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}
