//! Finding a pool: the registry of pools by key, and the choice of a file's pool at open (its
//! device's own pool, or the one `global` pool). Sizes come from [`super::threads`]; the pools
//! themselves (workers, queues, scheduling) are `pool/mod.rs`. Lock order: the registry lock is
//! held only to find or insert a pool, never while a pool's queue lock is taken.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use super::threads::pool_threads;
use super::{DevicePool, PoolStats};
use crate::blockdev::{DevId, Resolver};
use crate::config::Settings;

/// The key of the one pool every file shares when per-device pools are off.
const GLOBAL_KEY: &str = "global";

/// The pool a file on device `st_dev` belongs to, sized by [`pool_threads`], and whether the
/// file lives on a block device (a local file system, not NFS/FUSE/tmpfs). With per-device pools
/// off, every file shares the pool `global` (sized for the device of the file that opened it).
pub(crate) fn pool_for_device(st_dev: u64, settings: &Settings) -> (Arc<DevicePool>, bool) {
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

fn registry() -> &'static Mutex<HashMap<String, Arc<DevicePool>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<DevicePool>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The pool for `key`, created (without threads) on first use, sized for `threads` threads.
/// A later call with another size resizes it: growing takes effect with the next request;
/// shrinking ends surplus threads as soon as they finish their current task.
pub(crate) fn pool_for(key: &str, threads: usize) -> Arc<DevicePool> {
    let pool = {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            reg.entry(key.to_string())
                .or_insert_with(|| DevicePool::new(key.to_string(), threads)),
        )
    };
    let old = pool.max_threads.swap(threads.max(1), Ordering::Relaxed);
    if threads < old {
        pool.ready.notify_all();
    }
    pool
}

/// Statistics of every pool started so far, sorted by key.
pub fn stats() -> Vec<PoolStats> {
    let pools: Vec<Arc<DevicePool>> = {
        let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.values().cloned().collect()
    };
    let mut v: Vec<PoolStats> = pools.iter().map(|p| p.stats()).collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}
