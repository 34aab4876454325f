//! One [`BounceRing`]: its pinned buffers, stream and events, and the copy loops that move file
//! bytes through them to device memory and back (see the [module docs](super) for the design).
//!
//! Generic over [`CopyEngine`]: this file never calls the driver, and knows nothing of
//! thread-locals (the per-thread sets live in `thread_rings.rs`).

use std::ptr::NonNull;
use std::sync::Arc;

use super::{trace, CopyEngine, PinnedBudget, PINNED_ALIGN};
use crate::cuda::DevicePtr;
use crate::error::{Error, Result};

/// Counters of one ring, for tests, tuning and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingStats {
    /// Copies started.
    pub copies: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Times a buffer was needed while its copy was still running, so the worker waited: many
    /// waits mean a deeper ring (more buffers) would overlap more.
    pub waits: u64,
}

/// One pinned host buffer: an allocation and the page-aligned part of it in use.
pub(super) struct PinnedBuffer {
    pub(super) alloc: NonNull<u8>,
    pub(super) alloc_len: usize,
    pub(super) data: NonNull<u8>,
}

/// Chunks per ring whose read and copy the trace shows, and waits per ring it shows.
const TRACED_CHUNKS: u32 = 4;
const TRACED_WAITS: u32 = 8;

/// A buffer, its event, and whether a copy using it may still be running.
struct Slot<V> {
    buf: PinnedBuffer,
    event: V,
    busy: bool,
}

/// K pinned host buffers of B bytes, one stream and one event per buffer: see the module docs.
///
/// Dropping a ring waits for its stream and frees everything through the engine, so a ring must
/// not be dropped at process exit (keep it in a [`RingSet`](super::RingSet), which leaks at exit on purpose).
/// A ring whose copies failed while running cannot tell whether its buffers are still in use; it
/// is *poisoned*: every later call fails, and dropping it leaks its resources rather than free
/// memory a copy may still touch.
pub struct BounceRing<E: CopyEngine> {
    engine: E,
    budget: Arc<PinnedBudget>,
    buffer_len: usize,
    depth: usize,
    stream: Option<E::Stream>,
    slots: Vec<Slot<E::Event>>,
    /// The buffer the next read starts with: the one after the last used, whose copy is the
    /// oldest still possibly running.
    next: usize,
    grow_failed: bool,
    /// Chunks read and waits so far, for the trace (which shows only the first few).
    traced: (u32, u32),
    poisoned: bool,
    stats: RingStats,
}

impl<E: CopyEngine> std::fmt::Debug for BounceRing<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BounceRing")
            .field("buffer_len", &self.buffer_len)
            .field("buffers", &self.slots.len())
            .field("depth", &self.depth)
            .field("poisoned", &self.poisoned)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<E: CopyEngine> BounceRing<E> {
    /// A ring of up to `depth` buffers of `buffer_len` bytes (rounded up to a multiple of
    /// [`PINNED_ALIGN`]), as many as `budget` allows but at least one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size or depth; the engine's error if the stream,
    /// the first buffer or its event cannot be made (later buffers that fail are left out).
    pub fn new(
        engine: E,
        buffer_len: usize,
        depth: usize,
        budget: Arc<PinnedBudget>,
    ) -> Result<BounceRing<E>> {
        let started = trace::start();
        let mut ring = BounceRing::with_first_buffer(engine, buffer_len, depth, budget)?;
        {
            let _bound = ring.engine.bind()?;
            ring.grow();
        }
        trace::record("ring", started, ring.slots.len() as u64);
        Ok(ring)
    }

    /// A ring with its stream and its first buffer, not grown further.
    fn with_first_buffer(
        engine: E,
        buffer_len: usize,
        depth: usize,
        budget: Arc<PinnedBudget>,
    ) -> Result<BounceRing<E>> {
        if buffer_len == 0 || depth == 0 {
            return Err(Error::InvalidArgument(format!(
                "a bounce ring needs at least one buffer of at least one byte \
                 (asked for {depth} of {buffer_len} bytes)"
            )));
        }
        let buffer_len = buffer_len
            .checked_next_multiple_of(PINNED_ALIGN)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("bounce buffer size {buffer_len} is too large"))
            })?;
        let mut ring = BounceRing {
            engine,
            budget,
            buffer_len,
            depth,
            stream: None,
            slots: Vec::with_capacity(depth),
            next: 0,
            grow_failed: false,
            traced: (0, 0),
            poisoned: false,
            stats: RingStats::default(),
        };
        {
            let started = trace::start();
            let _bound = ring.engine.bind()?;
            trace::record("bind", started, 0);
            let started = trace::start();
            ring.stream = Some(ring.engine.create_stream()?);
            trace::record("stream", started, 0);
            ring.add_slot(true)?;
        }
        Ok(ring)
    }

    /// The engine the ring copies with.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Bytes per buffer (a multiple of [`PINNED_ALIGN`]).
    pub fn buffer_len(&self) -> usize {
        self.buffer_len
    }

    #[cfg(any(test, feature = "testing"))]
    /// Buffers the ring holds now (at most [`depth`](Self::depth); fewer when the pinned cap
    /// was reached).
    pub fn buffers(&self) -> usize {
        self.slots.len()
    }

    /// Buffers the ring was asked for.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// True when a copy failed while running and the ring can no longer be used.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    #[cfg(any(test, feature = "testing"))]
    /// The ring's counters.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    #[cfg(any(test, feature = "testing"))]
    /// Reads `len` bytes of a file, from `file_offset` on, into device memory at `dst`, returns
    /// how many bytes arrived.
    ///
    /// `read_chunk(buf, offset)` must fill `buf` with file bytes from `offset` and return how
    /// many it read; fewer than `buf.len()` means end of file, and the ring stops there
    /// (loop on short `pread`s inside the callback). It is called in file order with
    /// page-aligned buffers of at most [`buffer_len`](Self::buffer_len) bytes, whose length is a
    /// multiple of [`PINNED_ALIGN`] except for the last chunk of the range.
    ///
    /// On return every copy has completed: the bytes are in device memory (kernels on other
    /// streams that use them must still be ordered after this call by the caller).
    ///
    /// # Errors
    /// The first error: the callback's, or the engine's. No chunk is started after it, copies
    /// already running are waited for before returning, and bytes before the failing chunk may
    /// have been copied. [`Error::InvalidArgument`] if the range overflows the address space or
    /// the callback claims more bytes than the buffer holds.
    pub fn read_to_device(
        &mut self,
        dst: DevicePtr,
        len: usize,
        file_offset: u64,
        read_chunk: &mut dyn FnMut(&mut [u8], u64) -> Result<usize>,
    ) -> Result<usize> {
        let started = self.start_read_to_device(dst, len, file_offset, read_chunk);
        let finished = self.finish();
        match (started, finished) {
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            (Ok(done), Ok(())) => Ok(done),
        }
    }

    /// As [`read_to_device`](Self::read_to_device), but returns as soon as the last chunk's
    /// copy has started: up to one copy per buffer may still be running, and the device bytes
    /// are final only after [`finish`](Self::finish). A worker reading several ranges in a row
    /// calls this for each and `finish` once, so the disk never waits for the copy engine
    /// between ranges. A later call waits for a buffer's copy only when it needs the buffer.
    ///
    /// # Errors
    /// As for `read_to_device`; after an error every copy has completed.
    pub fn start_read_to_device(
        &mut self,
        dst: DevicePtr,
        len: usize,
        file_offset: u64,
        read_chunk: &mut dyn FnMut(&mut [u8], u64) -> Result<usize>,
    ) -> Result<usize> {
        self.check_call(dst, len, file_offset)?;
        if len == 0 {
            return Ok(0);
        }
        let _bound = self.engine.bind()?;
        self.grow();
        let mut done = 0usize;
        let mut first_error = None;
        let mut i = self.next % self.slots.len();
        while done < len {
            let want = self.buffer_len.min(len - done);
            if let Err(e) = self.reclaim(i) {
                first_error = Some(e);
                break;
            }
            let data = self.slots[i].buf.data;
            // SAFETY: the buffer holds `buffer_len >= want` initialised bytes (zeroed when
            // allocated), no copy uses it (just reclaimed), and `&mut self` keeps anyone else
            // from reaching it while the slice lives.
            let buf = unsafe { std::slice::from_raw_parts_mut(data.as_ptr(), want) };
            let started = trace::start();
            let got = match read_chunk(buf, file_offset + done as u64) {
                Ok(got) => got,
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            };
            let traced = self.traced.0 < TRACED_CHUNKS;
            if traced {
                trace::record("read", started, got as u64);
            }
            if got > want {
                first_error = Some(Error::InvalidArgument(format!(
                    "the read callback reported {got} bytes for a {want}-byte buffer"
                )));
                break;
            }
            if got == 0 {
                break;
            }
            // `dst + len` was checked not to overflow, and `done + got <= len`.
            let target = DevicePtr(dst.0 + done as u64);
            let started = trace::start();
            if let Err(e) = self.start_copy(i, target, got, Direction::ToDevice) {
                first_error = Some(e);
                break;
            }
            if traced {
                trace::record("copy", started, got as u64);
                self.traced.0 += 1;
            }
            done += got;
            i = (i + 1) % self.slots.len();
            if got < want {
                break;
            }
        }
        self.next = i;
        match first_error {
            Some(e) => {
                // Report the first error, but only once nothing runs any more.
                let _ = self.drain();
                Err(e)
            }
            None => Ok(done),
        }
    }

    /// Waits until every copy the ring started has completed: the device bytes of every
    /// [`start_read_to_device`](Self::start_read_to_device) before it are final.
    ///
    /// # Errors
    /// When a copy failed while running, or the driver refuses; the ring is then poisoned (its
    /// buffers may still be in use by copies nobody can wait for).
    pub fn finish(&mut self) -> Result<()> {
        if !self.slots.iter().any(|s| s.busy) {
            return Ok(());
        }
        let _bound = self.engine.bind()?;
        self.drain()
    }

    /// Writes `len` bytes of device memory from `src` to a file from `file_offset` on, and
    /// returns `len`.
    ///
    /// `write_chunk(buf, offset)` must write all of `buf` at `offset`. It is called in file
    /// order with page-aligned buffers of at most [`buffer_len`](Self::buffer_len) bytes, while
    /// the copies of the next chunks (up to one per buffer) are running.
    ///
    /// The device bytes must be final when this is called: the ring's stream does not wait for
    /// other streams, so work producing them must have completed.
    ///
    /// # Errors
    /// The first error, the callback's or the engine's; nothing is written after it and copies
    /// already running are waited for before returning.
    pub fn write_from_device(
        &mut self,
        src: DevicePtr,
        len: usize,
        file_offset: u64,
        write_chunk: &mut dyn FnMut(&[u8], u64) -> Result<()>,
    ) -> Result<usize> {
        self.check_call(src, len, file_offset)?;
        if len == 0 {
            return Ok(0);
        }
        let _bound = self.engine.bind()?;
        // Reads left running (`start_read_to_device`) finish first: this loop hands out the
        // buffers in its own order.
        self.drain()?;
        self.grow();
        let b = self.buffer_len;
        let k = self.slots.len();
        let chunks = len.div_ceil(b);
        let chunk_len = |c: usize| b.min(len - c * b);
        let mut issued = 0;
        let mut written = 0;
        let mut first_error = None;
        'chunks: while written < chunks {
            // Keep every buffer busy: chunk c goes to buffer c % k once chunk c - k, the
            // buffer's previous content, has been written.
            while issued < chunks && issued < written + k {
                let source = DevicePtr(src.0 + (issued * b) as u64);
                if let Err(e) =
                    self.start_copy(issued % k, source, chunk_len(issued), Direction::ToHost)
                {
                    first_error = Some(e);
                    break 'chunks;
                }
                issued += 1;
            }
            let slot = written % k;
            if let Err(e) = self.reclaim(slot) {
                first_error = Some(e);
                break;
            }
            let n = chunk_len(written);
            let data = self.slots[slot].buf.data;
            // SAFETY: the buffer holds at least `n` bytes, its copy has completed (reclaimed),
            // and no new copy into it starts while the slice lives (the next one is issued only
            // after this chunk is written).
            let buf = unsafe { std::slice::from_raw_parts(data.as_ptr(), n) };
            if let Err(e) = write_chunk(buf, file_offset + (written * b) as u64) {
                first_error = Some(e);
                break;
            }
            written += 1;
        }
        let drained = self.drain();
        match (first_error, drained) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(len),
        }
    }

    fn check_call(&self, device: DevicePtr, len: usize, file_offset: u64) -> Result<()> {
        if self.poisoned {
            return Err(Error::Cuda {
                call: "bounce ring",
                code: 0,
                message: "an earlier copy of this ring failed while running; the ring is retired"
                    .to_string(),
            });
        }
        let fits = device.checked_add(len).is_some()
            && u64::try_from(len)
                .ok()
                .and_then(|l| file_offset.checked_add(l))
                .is_some();
        if fits {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{len} bytes at device address {:#x} / file offset {file_offset} overflow",
                device.0
            )))
        }
    }

    /// Starts the copy of `len` bytes between buffer `i` and `device`, then records event `i`.
    fn start_copy(
        &mut self,
        i: usize,
        device: DevicePtr,
        len: usize,
        dir: Direction,
    ) -> Result<()> {
        let stream = self.stream.as_ref().ok_or_else(|| Error::Cuda {
            call: "bounce ring",
            code: 0,
            message: "the ring has no stream".to_string(),
        })?;
        let slot = &mut self.slots[i];
        let data = slot.buf.data.as_ptr();
        // SAFETY: `data..data+len` lies in this slot's pinned buffer (len <= buffer_len), which
        // came from this engine's `alloc_pinned`. The slot is marked busy below, and a busy
        // buffer is neither read, written nor freed before its event (recorded right after the
        // copy) is waited for, or the stream is, in `reclaim`/`drain`/`drop`. The device range
        // is the caller's, checked not to overflow.
        unsafe {
            match dir {
                Direction::ToDevice => self.engine.copy_to_device(device, data, len, stream)?,
                Direction::ToHost => self.engine.copy_from_device(data, device, len, stream)?,
            }
        }
        // From here a copy may be running: `drain` waits for the whole stream even if the
        // record below fails.
        slot.busy = true;
        self.stats.copies += 1;
        self.stats.bytes += len as u64;
        self.engine.record(&slot.event, stream)
    }

    /// Makes buffer `i` free: waits for its last copy only if that is still running.
    fn reclaim(&mut self, i: usize) -> Result<()> {
        let slot = &mut self.slots[i];
        if !slot.busy {
            return Ok(());
        }
        if !self.engine.is_complete(&slot.event)? {
            self.stats.waits += 1;
            let started = trace::start();
            self.engine.wait_event(&slot.event)?;
            if self.traced.1 < TRACED_WAITS {
                self.traced.1 += 1;
                trace::record("wait", started, self.stats.waits);
            }
        }
        slot.busy = false;
        Ok(())
    }

    /// Waits for every copy of the ring. If that fails, the ring is poisoned: its buffers may
    /// still be in use by copies nobody can wait for any more.
    fn drain(&mut self) -> Result<()> {
        if !self.slots.iter().any(|s| s.busy) {
            return Ok(());
        }
        let result = match &self.stream {
            Some(stream) => self.engine.wait_stream(stream),
            None => Ok(()),
        };
        match result {
            Ok(()) => {
                for slot in &mut self.slots {
                    slot.busy = false;
                }
                Ok(())
            }
            Err(e) => {
                self.poisoned = true;
                Err(e)
            }
        }
    }

    /// Adds buffers up to the ring's depth while the budget allows (the caller holds a binding).
    fn grow(&mut self) {
        while !self.grow_failed && self.slots.len() < self.depth {
            match self.add_slot(false) {
                Ok(true) => {}
                Ok(false) => break,
                // Pinned memory ran out (or the memlock limit): go on with the buffers there are
                // and stop asking on every call.
                Err(_) => self.grow_failed = true,
            }
        }
    }

    /// Adds one buffer and its event; `Ok(false)` if the budget has no room (unless `forced`).
    fn add_slot(&mut self, forced: bool) -> Result<bool> {
        let bytes = self.buffer_len as u64;
        if forced {
            self.budget.take_anyway(bytes);
        } else if !self.budget.try_take(bytes) {
            return Ok(false);
        }
        let started = trace::start();
        let turn = self.budget.turn();
        if turn.is_some() {
            trace::record("turn", started, 0);
        }
        let got = alloc_buffer(&self.engine, self.buffer_len);
        drop(turn);
        let buf = match got {
            Ok(buf) => buf,
            Err(e) => {
                self.budget.give_back(bytes);
                return Err(e);
            }
        };
        let started = trace::start();
        let event = match self.engine.create_event() {
            Ok(event) => {
                trace::record("event", started, 0);
                event
            }
            Err(e) => {
                // SAFETY: the buffer was just allocated by this engine and no copy has used it.
                let _ = unsafe { self.engine.free_pinned(buf.alloc, buf.alloc_len) };
                self.budget.give_back(bytes);
                return Err(e);
            }
        };
        self.slots.push(Slot {
            buf,
            event,
            busy: false,
        });
        Ok(true)
    }

    /// Leaks every resource of the ring (they may still be in use, or the driver is gone).
    fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.slots));
        std::mem::forget(self.stream.take());
    }
}

/// A pinned buffer of `len` bytes starting on a page boundary, zero-filled and its pages faulted
/// in (now rather than during the first read): by the engine where its memory comes so
/// ([`CopyEngine::pinned_is_zeroed`]; writing it again took 0.14 ms of each 2 MiB piece's 0.9 ms
/// on an H100), else here.
pub(super) fn alloc_buffer<E: CopyEngine>(engine: &E, len: usize) -> Result<PinnedBuffer> {
    let started = trace::start();
    let first = engine.alloc_pinned(len)?;
    let buf = if (first.as_ptr() as usize) % PINNED_ALIGN == 0 {
        PinnedBuffer {
            alloc: first,
            alloc_len: len,
            data: first,
        }
    } else {
        // SAFETY: `first` was just allocated with `len` bytes and never used.
        unsafe { engine.free_pinned(first, len) }?;
        let alloc_len = len + PINNED_ALIGN - 1;
        let alloc = engine.alloc_pinned(alloc_len)?;
        let pad =
            (alloc.as_ptr() as usize).next_multiple_of(PINNED_ALIGN) - alloc.as_ptr() as usize;
        // SAFETY: `pad < PINNED_ALIGN`, so `alloc + pad .. + len` lies within the
        // `len + PINNED_ALIGN - 1` bytes allocated.
        let data = unsafe { alloc.add(pad) };
        PinnedBuffer {
            alloc,
            alloc_len,
            data,
        }
    };
    trace::record("pin", started, len as u64);
    if !engine.pinned_is_zeroed(buf.alloc) {
        let started = trace::start();
        // SAFETY: `data..data+len` lies in the allocation, which nothing else uses yet.
        unsafe { std::ptr::write_bytes(buf.data.as_ptr(), 0, len) };
        trace::record("zero", started, len as u64);
    }
    Ok(buf)
}

#[derive(Clone, Copy)]
enum Direction {
    ToDevice,
    ToHost,
}

impl<E: CopyEngine> Drop for BounceRing<E> {
    fn drop(&mut self) {
        // Pinned bytes of a leaked ring stay counted: the memory is still held.
        if self.poisoned {
            self.leak();
            return;
        }
        let Ok(_bound) = self.engine.bind() else {
            self.leak();
            return;
        };
        if let Some(stream) = &self.stream {
            if self.engine.wait_stream(stream).is_err() {
                self.leak();
                return;
            }
        }
        for slot in std::mem::take(&mut self.slots) {
            let _ = self.engine.destroy_event(slot.event);
            // SAFETY: the stream was waited for, so no copy uses the buffer; it came from this
            // engine's `alloc_pinned` with `alloc_len` bytes and is freed once here.
            let _ = unsafe { self.engine.free_pinned(slot.buf.alloc, slot.buf.alloc_len) };
            self.budget.give_back(self.buffer_len as u64);
        }
        if let Some(stream) = self.stream.take() {
            let _ = self.engine.destroy_stream(stream);
        }
    }
}
