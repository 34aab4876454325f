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
//! ([`crate::cuda::CudaEngine`]) and against [`emulated::EmulatedDevice`], a device emulated in
//! host memory that lets CI check ordering, overlap and buffer reuse without a GPU.
//!
//! Rings are made once per (worker thread, CUDA context) and reused: [`read_to_device`] and
//! [`write_from_device`] find the calling thread's ring in a thread-local [`RingSet`]. All rings
//! share one cap on pinned memory ([`PinnedBudget`], from [`Settings::pinned_limit`]).
//!
//! This module does no file I/O and no pointer classification; it never calls the driver except
//! through a [`CopyEngine`].

pub mod emulated;

use std::cell::RefCell;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::config::Settings;
use crate::cuda::{Context, CudaEngine, DevicePtr};
use crate::error::{Error, Result};

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

/// The cap on pinned memory held by bounce rings, shared by every ring made with it.
///
/// The cap is soft by design: a ring always gets its first buffer, even past the cap, so a read
/// never fails (or waits for another worker's ring, which may never be given back) because of
/// the cap. Past that first buffer a ring takes only what fits, and tries again to reach its
/// full depth at the start of later calls. So the pinned memory in use stays below
/// `limit + (number of rings) × buffer size`.
#[derive(Debug)]
pub struct PinnedBudget {
    limit: AtomicU64,
    used: AtomicU64,
}

impl PinnedBudget {
    /// A budget of `limit` bytes, nothing used.
    pub fn new(limit: u64) -> PinnedBudget {
        PinnedBudget {
            limit: AtomicU64::new(limit),
            used: AtomicU64::new(0),
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
struct PinnedBuffer {
    alloc: NonNull<u8>,
    alloc_len: usize,
    data: NonNull<u8>,
}

/// A buffer, its event, and whether a copy using it may still be running.
struct Slot<V> {
    buf: PinnedBuffer,
    event: V,
    busy: bool,
}

/// K pinned host buffers of B bytes, one stream and one event per buffer: see the module docs.
///
/// Dropping a ring waits for its stream and frees everything through the engine, so a ring must
/// not be dropped at process exit (keep it in a [`RingSet`], which leaks at exit on purpose).
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
            poisoned: false,
            stats: RingStats::default(),
        };
        {
            let _bound = ring.engine.bind()?;
            ring.stream = Some(ring.engine.create_stream()?);
            ring.add_slot(true)?;
            ring.grow();
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

    /// The ring's counters.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

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
            let got = match read_chunk(buf, file_offset + done as u64) {
                Ok(got) => got,
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            };
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
            if let Err(e) = self.start_copy(i, target, got, Direction::ToDevice) {
                first_error = Some(e);
                break;
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
            self.engine.wait_event(&slot.event)?;
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
        let buf = match self.alloc_buffer() {
            Ok(buf) => buf,
            Err(e) => {
                self.budget.give_back(bytes);
                return Err(e);
            }
        };
        let event = match self.engine.create_event() {
            Ok(event) => event,
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

    /// A pinned buffer of `buffer_len` bytes starting on a page boundary, zero-filled (which
    /// also faults its pages in now rather than during the first read).
    fn alloc_buffer(&self) -> Result<PinnedBuffer> {
        let len = self.buffer_len;
        let first = self.engine.alloc_pinned(len)?;
        let buf = if (first.as_ptr() as usize) % PINNED_ALIGN == 0 {
            PinnedBuffer {
                alloc: first,
                alloc_len: len,
                data: first,
            }
        } else {
            // SAFETY: `first` was just allocated with `len` bytes and never used.
            unsafe { self.engine.free_pinned(first, len) }?;
            let alloc_len = len + PINNED_ALIGN - 1;
            let alloc = self.engine.alloc_pinned(alloc_len)?;
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
        // SAFETY: `data..data+len` lies in the allocation, which nothing else uses yet.
        unsafe { std::ptr::write_bytes(buf.data.as_ptr(), 0, len) };
        Ok(buf)
    }

    /// Leaks every resource of the ring (they may still be in use, or the driver is gone).
    fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.slots));
        std::mem::forget(self.stream.take());
    }
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

    /// The ring for `engine`, made with `settings` (buffer size, depth and pinned cap) if there
    /// is none or the one there was made with other sizes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a buffer size that does not fit in memory; otherwise the
    /// errors of [`BounceRing::new`].
    pub fn ring(&mut self, engine: &E, settings: &Settings) -> Result<&mut BounceRing<E>>
    where
        E: Clone,
    {
        let buffer_len = usize::try_from(settings.bounce_buffer_size)
            .unwrap_or(usize::MAX)
            .checked_next_multiple_of(PINNED_ALIGN)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "bounce buffer size {} is too large",
                    settings.bounce_buffer_size
                ))
            })?;
        let depth = settings.bounce_buffers.max(1);
        self.budget.set_limit(settings.pinned_limit);
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
        let ring = BounceRing::new(engine.clone(), buffer_len, depth, self.budget.clone())?;
        self.rings.push(ring);
        let last = self.rings.len() - 1;
        Ok(&mut self.rings[last])
    }

    /// Drops every ring of the set, freeing their pinned memory.
    pub fn clear(&mut self) {
        self.rings.clear();
    }

    /// Number of rings in the set.
    pub fn len(&self) -> usize {
        self.rings.len()
    }

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
    let engine = CudaEngine::new(context)?;
    with_thread_rings(
        "transfer was started",
        |set| f(set.ring(&engine, settings)?),
    )
}

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

/// Statistics of the calling thread's ring for `context`, if it has one.
pub fn thread_ring_stats(context: Context) -> Option<RingStats> {
    THREAD_RINGS.with(|cell| {
        let set = cell.try_borrow().ok()?;
        let set = set.as_ref()?;
        set.rings
            .iter()
            .find(|r| r.engine().context() == context)
            .map(BounceRing::stats)
    })
}
