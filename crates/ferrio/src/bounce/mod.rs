//! The per-worker pinned bounce-buffer ring: how file bytes reach device memory and back.
//!
//! A [`BounceRing`] owns K page-aligned pinned host buffers of B bytes, one stream and one event
//! per buffer. Reading a range into device memory goes chunk by chunk: wait for buffer i only if
//! its previous copy is still running, let the caller read file bytes into it (the engine's
//! `pread` or `O_DIRECT` happens there), start the host-to-device copy of those bytes on the
//! stream, record event i, go on with buffer i+1 — so reading chunk i+1 overlaps copying chunk i.
//! Writing mirrors it: up to K device-to-host copies are in flight while the caller writes the
//! oldest finished one to the file. A call returns only when every copy it started has finished,
//! except [`BounceRing::start_read_to_device`], which leaves the last copies running so that a
//! worker reading one task after another never waits for the copy engine between them; the
//! engine's device reads use it and settle with [`BounceRing::finish`] before they report (see
//! [`crate::pool`]: a worker settles before it goes idle or turns to another request).
//!
//! The ring is generic over [`CopyEngine`], a small trait over pinned memory, streams, events and
//! asynchronous copies, so the same code runs against the real driver
//! ([`CudaEngine`]) and against [`emulated::EmulatedDevice`], a device emulated in host memory
//! that lets CI check ordering, overlap and buffer reuse without a GPU.
//!
//! Rings are made once per (worker thread, CUDA context) and reused: [`read_to_device`] and
//! [`write_from_device`] find the calling thread's ring in a thread-local [`RingSet`]. All rings,
//! and the piece pools, share one cap on pinned memory ([`PinnedBudget`], from
//! [`Settings::pinned_limit`]).
//!
//! A fresh ring pins all its buffers before its first copy. What makes that quick in a fresh
//! process: the buffers' memory is faulted in ahead, in the background, where a GPU read may
//! come (`ahead.rs`: fresh memory, not the pinning, is the slow part); the first ring of a
//! context makes the other rings' streams and events in the same pass, before any copy runs
//! ([`CudaEngine`]); and where the memory is fresh, rings take turns to get it
//! ([`PinnedBudget`]), so the first start copying while the others wait. (Pinning only the first
//! buffer and the rest later was measured twice and gained nothing; `benchmarks/RESULTS.md`,
//! "First call" and "Checkpoints", sessions 18-19.)
//! `FERRIO_TRACE=1` writes a timeline of the set-up and first copies at exit (`trace.rs`).
//!
//! This module does no file I/O and no pointer classification; the ring never calls the driver
//! except through a [`CopyEngine`]. The files:
//!
//! - `mod.rs`: the [`CopyEngine`] trait, [`PINNED_ALIGN`] and the shared [`PinnedBudget`];
//! - `ahead.rs`: ring memory faulted in ahead ([`prepare_pinned_soon`]);
//! - `ring.rs`: [`BounceRing`], one ring and its copy loop;
//! - `pieces.rs`: [`PiecePool`] and [`PieceCopies`], pinned pieces that many tasks fill at once
//!   and out of order (ranged GETs of a remote object) and that are copied to the device
//!   straight from there, with the per-context pools of the real driver;
//! - `thread_rings.rs`: [`RingSet`] and the calling thread's rings behind [`read_to_device`],
//!   [`write_from_device`] and the other free functions;
//! - `trace.rs`: the opt-in timeline (`FERRIO_TRACE`);
//! - `cuda.rs`: [`CudaEngine`], the engine over the real driver (through [`crate::cuda`]);
//! - `emulated.rs`: [`emulated::EmulatedDevice`], the engine emulated in host memory.

mod ahead;
mod cuda;
#[cfg(any(test, feature = "testing"))]
pub mod emulated;
mod pieces;
mod ring;
mod thread_rings;
pub(crate) mod trace;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use crate::config::Settings;
use crate::cuda::DevicePtr;
use crate::error::Result;

pub use self::ahead::prepare_pinned_soon;
#[cfg(any(test, feature = "testing"))]
pub use self::ahead::{made_ahead, make_ahead_now};
pub use self::cuda::CudaEngine;
pub(crate) use pieces::cuda_piece_pool;
pub use pieces::{Piece, PieceCopies, PiecePool};
#[cfg(any(test, feature = "testing"))]
pub use pieces::MIN_PIECES;
pub use ring::BounceRing;
#[cfg(any(test, feature = "testing"))]
pub use ring::RingStats;
pub use thread_rings::{
    finish_thread_ring, release_thread_rings, start_read_to_device, write_from_device,
};
#[cfg(any(test, feature = "testing"))]
pub use thread_rings::{read_to_device, thread_ring_stats, RingSet};

/// Alignment of every bounce buffer's start and length: `O_DIRECT` reads land in them.
pub const PINNED_ALIGN: usize = 4096;

/// What a bounce ring needs from a device: pinned host memory, a stream, events, and
/// asynchronous copies in both directions, all in one device context.
///
/// Streams execute their copies in the order they were issued; an event recorded on a stream
/// completes when everything issued on the stream before it has. Every method except
/// [`bind`](CopyEngine::bind) may assume the caller holds a binding.
pub trait CopyEngine {
    /// A stream: an in-order queue of copies.
    type Stream;
    /// An event: a marker that completes when the work before it on a stream has.
    type Event;
    /// Keeps the engine's context current on the calling thread while it lives.
    type Binding;

    /// Makes the engine's context current on this thread until the binding is dropped.
    ///
    /// # Errors
    /// When the context cannot be made current.
    fn bind(&self) -> Result<Self::Binding>;

    /// Allocates `len` bytes of pinned (page-locked) host memory. The ring checks alignment
    /// itself and asks again with room to align when the start is not page-aligned.
    ///
    /// # Errors
    /// When the memory cannot be allocated or pinned.
    fn alloc_pinned(&self, len: usize) -> Result<NonNull<u8>>;

    /// Whether the memory [`alloc_pinned`](CopyEngine::alloc_pinned) returned at `ptr` is
    /// already zero-filled and resident, so that a buffer need not be written before use. By
    /// default it is not, and the buffer is zero-filled when made.
    fn pinned_is_zeroed(&self, _ptr: NonNull<u8>) -> bool {
        false
    }

    /// Frees memory from [`alloc_pinned`](CopyEngine::alloc_pinned).
    ///
    /// # Safety
    /// `ptr` and `len` must come from one `alloc_pinned` call of this engine, the memory must be
    /// freed once, and no copy may still use it.
    ///
    /// # Errors
    /// When the driver refuses.
    unsafe fn free_pinned(&self, ptr: NonNull<u8>, len: usize) -> Result<()>;

    /// Creates a stream that does not wait for other streams.
    ///
    /// # Errors
    /// When the driver refuses.
    fn create_stream(&self) -> Result<Self::Stream>;

    /// Destroys a stream; copies still queued on it complete first.
    ///
    /// # Errors
    /// When the driver refuses.
    fn destroy_stream(&self, stream: Self::Stream) -> Result<()>;

    /// Creates an event (complete until first recorded).
    ///
    /// # Errors
    /// When the driver refuses.
    fn create_event(&self) -> Result<Self::Event>;

    /// Destroys an event.
    ///
    /// # Errors
    /// When the driver refuses.
    fn destroy_event(&self, event: Self::Event) -> Result<()>;

    /// Records `event` on `stream`: it completes when all work issued on `stream` so far has.
    ///
    /// # Errors
    /// When the driver refuses.
    fn record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;

    /// Whether the work before the last record of `event` has completed (never blocks).
    ///
    /// # Errors
    /// When that work failed, or the driver refuses.
    fn is_complete(&self, event: &Self::Event) -> Result<bool>;

    /// Blocks until the work before the last record of `event` has completed.
    ///
    /// # Errors
    /// When that work failed, or the driver refuses.
    fn wait_event(&self, event: &Self::Event) -> Result<()>;

    /// Blocks until all work issued on `stream` has completed.
    ///
    /// # Errors
    /// When that work failed, or the driver refuses.
    fn wait_stream(&self, stream: &Self::Stream) -> Result<()>;

    /// Starts copying `len` bytes from pinned host memory at `src` to device memory at `dst`,
    /// after the work already issued on `stream`.
    ///
    /// # Safety
    /// `src..src+len` must lie in memory from [`alloc_pinned`](CopyEngine::alloc_pinned) of this
    /// engine, and must not be written or freed until the copy has completed (an event recorded
    /// after it has); `dst..dst+len` must be device memory reachable from the engine's context.
    ///
    /// # Errors
    /// When the copy cannot be started (a bad address, say); failures while it runs are
    /// reported by the next wait.
    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: &Self::Stream,
    ) -> Result<()>;

    /// Starts copying `len` bytes from device memory at `src` to pinned host memory at `dst`,
    /// after the work already issued on `stream`.
    ///
    /// # Safety
    /// `dst..dst+len` must lie in memory from [`alloc_pinned`](CopyEngine::alloc_pinned) of this
    /// engine, and must not be read, written or freed until the copy has completed; `src..src+len`
    /// must be device memory reachable from the engine's context, not changed until then.
    ///
    /// # Errors
    /// As for [`copy_to_device`](CopyEngine::copy_to_device).
    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: &Self::Stream,
    ) -> Result<()>;
}

/// The cap on pinned memory held by bounce rings (and piece pools), shared by every ring and
/// pool made with it.
///
/// The cap is soft by design: a ring always gets its first buffer, even past the cap, so a read
/// never fails (or waits for another worker's ring, which may never be given back) because of
/// the cap. Past that first buffer a ring takes only what fits, and tries again to reach its
/// full depth at the start of later calls. So the pinned memory in use stays below
/// `limit + (number of rings) × buffer size`.
///
/// The budget also takes turns: at most [`set_pinning_threads`](Self::set_pinning_threads)
/// rings get a buffer at once. Fresh pinned memory comes at the rate the kernel zeroes pages,
/// whoever asks; 16 workers asking together all wait for nearly all of it, while a few at a
/// time get their rings, and start copying, one after another.
#[derive(Debug)]
pub struct PinnedBudget {
    limit: AtomicU64,
    used: AtomicU64,
    /// Rings allowed to get a buffer at once (0: any number).
    turns: AtomicUsize,
    /// Rings getting a buffer now, and the process they are in: a forked child does not
    /// inherit its parent's turns (their threads are not in it).
    pinning: Mutex<(u32, usize)>,
    turn_over: Condvar,
}

/// A ring's turn to get a buffer ([`PinnedBudget::turn`]); the next waiting ring's when dropped.
#[derive(Debug)]
pub(crate) struct Turn<'a>(&'a PinnedBudget);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut pinning = self.0.pinning();
        pinning.1 = pinning.1.saturating_sub(1);
        drop(pinning);
        self.0.turn_over.notify_one();
    }
}

impl PinnedBudget {
    /// A budget of `limit` bytes, nothing used.
    pub fn new(limit: u64) -> PinnedBudget {
        PinnedBudget {
            limit: AtomicU64::new(limit),
            used: AtomicU64::new(0),
            turns: AtomicUsize::new(0),
            pinning: Mutex::new((0, 0)),
            turn_over: Condvar::new(),
        }
    }

    /// The process-wide budget of the thread-local rings, starting from
    /// [`Settings::global`]'s `pinned_limit`.
    pub fn global() -> &'static Arc<PinnedBudget> {
        static GLOBAL: OnceLock<Arc<PinnedBudget>> = OnceLock::new();
        GLOBAL.get_or_init(|| Arc::new(PinnedBudget::new(Settings::global().pinned_limit)))
    }

    /// The cap in bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Changes the cap; rings already made keep their buffers.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// How many rings may get a buffer at once (0: any number; `pinning_threads`).
    pub fn set_pinning_threads(&self, threads: usize) {
        if self.turns.swap(threads, Ordering::Relaxed) != threads {
            // Taken under the lock, so that no ring checks the old limit and then misses this.
            let _pinning = self.pinning();
            self.turn_over.notify_all();
        }
    }

    /// Waits for a turn to get a buffer, if turns are limited; the turn lasts while the
    /// returned value lives.
    pub(crate) fn turn(&self) -> Option<Turn<'_>> {
        let mut pinning = self.pinning();
        loop {
            let turns = self.turns.load(Ordering::Relaxed);
            if turns == 0 {
                return None;
            }
            if pinning.1 < turns {
                pinning.1 += 1;
                return Some(Turn(self));
            }
            pinning = self
                .turn_over
                .wait(pinning)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The count of rings getting a buffer in this process, locked.
    fn pinning(&self) -> MutexGuard<'_, (u32, usize)> {
        let mut pinning = self.pinning.lock().unwrap_or_else(|e| e.into_inner());
        let process = crate::sys::process_id();
        if pinning.0 != process {
            *pinning = (process, 0);
        }
        pinning
    }

    #[cfg(any(test, feature = "testing"))]
    /// Pinned bytes held by rings of this budget now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if they fit under the cap.
    fn try_take(&self, bytes: u64) -> bool {
        let limit = self.limit();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .is_ok()
    }

    /// Takes `bytes` whether they fit or not (a ring's first buffer).
    fn take_anyway(&self, bytes: u64) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// With turns limited to 2, a third ring waits until one of two holding a turn lets go;
    /// unlimited, nobody waits.
    #[test]
    fn rings_take_turns_to_get_buffers() {
        let budget = Arc::new(PinnedBudget::new(u64::MAX));
        assert!(budget.turn().is_none(), "turns are unlimited by default");
        budget.set_pinning_threads(2);
        let first = budget.turn().expect("a turn");
        let second = budget.turn().expect("a second turn");
        let got = Arc::new(AtomicBool::new(false));
        let third = std::thread::spawn({
            let (budget, got) = (budget.clone(), got.clone());
            move || {
                let turn = budget.turn();
                got.store(true, Ordering::SeqCst);
                turn.is_some()
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!got.load(Ordering::SeqCst), "a third ring got a turn while two held one");
        drop(first);
        assert!(third.join().expect("third ring"), "the third ring's turn");
        assert!(got.load(Ordering::SeqCst));
        drop(second);
        // Lifting the limit lets a waiting ring go at once.
        let held = [budget.turn().expect("turn"), budget.turn().expect("turn")];
        let waiting = std::thread::spawn({
            let budget = budget.clone();
            move || budget.turn().is_none()
        });
        std::thread::sleep(Duration::from_millis(20));
        budget.set_pinning_threads(0);
        assert!(waiting.join().expect("waiting ring"), "no turn needed once unlimited");
        drop(held);
        assert_eq!(budget.pinning().1, 0, "every turn given back");
        // Turns counted in another process (a parent before a fork) are not this process's.
        budget.set_pinning_threads(1);
        *budget.pinning.lock().unwrap() = (crate::sys::process_id().wrapping_add(1), 5);
        assert!(budget.turn().is_some(), "a parent's turns held a forked child back");
    }
}
