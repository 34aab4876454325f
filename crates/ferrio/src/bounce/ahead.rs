//! Ring memory made ahead: bounce buffers faulted in before the first GPU read asks for them.
//!
//! Fresh memory is the slow part of a ring's set-up. The kernel zeroes every page it hands
//! out, and on the H200 machine that ran at about 5 GiB/s however many threads asked (64 MiB of
//! huge pages: 13.5 ms from one thread, 16.9 ms from 16), while registering memory already
//! faulted in took 0.1 ms per 2 MiB call and 1.7 ms for 64 MiB in one
//! (`benchmarks/ring_setup.py`).
//! A fresh process's first read into GPU memory waited ~12 ms for its 16 workers' rings, all of
//! it on the critical path.
//!
//! [`prepare_pinned_soon`] maps and faults in one GPU's worth of ring buffers, as one huge-page
//! mapping (the *slab*), on a short-lived thread of its own, where that can pay: the process can
//! see an NVIDIA driver but has not started CUDA yet, rings are mapped by ferrio in huge pages
//! (`pinned_memory=mapped`), and the machine has one NUMA node (elsewhere rings go on the GPU's
//! node, which takes the driver to find out). The Python package calls it on import, the CLI
//! before it starts the driver for a GPU read. The first ring buffer
//! [`CudaEngine`](super::CudaEngine) asks for once the slab is whole registers all of it with one
//! call (for every context); rings take their buffers from it while any are left, and map fresh
//! ones after. A buffer freed goes back to the slab, still pinned. The slab is not pinned before
//! that first ask, and stays mapped (resident) until the process exits; its buffers count
//! against `pinned_limit` only while a ring holds them. A forked child never takes its parent's
//! (the mapping is not inherited).

use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::{trace, PINNED_ALIGN};
use crate::blockdev::DiskKind;
use crate::config::Settings;
use crate::error::Result;
use crate::topology::{self, Pinning};
use crate::{pool, sys};

/// Ring buffers made ahead for this process.
struct Made {
    /// Bytes of each buffer (the rings' buffer size, page-rounded).
    len: usize,
    /// Start and mapped length of the slab, once it is whole.
    slab: Option<(usize, usize)>,
    /// Whether the slab is registered with the driver; `None` until first asked, `Some(false)`
    /// once the driver refused (then it is left alone).
    registered: Option<bool>,
    /// Starts of the buffers no ring holds.
    free: Vec<usize>,
    /// Starts of the buffers a ring held and gave back: not zero any more.
    used: HashSet<usize>,
}

/// The process that claimed [`MADE`] (0: none). Checked before the lock, so that a forked child
/// never waits on a lock its parent held at the fork.
static OWNER: AtomicU32 = AtomicU32::new(0);
static MADE: Mutex<Option<Made>> = Mutex::new(None);

/// Maps and faults in the memory of one GPU's bounce rings on a background thread, where the
/// settings and the machine say a GPU read may come and the memory can be used for it; returns
/// at once. A process's first GPU read then pins that memory (one call) instead of getting fresh
/// memory, whose zeroing by the kernel is the slow part of its set-up. Only on a machine with an
/// NVIDIA driver and one NUMA node, with `pinned_memory=mapped` and transparent huge pages, and
/// not in a process that holds an active CUDA primary context already (a read may then come at
/// once, and would compete with the faulting). Once per process: later calls do nothing. Off
/// with `pinned_ahead=off`.
pub fn prepare_pinned_soon() {
    let Some((len, count)) = worth_making(&Settings::current()) else {
        return;
    };
    if !claim(len) {
        return;
    }
    // Best effort: without a thread the first read maps its buffers itself, as it would anyway.
    let _ = std::thread::Builder::new()
        .name("ferrio-pin-ahead".into())
        .spawn(move || {
            // A process whose GPU library has started CUDA already may read at any moment: the
            // slab's faulting would then compete with that read's rings for fresh memory (an
            // 8 GiB load right after `import ferrio` in such a process ran at 41.6 GiB/s, against
            // 45.1 with the import before CUDA started; `benchmarks/RESULTS.md`, "Checkpoints",
            // session 18). Asked here, off the import: it looks the driver up.
            let started = trace::start();
            let active = crate::cuda::primary_context_active();
            trace::record("ahead-check", started, u64::from(active));
            if !active {
                let started = trace::start();
                make(len, count);
                trace::record("ahead-made", started, (len * count) as u64);
            }
        });
}

/// The buffer size and count to make ahead under `settings` on this machine, or `None` where
/// that cannot pay.
fn worth_making(settings: &Settings) -> Option<(usize, usize)> {
    if !settings.pinned_ahead || !nvidia_driver_present() {
        return None;
    }
    let len = usize::try_from(settings.bounce_buffer_bytes())
        .ok()?
        .checked_next_multiple_of(PINNED_ALIGN)?;
    let one_node = topology::online_nodes(std::path::Path::new("/sys")).ok()?.len() <= 1;
    let mapped = Pinning::Mapped {
        huge: true,
        node: None,
    };
    // `pinning` answers `Mapped` only for `pinned_memory=mapped`, in huge pages only where the
    // kernel gives them to buffers this large.
    if !one_node || topology::pinning(settings.pinned_memory, len, None) != mapped {
        return None;
    }
    Some((len, buffers_for(settings, len))).filter(|&(_, count)| count > 0)
}

/// Buffers of `len` bytes in one GPU's rings under `settings`: a ring for each of
/// [`ring_workers`], full, within the pinned cap.
fn buffers_for(settings: &Settings, len: usize) -> usize {
    let cap = usize::try_from(settings.pinned_limit / len as u64).unwrap_or(usize::MAX);
    ring_workers(settings)
        .saturating_mul(settings.bounce_buffers)
        .min(cap)
}

/// The workers whose rings one GPU read is likely to use under `settings`: those of a pool of
/// one solid-state disk.
pub(super) fn ring_workers(settings: &Settings) -> usize {
    match settings.threads_per_device {
        0 => pool::default_threads(DiskKind::Nvme),
        n => n,
    }
}

/// Whether the NVIDIA kernel driver lists a GPU: asked without loading the CUDA library.
fn nvidia_driver_present() -> bool {
    std::fs::read_dir("/proc/driver/nvidia/gpus").is_ok_and(|mut gpus| gpus.next().is_some())
}

/// Records that this process makes buffers of `len` bytes ahead; false if it already does.
fn claim(len: usize) -> bool {
    let owner = sys::process_id();
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if OWNER.load(Ordering::Acquire) == owner {
        return false;
    }
    *made = Some(Made {
        len,
        slab: None,
        registered: None,
        free: Vec::new(),
        used: HashSet::new(),
    });
    OWNER.store(owner, Ordering::Release);
    true
}

/// The made-ahead state, locked, if this process claimed it.
fn made() -> Option<std::sync::MutexGuard<'static, Option<Made>>> {
    if OWNER.load(Ordering::Acquire) != sys::process_id() {
        return None;
    }
    Some(MADE.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Maps and faults in the slab of `count` buffers of `len` bytes, and hands it out.
fn make(len: usize, count: usize) {
    let Some(total) = len.checked_mul(count) else {
        return;
    };
    let Ok((p, mapped_len)) = sys::numa::map_anonymous(total, None, true) else {
        return; // short of memory: the rings map their own, or go without
    };
    let start = p.as_ptr() as usize;
    if let Some(mut made) = made() {
        if let Some(m) = made.as_mut().filter(|m| m.len == len && m.slab.is_none()) {
            m.slab = Some((start, mapped_len));
            m.free = (0..count).rev().map(|i| start + i * len).collect();
            return;
        }
    }
    // SAFETY: mapped just above with this length, never handed out.
    let _ = unsafe { sys::numa::unmap(p, mapped_len) };
}

/// A ring buffer of `len` bytes from the slab, if it is whole and one is left; the first take
/// registers the whole slab with `register(start, len)` (a refusal leaves the slab alone).
/// The buffer is the caller's until [`give_back`]. Never in a forked child.
pub(super) fn take(
    len: usize,
    register: impl FnOnce(NonNull<u8>, usize) -> Result<()>,
) -> Option<NonNull<u8>> {
    let mut made = made()?;
    let m = made.as_mut().filter(|m| m.len == len)?;
    let (start, mapped_len) = m.slab?;
    if m.free.is_empty() {
        return None;
    }
    if m.registered.is_none() {
        let start = NonNull::new(start as *mut u8)?;
        m.registered = Some(register(start, mapped_len).is_ok());
    }
    if m.registered != Some(true) {
        return None;
    }
    m.free.pop().and_then(|addr| NonNull::new(addr as *mut u8))
}

/// Takes back a buffer from [`take`] that no copy uses any more; false if `ptr` is not one.
pub(super) fn give_back(ptr: NonNull<u8>) -> bool {
    let Some(mut made) = made() else {
        return false;
    };
    let Some(m) = made.as_mut() else {
        return false;
    };
    let addr = ptr.as_ptr() as usize;
    match m.slab {
        Some((start, mapped_len)) if (start..start + mapped_len).contains(&addr) => {
            m.used.insert(addr);
            m.free.push(addr);
            true
        }
        _ => false,
    }
}

/// Whether `ptr` is a buffer of the slab that no ring has given back yet: zero, as the kernel
/// handed it out.
pub(super) fn still_zero(ptr: NonNull<u8>) -> bool {
    let Some(made) = made() else {
        return false;
    };
    let addr = ptr.as_ptr() as usize;
    made.as_ref().is_some_and(|m| {
        m.slab
            .is_some_and(|(start, len)| (start..start + len).contains(&addr))
            && !m.used.contains(&addr)
    })
}

#[cfg(any(test, feature = "testing"))]
/// Makes the slab of `count` buffers of `len` bytes now, on the calling thread, whatever the
/// machine (the tests' [`prepare_pinned_soon`]); false, making none, if this process already
/// makes some.
pub fn make_ahead_now(len: usize, count: usize) -> bool {
    if !claim(len) {
        return false;
    }
    make(len, count);
    true
}

#[cfg(any(test, feature = "testing"))]
/// The start and mapped length of the slab, and how many of its buffers no ring holds.
pub fn made_ahead() -> Option<(usize, usize, usize)> {
    let made = made()?;
    let m = made.as_ref()?;
    m.slab.map(|(start, len)| (start, len, m.free.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slab's buffers are handed out once each, only for their size, zero until given
    /// back; the slab is registered once, at the first take; a second claim makes no more.
    #[test]
    fn slab_buffers_are_taken_once_each_and_come_back() {
        let len = 64 << 10;
        assert!(make_ahead_now(len, 3));
        assert!(!claim(len), "one claim per process");
        let (start, total, free) = made_ahead().expect("a slab");
        assert_eq!((total, free), (3 * len, 3));
        let register_other = |_: NonNull<u8>, _: usize| -> Result<()> { panic!("registered") };
        assert!(take(2 * len, register_other).is_none(), "another size handed out");
        let mut registered = Vec::new();
        let first = take(len, |p, n| {
            registered.push((p.as_ptr() as usize, n));
            Ok(())
        })
        .expect("a buffer");
        assert_eq!(registered, vec![(start, total)], "the slab, registered whole");
        let mut taken = vec![first];
        while let Some(p) = take(len, |_, _| panic!("registered twice")) {
            taken.push(p);
        }
        assert_eq!(taken.len(), 3);
        let mut starts: Vec<usize> = taken.iter().map(|p| p.as_ptr() as usize).collect();
        starts.sort_unstable();
        assert_eq!(starts, vec![start, start + len, start + 2 * len]);
        for &p in &taken {
            assert!(still_zero(p));
            // SAFETY: `p..p+len` is a slab buffer taken above, ours until given back.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
            assert!(bytes.iter().all(|&b| b == 0), "not zero-filled");
            bytes.fill(0xAB);
        }
        assert!(give_back(taken[1]));
        assert!(!still_zero(taken[1]), "a buffer given back is not zero");
        let again = take(len, |_, _| panic!("registered twice")).expect("the buffer back");
        assert_eq!(again, taken[1]);
        let mut elsewhere = [0u8; 8];
        assert!(!give_back(NonNull::from(&mut elsewhere).cast()));
    }

    /// The count follows the threads and ring depth, and the pinned cap bounds it.
    #[test]
    fn count_follows_the_rings_and_the_cap() {
        let mut s = Settings {
            threads_per_device: 12,
            bounce_buffers: 3,
            pinned_limit: 1 << 30,
            ..Settings::default()
        };
        assert_eq!(buffers_for(&s, 2 << 20), 36);
        s.pinned_limit = 10 << 20;
        assert_eq!(buffers_for(&s, 2 << 20), 5);
        s.pinned_ahead = false;
        assert_eq!(worth_making(&s), None);
    }
}
