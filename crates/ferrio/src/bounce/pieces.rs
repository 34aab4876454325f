//! [`PiecePool`]: pinned host buffers ("pieces") that many tasks fill at once, in any order, and
//! [`PieceCopies`], which copies filled pieces to device memory and gives each piece back only
//! once the copy that reads it has completed.
//!
//! The bounce ring ([`BounceRing`](super::BounceRing)) suits a source that one thread reads in
//! order (a file). A source whose bytes arrive on many threads at once, out of order (ranged GETs
//! of a remote object), would have to copy them into the ring; with pieces it lands them in
//! pinned memory straight away, and the only copy left is the host-to-device one.
//!
//! Ownership carries the rule that no piece is rewritten while a copy reads it: a [`Piece`]
//! handle is the only way to its bytes; [`PieceCopies::start_copy`] takes the handle and keeps
//! it until an event recorded after the copy has completed, and only dropping the handle gives
//! the piece back to the pool (so a task that is aborted mid-fill gives its piece back too).
//!
//! A pool starts empty and grows while takers wait, or ahead of them ([`PiecePool::prefill`]):
//! one piece at a time (pinning is slow, and the driver pins one allocation at a time anyway), up
//! to the number the taker asks for and what the shared [`PinnedBudget`] allows, though always to
//! [`MIN_PIECES`] (the budget's soft cap, as for rings). Pieces stay in the pool for later reads.
//! A pool frees its memory when the last handle to it goes; the pools of the real driver are kept
//! in a process-wide set that is never dropped, so at exit they are leaked, like the threads'
//! rings, rather than freed through a driver that may be gone. A copy that fails while running
//! poisons the pool: its pieces may still be read by copies nobody can wait for, so they are
//! leaked, and the set replaces the pool.
//!
//! Generic over [`CopyEngine`] like the ring; this file does no I/O and knows no source.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::ring::{alloc_buffer, PinnedBuffer};
use super::{CopyEngine, CudaEngine, PinnedBudget, PINNED_ALIGN};
use crate::config::Settings;
use crate::cuda::{Context, DevicePtr};
use crate::error::{Error, Result};

/// Pieces a pool always makes, past the pinned cap if need be: one being filled while another
/// is copied.
pub const MIN_PIECES: usize = 2;

/// A piece's memory and the event recorded after its last copy.
struct PieceBuf<V> {
    buf: PinnedBuffer,
    event: V,
}

// SAFETY: the buffer's pointers address pinned memory that belongs to this piece alone (the pool
// hands each piece to one owner at a time), so moving it to another thread moves the only access
// to that memory; the event is `Send` by the bound.
unsafe impl<V: Send> Send for PieceBuf<V> {}

struct PoolState<E: CopyEngine> {
    free: Vec<PieceBuf<E::Event>>,
    /// Streams of [`PieceCopies`] that ended, for the next ones.
    streams: Vec<E::Stream>,
    /// Pieces made and not freed: the free ones, and those out (being filled, waiting for their
    /// copy, being copied).
    pieces: usize,
    /// A piece is being made (one at a time).
    growing: bool,
    /// While a [`PiecePool::prefill`] runs, the pieces it makes the pool up to (else 0): takers
    /// leave the growing to it meanwhile.
    prefill_to: usize,
    /// Making a piece failed while the pool had some: go on with those, stop asking.
    grow_failed: bool,
    /// A copy failed while running: see the module docs.
    poisoned: bool,
}

/// A pool of pinned pieces of one size, for one engine: see the module docs.
pub struct PiecePool<E: CopyEngine> {
    engine: E,
    budget: Arc<PinnedBudget>,
    piece_len: usize,
    state: Mutex<PoolState<E>>,
    /// Signalled when a piece comes back or a new one is made (or fails to be).
    returned: Notify,
}

impl<E: CopyEngine> std::fmt::Debug for PiecePool<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("PiecePool")
            .field("piece_len", &self.piece_len)
            .field("pieces", &st.pieces)
            .field("free", &st.free.len())
            .field("poisoned", &st.poisoned)
            .finish_non_exhaustive()
    }
}

/// What [`PiecePool::take`] found.
enum Found<V> {
    Piece(PieceBuf<V>),
    /// None free; the caller makes one (it is counted already).
    Make,
    /// None free and none to be made now: wait for one to come back.
    Wait,
}

impl<E: CopyEngine> PiecePool<E> {
    /// An empty pool of pieces of `piece_len` bytes (rounded up to a multiple of
    /// [`PINNED_ALIGN`]), whose pinned memory counts against `budget`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size of zero or one too large to round up.
    pub fn new(engine: E, piece_len: usize, budget: Arc<PinnedBudget>) -> Result<PiecePool<E>> {
        let piece_len = Some(piece_len)
            .filter(|&n| n > 0)
            .and_then(|n| n.checked_next_multiple_of(PINNED_ALIGN))
            .ok_or_else(|| Error::InvalidArgument(format!("pinned piece of {piece_len} bytes")))?;
        Ok(PiecePool {
            engine,
            budget,
            piece_len,
            state: Mutex::new(PoolState {
                free: Vec::new(),
                streams: Vec::new(),
                pieces: 0,
                growing: false,
                prefill_to: 0,
                grow_failed: false,
                poisoned: false,
            }),
            returned: Notify::new(),
        })
    }

    /// The engine the pool's memory belongs to.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Bytes per piece (a multiple of [`PINNED_ALIGN`]).
    pub fn piece_len(&self) -> usize {
        self.piece_len
    }

    /// True once a copy of one of its pieces failed while running (see the module docs).
    pub fn is_poisoned(&self) -> bool {
        self.lock().poisoned
    }

    #[cfg(any(test, feature = "testing"))]
    /// Pieces made and not freed (free or out).
    pub fn pieces(&self) -> usize {
        self.lock().pieces
    }

    #[cfg(any(test, feature = "testing"))]
    /// Pieces in the pool now, free for the next taker.
    pub fn free_pieces(&self) -> usize {
        self.lock().free.len()
    }

    // Whole pushes, pops and counter updates only: a poisoned lock still holds a valid state.
    fn lock(&self) -> MutexGuard<'_, PoolState<E>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn retired() -> Error {
        Error::Cuda {
            call: "pinned piece pool",
            code: 0,
            message: "an earlier copy from this pool failed while running; the pool is retired"
                .to_string(),
        }
    }

    /// A free piece, or leave to make one (counted and budgeted here), or nothing to do but wait.
    fn find(&self, most: usize) -> Result<Found<E::Event>> {
        let mut st = self.lock();
        if st.poisoned {
            return Err(Self::retired());
        }
        if let Some(piece) = st.free.pop() {
            return Ok(Found::Piece(piece));
        }
        // A prefill running makes the next piece itself.
        let prefilling = st.prefill_to > st.pieces;
        Ok(if !prefilling && self.may_grow(&mut st, most) {
            Found::Make
        } else {
            Found::Wait
        })
    }

    /// Whether one more piece may be made now, with none being made, the pool holding fewer
    /// than `most` (and at least [`MIN_PIECES`]) and the budget room for it; if so it is counted
    /// and budgeted here, and the caller makes it ([`make_piece`](Self::make_piece)).
    fn may_grow(&self, st: &mut PoolState<E>, most: usize) -> bool {
        if st.poisoned
            || st.growing
            || (st.grow_failed && st.pieces > 0)
            || st.pieces >= most.max(MIN_PIECES)
        {
            return false;
        }
        let bytes = self.piece_len as u64;
        if st.pieces < MIN_PIECES {
            self.budget.take_anyway(bytes);
        } else if !self.budget.try_take(bytes) {
            return false;
        }
        st.pieces += 1;
        st.growing = true;
        true
    }

    /// Makes the piece [`find`](Self::find) counted, and puts it in the pool (not in the hands of
    /// the task that asked, which may be gone by now: an aborted read).
    fn make_piece(&self) -> Result<()> {
        let made = (|| {
            let _bound = self.engine.bind()?;
            let buf = alloc_buffer(&self.engine, self.piece_len)?;
            match self.engine.create_event() {
                Ok(event) => Ok(PieceBuf { buf, event }),
                Err(e) => {
                    // SAFETY: the buffer was just allocated by this engine and no copy used it.
                    let _ = unsafe { self.engine.free_pinned(buf.alloc, buf.alloc_len) };
                    Err(e)
                }
            }
        })();
        let mut st = self.lock();
        st.growing = false;
        let outcome = match made {
            Ok(piece) => {
                st.free.push(piece);
                Ok(())
            }
            Err(e) => {
                st.pieces -= 1;
                self.budget.give_back(self.piece_len as u64);
                // With pieces to go round, go on with those; with none, the takers see the error.
                st.grow_failed = st.pieces > 0;
                Err(e)
            }
        };
        drop(st);
        // A waiter takes the new piece, or makes the next one.
        self.returned.notify_one();
        outcome
    }

    /// Gives a piece back (no copy reads it any more).
    fn give(&self, piece: PieceBuf<E::Event>) {
        self.lock().free.push(piece);
        self.returned.notify_one();
    }

    /// Marks the pool poisoned (a copy of one of its pieces failed while running).
    fn poison(&self) {
        self.lock().poisoned = true;
        // Waiters find out instead of waiting for pieces that never come back.
        self.returned.notify_waiters();
    }
}

impl<E> PiecePool<E>
where
    E: CopyEngine + Send + Sync + 'static,
    E::Event: Send,
    E::Stream: Send,
{
    /// Starts making pieces on one of `runtime`'s blocking threads, back to back, until the
    /// pool holds `want` (as far as the budget allows, as [`take`](Self::take) grows it), so a
    /// read that will need that many need not wait for each in turn once its bytes come: pinning
    /// runs while its requests wait for their answers. Takers meanwhile get each piece as it is
    /// made, and leave the growing to it. A piece that cannot be made ends it (takers see why).
    /// With a prefill running already, that one goes on up to the larger of the two. Dropping
    /// what this returns ends the prefill it started, once the piece being made is in the pool,
    /// so a read that drops it before it reports holds no reference to the pool after.
    pub fn prefill(self: &Arc<Self>, want: usize, runtime: &tokio::runtime::Handle) -> Prefill<E> {
        let mut prefill = Prefill {
            pool: self.clone(),
            ended: None,
        };
        {
            let mut st = self.lock();
            let running = st.prefill_to > 0;
            if st.pieces < want {
                st.prefill_to = st.prefill_to.max(want);
            }
            if running || st.prefill_to == 0 {
                return prefill;
            }
        }
        /// Ends the prefill however its task ends (it may be dropped unrun, with a runtime that
        /// shuts down): wakes the takers, who grow the pool themselves from then on, and, by
        /// going, tells the [`Prefill`] that it has ended.
        struct Ended<E: CopyEngine> {
            pool: Arc<PiecePool<E>>,
            _gone: std::sync::mpsc::Sender<()>,
        }
        impl<E: CopyEngine> Drop for Ended<E> {
            fn drop(&mut self) {
                self.pool.lock().prefill_to = 0;
                self.pool.returned.notify_waiters();
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        prefill.ended = Some(rx);
        let ended = Ended {
            pool: self.clone(),
            _gone: tx,
        };
        runtime.spawn_blocking(move || {
            let pool = &ended.pool;
            loop {
                let grow = {
                    let mut st = pool.lock();
                    let to = st.prefill_to;
                    // Stopped (`Prefill`'s drop), or a taker's piece begun before the prefill, to
                    // finish first: one at a time, since pinning does not go faster on several
                    // threads (four took longer than one on an H100 machine, session 16).
                    if to == 0 {
                        Some(false)
                    } else if st.growing && st.pieces < to {
                        None
                    } else {
                        Some(pool.may_grow(&mut st, to))
                    }
                };
                match grow {
                    None => std::thread::sleep(std::time::Duration::from_millis(1)),
                    Some(true) if pool.make_piece().is_ok() => {}
                    Some(_) => break,
                }
            }
        });
        prefill
    }

    /// A piece to fill: a free one, or a new one if none is free and the pool holds fewer than
    /// `most` (and at least [`MIN_PIECES`]) and the budget has room; otherwise waits for one to
    /// come back. Pinning runs on tokio's blocking threads, so this must be awaited inside a
    /// tokio runtime.
    ///
    /// # Errors
    /// When the pool is poisoned, or holds no piece and cannot make one (the engine's error).
    pub async fn take(self: &Arc<Self>, most: usize) -> Result<Piece<E>> {
        loop {
            // Listening before looking: a piece given back in between is not missed.
            let mut returned = std::pin::pin!(self.returned.notified());
            returned.as_mut().enable();
            match self.find(most)? {
                Found::Piece(buf) => {
                    return Ok(Piece {
                        pool: self.clone(),
                        buf: Some(buf),
                    })
                }
                Found::Make => {
                    let pool = self.clone();
                    let made = tokio::task::spawn_blocking(move || pool.make_piece()).await;
                    match made {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) if self.lock().pieces == 0 => return Err(e),
                        Ok(Err(_)) => {}
                        Err(e) => {
                            // The blocking task never ran or panicked: let the next taker try
                            // (the piece stays counted; it may exist, leaked).
                            self.lock().growing = false;
                            return Err(Error::InvalidArgument(format!(
                                "pinning a piece of {} bytes: {e}",
                                self.piece_len
                            )))
                        }
                    }
                }
                Found::Wait => returned.await,
            }
        }
    }
}

impl<E: CopyEngine> Drop for PiecePool<E> {
    fn drop(&mut self) {
        // No piece is out and no copy runs: every piece and every `PieceCopies` holds the pool.
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let (free, streams) = (std::mem::take(&mut st.free), std::mem::take(&mut st.streams));
        let bound = if st.poisoned {
            None
        } else {
            self.engine.bind().ok()
        };
        let Some(_bound) = bound else {
            // Poisoned (pieces may still be read) or the driver is gone: leak, budget and all.
            std::mem::forget(free);
            std::mem::forget(streams);
            return;
        };
        for piece in free {
            let _ = self.engine.destroy_event(piece.event);
            // SAFETY: the piece is back in the pool, so the copy that last read it completed;
            // it came from this engine's `alloc_pinned` with `alloc_len` bytes, freed once here.
            let _ = unsafe { self.engine.free_pinned(piece.buf.alloc, piece.buf.alloc_len) };
            self.budget.give_back(self.piece_len as u64);
        }
        for stream in streams {
            let _ = self.engine.destroy_stream(stream);
        }
    }
}

/// A prefill of a [`PiecePool`] that a read started ([`PiecePool::prefill`]): dropping it ends
/// that prefill and waits until its task has ended (at most the piece being made).
pub struct Prefill<E: CopyEngine> {
    pool: Arc<PiecePool<E>>,
    /// Disconnected once the task has ended; `None` where this call started none.
    ended: Option<std::sync::mpsc::Receiver<()>>,
}

impl<E: CopyEngine> Drop for Prefill<E> {
    fn drop(&mut self) {
        if let Some(ended) = self.ended.take() {
            self.pool.lock().prefill_to = 0;
            // Returns once the task's sender is gone (nothing is ever sent).
            let _ = ended.recv();
        }
    }
}

/// A piece taken from a [`PiecePool`]: its bytes are the taker's until it is dropped, which
/// gives it back, or handed to [`PieceCopies::start_copy`].
pub struct Piece<E: CopyEngine> {
    pool: Arc<PiecePool<E>>,
    /// `None` only while being given back or leaked.
    buf: Option<PieceBuf<E::Event>>,
}

impl<E: CopyEngine> std::fmt::Debug for Piece<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Piece")
            .field("at", &self.buf.as_ref().map(|b| b.buf.data))
            .field("len", &self.pool.piece_len)
            .finish()
    }
}

impl<E: CopyEngine> AsMut<[u8]> for Piece<E> {
    fn as_mut(&mut self) -> &mut [u8] {
        self.bytes_mut()
    }
}

impl<E: CopyEngine> Piece<E> {
    /// The piece's bytes ([`PiecePool::piece_len`] of them, page-aligned).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &self.buf {
            // SAFETY: the piece holds `piece_len` initialised bytes (zeroed when allocated), no
            // copy reads them (a copy keeps the handle until it has completed), and `&mut self`
            // keeps anyone else from reaching them while the slice lives.
            Some(b) => unsafe {
                std::slice::from_raw_parts_mut(b.buf.data.as_ptr(), self.pool.piece_len)
            },
            None => &mut [],
        }
    }

    /// Leaks the piece: a copy may still read it and nobody can wait for that any more.
    fn leak(mut self) {
        std::mem::forget(self.buf.take());
    }
}

impl<E: CopyEngine> Drop for Piece<E> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give(buf);
        }
    }
}

/// Copies of filled pieces to device memory on one stream of a pool's engine: each piece goes
/// back to the pool once its copy has completed. For one thread; see the module docs.
///
/// Dropping it waits for the copies still running (a failure there poisons the pool).
pub struct PieceCopies<E: CopyEngine> {
    pool: Arc<PiecePool<E>>,
    stream: Option<E::Stream>,
    /// Pieces whose copies were started, oldest first (the stream runs them in that order).
    in_flight: VecDeque<Piece<E>>,
    failed: bool,
}

impl<E: CopyEngine> std::fmt::Debug for PieceCopies<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PieceCopies")
            .field("in_flight", &self.in_flight.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl<E: CopyEngine> PieceCopies<E> {
    /// Copies from `pool`'s pieces, on a stream of the pool's kept from earlier copies or a new
    /// one.
    ///
    /// # Errors
    /// When the pool is poisoned, or the engine cannot be bound or make a stream.
    pub fn new(pool: &Arc<PiecePool<E>>) -> Result<PieceCopies<E>> {
        let kept = {
            let mut st = pool.lock();
            if st.poisoned {
                return Err(PiecePool::<E>::retired());
            }
            st.streams.pop()
        };
        let stream = match kept {
            Some(stream) => stream,
            None => {
                let _bound = pool.engine.bind()?;
                pool.engine.create_stream()?
            }
        };
        Ok(PieceCopies {
            pool: pool.clone(),
            stream: Some(stream),
            in_flight: VecDeque::new(),
            failed: false,
        })
    }

    /// Copies still possibly running.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Starts copying the first `len` bytes of `piece` to device memory at `dst`, after the
    /// copies started before; the piece goes back to its pool once the copy has completed (seen
    /// by [`reclaim`](Self::reclaim), [`wait_oldest`](Self::wait_oldest) or
    /// [`finish`](Self::finish)).
    ///
    /// # Safety
    /// `dst..dst+len` must be device memory of the pool's engine, that stays allocated and that
    /// nothing else writes until the copy has completed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len` exceeds the piece or the device range wraps around,
    /// or `piece` is of another pool; the engine's error when the copy cannot be started (the
    /// piece goes back then) or its event recorded (then every copy is waited for first).
    pub unsafe fn start_copy(&mut self, piece: Piece<E>, len: usize, dst: DevicePtr) -> Result<()> {
        if !Arc::ptr_eq(&piece.pool, &self.pool) {
            return Err(Error::InvalidArgument(
                "a piece of another pool was handed to these copies".to_string(),
            ));
        }
        if len > self.pool.piece_len || dst.checked_add(len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "copy of {len} bytes from a {}-byte piece to device address {:#x}",
                self.pool.piece_len, dst.0
            )));
        }
        let (Some(stream), Some(buf)) = (&self.stream, &piece.buf) else {
            return Err(Error::InvalidArgument(
                "these piece copies failed earlier".to_string(),
            ));
        };
        let engine = &self.pool.engine;
        let _bound = engine.bind()?;
        // SAFETY: `data..data+len` lies in the piece's pinned memory from this engine's
        // `alloc_pinned` (`len <= piece_len`). The piece's handle moves into `in_flight` below and
        // stays there until an event recorded after this copy has completed (or the stream has
        // been waited for), so nothing writes or frees the piece meanwhile; a failed wait leaks
        // it. The device range is the caller's (this function's contract).
        unsafe { engine.copy_to_device(dst, buf.buf.data.as_ptr(), len, stream)? };
        let recorded = engine.record(&buf.event, stream);
        self.in_flight.push_back(piece);
        if let Err(e) = recorded {
            // Without its event the piece's copy can only be waited for with the whole stream.
            self.finish()?;
            return Err(e);
        }
        Ok(())
    }

    /// Gives back the pieces whose copies have completed, without blocking.
    ///
    /// # Errors
    /// When a copy failed while running (the pool is then poisoned).
    pub fn reclaim(&mut self) -> Result<()> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        let _bound = match self.pool.engine.bind() {
            Ok(bound) => bound,
            Err(e) => return Err(self.fail(e)),
        };
        while let Some(oldest) = self.in_flight.front() {
            let done = match &oldest.buf {
                Some(buf) => self.pool.engine.is_complete(&buf.event),
                None => Ok(true),
            };
            match done {
                Ok(true) => drop(self.in_flight.pop_front()),
                Ok(false) => break,
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(())
    }

    /// Blocks until the oldest copy still running has completed, and gives its piece back.
    ///
    /// # Errors
    /// When that copy failed (the pool is then poisoned).
    pub fn wait_oldest(&mut self) -> Result<()> {
        let Some(oldest) = self.in_flight.front() else {
            return Ok(());
        };
        if let Some(buf) = &oldest.buf {
            let engine = &self.pool.engine;
            if let Err(e) = engine.bind().and_then(|_bound| engine.wait_event(&buf.event)) {
                return Err(self.fail(e));
            }
        }
        drop(self.in_flight.pop_front());
        Ok(())
    }

    /// Waits until every copy started has completed, and gives their pieces back: the device
    /// bytes are final.
    ///
    /// # Errors
    /// When a copy failed (the pool is then poisoned).
    pub fn finish(&mut self) -> Result<()> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        let engine = &self.pool.engine;
        let waited = engine.bind().and_then(|_bound| engine.wait_stream(stream));
        match waited {
            Ok(()) => {
                self.in_flight.clear();
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// A copy failed while running: poison the pool and leak what it may still read.
    fn fail(&mut self, e: Error) -> Error {
        self.failed = true;
        self.pool.poison();
        for piece in self.in_flight.drain(..) {
            piece.leak();
        }
        std::mem::forget(self.stream.take());
        e
    }
}

impl<E: CopyEngine> Drop for PieceCopies<E> {
    fn drop(&mut self) {
        let _ = self.finish();
        if let Some(stream) = self.stream.take() {
            self.pool.lock().streams.push(stream);
        }
    }
}

/// The pools of the real driver, one per context, made on first use and never dropped (see the
/// module docs).
static CUDA_POOLS: Mutex<Vec<Arc<PiecePool<CudaEngine>>>> = Mutex::new(Vec::new());

/// The pool of pieces of `piece_len` bytes for `context`, pinning memory as `settings` say and
/// within the process-wide [`PinnedBudget::global`] (whose cap follows `settings`): the one made
/// by an earlier read, or a new one where there was none, or one of another size, or a poisoned
/// one (those are dropped: freed once idle, or leaked if poisoned).
///
/// # Errors
/// [`Error::CudaUnavailable`] without a driver; [`Error::InvalidArgument`] for a size of zero.
pub(crate) fn cuda_piece_pool(
    context: Context,
    piece_len: usize,
    settings: &Settings,
) -> Result<Arc<PiecePool<CudaEngine>>> {
    let engine = CudaEngine::new(context)?.pinning(settings.pinned_memory);
    let budget = PinnedBudget::global();
    budget.set_limit(settings.pinned_limit);
    let piece_len = piece_len.checked_next_multiple_of(PINNED_ALIGN).unwrap_or(0);
    // Only ever pushed, removed and cloned whole: a poisoned lock still holds a valid list.
    let mut pools = CUDA_POOLS.lock().unwrap_or_else(|p| p.into_inner());
    pools.retain(|p| {
        p.engine().context() != context || (p.engine() == &engine && !p.is_poisoned())
    });
    if let Some(pool) = pools
        .iter()
        .find(|p| p.engine() == &engine && p.piece_len() == piece_len)
    {
        return Ok(pool.clone());
    }
    pools.retain(|p| p.engine().context() != context);
    let pool = Arc::new(PiecePool::new(engine, piece_len, budget.clone())?);
    pools.push(pool.clone());
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{PieceCopies, PiecePool, MIN_PIECES};
    use crate::bounce::emulated::EmulatedDevice;
    use crate::bounce::PinnedBudget;
    use crate::error::Error;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap()
    }

    #[test]
    fn pieces_go_back_only_after_their_copies() {
        // Copies slow enough that one is surely still running when looked at just after.
        let device = EmulatedDevice::new(Duration::from_millis(300));
        let budget = Arc::new(PinnedBudget::new(u64::MAX));
        let pool = Arc::new(PiecePool::new(device.clone(), 5000, budget.clone()).unwrap());
        assert_eq!(pool.piece_len(), 8192, "rounded up to whole pages");
        let rt = runtime();
        let mut a = rt.block_on(pool.take(8)).unwrap();
        let b = rt.block_on(pool.take(8)).unwrap();
        assert_eq!((pool.pieces(), pool.free_pieces()), (2, 0));
        assert_eq!(budget.used(), 2 * 8192);
        drop(b);
        assert_eq!(pool.free_pieces(), 1, "a dropped piece goes back");
        a.bytes_mut().fill(7);
        let dst = device.alloc_device(3 * 8192).unwrap();
        let mut copies = PieceCopies::new(&pool).unwrap();
        // SAFETY: `dst` is emulated device memory of 3 pieces, freed after the copies finish.
        unsafe { copies.start_copy(a, 8192, dst) }.unwrap();
        copies.reclaim().unwrap();
        assert_eq!(copies.in_flight(), 1, "its copy still runs");
        assert_eq!(pool.free_pieces(), 1);
        copies.wait_oldest().unwrap();
        assert_eq!((copies.in_flight(), pool.free_pieces()), (0, 2));
        assert_eq!(device.read_device(dst, 8192).unwrap(), vec![7; 8192]);
        // A copy longer than the piece, or of another pool's piece, is refused (and the piece
        // goes back to its own pool).
        let c = rt.block_on(pool.take(8)).unwrap();
        // SAFETY: refused before any copy starts.
        let err = unsafe { copies.start_copy(c, 8193, dst) }.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let other = Arc::new(PiecePool::new(device.clone(), 8192, budget.clone()).unwrap());
        let d = rt.block_on(other.take(8)).unwrap();
        // SAFETY: refused before any copy starts.
        let err = unsafe { copies.start_copy(d, 10, dst) }.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_eq!((pool.free_pieces(), other.free_pieces()), (2, 1));
        drop(copies);
        drop((pool, other));
        assert_eq!(budget.used(), 0);
        assert_eq!(device.pinned_allocations(), 0);
        assert_eq!((device.live_events(), device.live_streams()), (0, 0));
        device.free_device(dst).unwrap();
        assert_eq!(device.violations(), Vec::<String>::new());
    }

    #[test]
    fn a_full_pool_makes_takers_wait_for_a_piece_to_come_back() {
        let device = EmulatedDevice::default();
        // No room under the cap: the pool holds the pieces every pool gets, no more.
        let budget = Arc::new(PinnedBudget::new(0));
        let pool = Arc::new(PiecePool::new(device.clone(), 4096, budget).unwrap());
        let rt = runtime();
        let held: Vec<_> = (0..MIN_PIECES)
            .map(|_| rt.block_on(pool.take(8)).unwrap())
            .collect();
        let waiting = {
            let pool = pool.clone();
            rt.spawn(async move { pool.take(8).await.map(|_| ()) })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished(), "no piece free and none may be made");
        drop(held);
        rt.block_on(waiting).unwrap().unwrap();
        assert_eq!(pool.pieces(), MIN_PIECES);
    }

    /// Waits (up to 5 s) until the pool holds `n` pieces and no prefill runs.
    fn settle(pool: &PiecePool<EmulatedDevice>, n: usize) {
        for _ in 0..500 {
            if pool.pieces() == n && pool.lock().prefill_to == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the pool holds {} pieces, not {n}", pool.pieces());
    }

    #[test]
    fn a_prefill_makes_the_pieces_asked_for_ahead_of_the_takers() {
        let device = EmulatedDevice::default();
        let budget = Arc::new(PinnedBudget::new(u64::MAX));
        let pool = Arc::new(PiecePool::new(device.clone(), 4096, budget.clone()).unwrap());
        let rt = runtime();
        let prefill = pool.prefill(6, rt.handle());
        settle(&pool, 6);
        drop(prefill);
        assert_eq!((pool.free_pieces(), budget.used()), (6, 6 * 4096));
        // Asking again for as many, or fewer, makes none.
        drop(pool.prefill(4, rt.handle()));
        assert_eq!(pool.pieces(), 6);
        // Takers while a prefill runs get its pieces, and the pool ends where it was asked to.
        let prefill = pool.prefill(10, rt.handle());
        let taken: Vec<_> = (0..8).map(|_| rt.block_on(pool.take(64)).unwrap()).collect();
        settle(&pool, 10);
        drop(prefill);
        assert_eq!(pool.free_pieces(), 2);
        drop(taken);
        assert_eq!(pool.free_pieces(), 10);
        // Dropped while it runs, a prefill stops at once, and holds the pool no more: the pool
        // is freed with its last handle.
        let prefill = pool.prefill(100_000, rt.handle());
        drop(prefill);
        let made = pool.pieces();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pool.pieces(), made, "no piece made after the prefill was dropped");
        assert!(made < 100_000);
        assert_eq!(Arc::strong_count(&pool), 1);
        drop(pool);
        assert_eq!((budget.used(), device.pinned_allocations()), (0, 0));
    }

    #[test]
    fn a_prefill_stays_within_the_pinned_budget() {
        let device = EmulatedDevice::default();
        // Room for four pieces (the two every pool gets count against it too).
        let budget = Arc::new(PinnedBudget::new(4 * 4096));
        let pool = Arc::new(PiecePool::new(device.clone(), 4096, budget.clone()).unwrap());
        let rt = runtime();
        let prefill = pool.prefill(64, rt.handle());
        settle(&pool, 4);
        drop(prefill);
        assert_eq!(budget.used(), 4 * 4096);
        // The prefill has ended: takers get its pieces, and the fifth waits for one to come
        // back (none may be made past the cap).
        let held: Vec<_> = (0..4).map(|_| rt.block_on(pool.take(64)).unwrap()).collect();
        let waiting = {
            let pool = pool.clone();
            rt.spawn(async move { pool.take(64).await.map(|_| ()) })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished());
        drop(held);
        rt.block_on(waiting).unwrap().unwrap();
        assert_eq!(pool.pieces(), 4);
    }
}
