//! The rings of a thread: [`RingSet`] (one ring per engine, remade when the settings change)
//! and the calling thread's set for the real driver, behind [`read_to_device`],
//! [`start_read_to_device`], [`finish_thread_ring`], [`write_from_device`],
//! [`release_thread_rings`] and [`thread_ring_stats`].
//!
//! The thread-local set is never dropped: rings of a thread that exits without
//! [`release_thread_rings`] are leaked, because dropping them calls the driver, which may be gone
//! at process exit. This file never calls the driver except through a ring's engine.

use std::cell::RefCell;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use super::{BounceRing, CopyEngine, CudaEngine, PinnedBudget, PINNED_ALIGN};
use crate::config::Settings;
use crate::cuda::{Context, DevicePtr};
use crate::error::{Error, Result};

/// The rings of one thread, one per engine (per CUDA context for the real driver), made on
/// first use and reused.
///
/// A set remakes a ring when the settings ask for another buffer size or depth, and replaces a
/// poisoned ring (leaking the old one). Dropping the set drops its rings, which calls the
/// engine: [`read_to_device`] keeps its set in a thread-local that is never dropped.
#[derive(Debug)]
pub struct RingSet<E: CopyEngine> {
    budget: Arc<PinnedBudget>,
    rings: Vec<BounceRing<E>>,
}

impl<E: CopyEngine + PartialEq> RingSet<E> {
    /// An empty set whose rings share `budget`.
    pub fn new(budget: Arc<PinnedBudget>) -> RingSet<E> {
        RingSet {
            budget,
            rings: Vec::new(),
        }
    }

    /// The ring for `engine`, made with `settings` (buffer size, depth, pinned cap, and whether
    /// it grows in the background) if there is none or the one there was made with other sizes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a buffer size that does not fit in memory; otherwise the
    /// errors of [`BounceRing::new`].
    pub fn ring(&mut self, engine: &E, settings: &Settings) -> Result<&mut BounceRing<E>>
    where
        E: Clone + Send + 'static,
    {
        let buffer_len = usize::try_from(settings.bounce_buffer_bytes())
            .unwrap_or(usize::MAX)
            .checked_next_multiple_of(PINNED_ALIGN)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "bounce buffer size {} is too large",
                    settings.bounce_buffer_bytes()
                ))
            })?;
        let depth = settings.bounce_buffers.max(1);
        self.budget.set_limit(settings.pinned_limit);
        self.budget.set_pinning_threads(settings.pinning_threads);
        if let Some(pos) = self.rings.iter().position(|r| r.engine() == engine) {
            let ring = &self.rings[pos];
            if ring.is_poisoned() {
                // Dropping a poisoned ring leaks its resources (see `BounceRing`).
                drop(self.rings.swap_remove(pos));
            } else if ring.buffer_len() != buffer_len || ring.depth() != depth {
                drop(self.rings.swap_remove(pos));
            } else {
                return Ok(&mut self.rings[pos]);
            }
        }
        let budget = self.budget.clone();
        let ring = BounceRing::new(engine.clone(), buffer_len, depth, budget)?;
        self.rings.push(ring);
        let last = self.rings.len() - 1;
        Ok(&mut self.rings[last])
    }

    /// Drops every ring of the set, freeing their pinned memory.
    pub fn clear(&mut self) {
        self.rings.clear();
    }

    #[cfg(any(test, feature = "testing"))]
    /// Number of rings in the set.
    pub fn len(&self) -> usize {
        self.rings.len()
    }

    #[cfg(any(test, feature = "testing"))]
    /// True when the set holds no ring.
    pub fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }
}

thread_local! {
    /// The calling worker's rings for the real driver. `ManuallyDrop` on purpose: when a thread
    /// (or the process) exits, its rings are leaked rather than dropped, because dropping calls
    /// the CUDA driver, which may already be torn down at process exit (a crash or a hang).
    /// Worker threads that end normally give their rings back with [`release_thread_rings`].
    static THREAD_RINGS: RefCell<ManuallyDrop<Option<RingSet<CudaEngine>>>> =
        const { RefCell::new(ManuallyDrop::new(None)) };
}

/// Runs `f` on the calling thread's ring set (made empty on first use); `what` names the call
/// for the error when it comes from inside one of the set's own read or write callbacks.
fn with_thread_rings<R>(
    what: &str,
    f: impl FnOnce(&mut RingSet<CudaEngine>) -> Result<R>,
) -> Result<R> {
    THREAD_RINGS.with(|cell| {
        let mut set = cell.try_borrow_mut().map_err(|_| {
            Error::InvalidArgument(format!(
                "a bounce ring {what} from inside a read or write callback"
            ))
        })?;
        f(set.get_or_insert_with(|| RingSet::new(PinnedBudget::global().clone())))
    })
}

fn with_thread_ring<R>(
    context: Context,
    settings: &Settings,
    f: impl FnOnce(&mut BounceRing<CudaEngine>) -> Result<R>,
) -> Result<R> {
    let engine = CudaEngine::new(context)?.pinning(settings.pinned_memory);
    with_thread_rings(
        "transfer was started",
        |set| f(set.ring(&engine, settings)?),
    )
}

#[cfg(any(test, feature = "testing"))]
/// Reads `len` file bytes from `file_offset` into device memory at `dst` (in `context`) through
/// the calling thread's ring for that context, made on first use with `settings`.
///
/// This is the entry point for the engine's worker threads; see
/// [`BounceRing::read_to_device`] for the callback's contract and the errors. The call returns
/// when the bytes are in device memory.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a driver; otherwise as for [`BounceRing::read_to_device`].
pub fn read_to_device(
    context: Context,
    dst: DevicePtr,
    len: usize,
    file_offset: u64,
    settings: &Settings,
    read_chunk: &mut dyn FnMut(&mut [u8], u64) -> Result<usize>,
) -> Result<usize> {
    with_thread_ring(context, settings, |ring| {
        ring.read_to_device(dst, len, file_offset, read_chunk)
    })
}

/// As [`read_to_device`], but returns with the last copies possibly still running on the
/// calling thread's ring: the bytes are in device memory only after [`finish_thread_ring`] for
/// `context` on this thread (see [`BounceRing::start_read_to_device`]).
///
/// # Errors
/// As for [`read_to_device`].
pub fn start_read_to_device(
    context: Context,
    dst: DevicePtr,
    len: usize,
    file_offset: u64,
    settings: &Settings,
    read_chunk: &mut dyn FnMut(&mut [u8], u64) -> Result<usize>,
) -> Result<usize> {
    with_thread_ring(context, settings, |ring| {
        ring.start_read_to_device(dst, len, file_offset, read_chunk)
    })
}

/// Waits for every copy of the calling thread's ring for `context` (nothing to do if the thread
/// has none): the device bytes of every [`start_read_to_device`] before it are final.
///
/// # Errors
/// As for [`BounceRing::finish`].
pub fn finish_thread_ring(context: Context) -> Result<()> {
    with_thread_rings("was finished", |set| {
        match set
            .rings
            .iter_mut()
            .find(|r| r.engine().context() == context)
        {
            Some(ring) => ring.finish(),
            None => Ok(()),
        }
    })
}

/// Writes `len` bytes of device memory at `src` (in `context`) to a file from `file_offset`,
/// through the calling thread's ring for that context.
///
/// See [`BounceRing::write_from_device`] for the callback's contract and the errors.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a driver; otherwise as for
/// [`BounceRing::write_from_device`].
pub fn write_from_device(
    context: Context,
    src: DevicePtr,
    len: usize,
    file_offset: u64,
    settings: &Settings,
    write_chunk: &mut dyn FnMut(&[u8], u64) -> Result<()>,
) -> Result<usize> {
    with_thread_ring(context, settings, |ring| {
        ring.write_from_device(src, len, file_offset, write_chunk)
    })
}

/// Frees the calling thread's rings (their pinned memory goes back to the cap). Worker threads
/// call this before they exit normally; rings of threads that do not are leaked. A later
/// transfer on the thread makes new rings.
pub fn release_thread_rings() {
    THREAD_RINGS.with(|cell| {
        if let Ok(mut set) = cell.try_borrow_mut() {
            if let Some(set) = set.as_mut() {
                set.clear();
            }
        }
    });
}

#[cfg(any(test, feature = "testing"))]
/// Statistics of the calling thread's ring for `context`, if it has one.
pub fn thread_ring_stats(context: Context) -> Option<super::RingStats> {
    THREAD_RINGS.with(|cell| {
        let set = cell.try_borrow().ok()?;
        let set = set.as_ref()?;
        set.rings
            .iter()
            .find(|r| r.engine().context() == context)
            .map(BounceRing::stats)
    })
}
