//! The pool on real CUDA: [`CudaStreams`] (streams and events of the driver, a
//! [`StreamOrder`]), [`DeviceUpstream`] (`cuMemAlloc`) and [`PinnedUpstream`]
//! (`cuMemHostAlloc`), plus [`DriverPool`], the driver's own stream-ordered pool
//! (`cuMemAllocAsync`), which the benchmarks compare against.
//!
//! Each type here is a thin adapter over [`crate::cuda`]: its driver wrappers (`cuda::calls`)
//! and its owned [`Stream`] and [`Event`]; this file has no FFI of its own. Every call makes
//! the pool's context current on the calling thread for its duration.
//!
//! # Streams are named by a unique id, not by their handle
//!
//! A [`StreamHandle`] carries a [`StreamId`] from [`StreamId::unique`], assigned when the
//! stream is created ([`CudaStreams::create_stream`]) or a foreign `CUstream` (CuPy's, say) is
//! registered ([`CudaStreams::register_stream`]). The driver hands the same `CUstream` value
//! out again after a stream is destroyed; a pool keyed by the value would take blocks freed on
//! the dead stream as ordered on the new one. Registering the same foreign stream twice gives
//! two ids: the pool then orders them against each other like two streams, which is correct
//! and only costs an event wait when a block moves between them. Before a foreign stream is
//! destroyed, call [`PoolResource::detach_stream`](super::PoolResource::detach_stream) and drop
//! every handle of it.
//!
//! # Nothing is released at process exit
//!
//! A stream created here is destroyed when its last [`StreamHandle`] goes, and an event when
//! the pool drops the free list that owns it; memory goes back to the driver when the pool is
//! dropped. None of these may happen in a destructor that runs at process exit (a thread-local,
//! or an `atexit` handler), where the driver may already be gone: a pool that lives for the
//! whole process belongs in a `static` (never dropped: its memory, streams and events are
//! leaked on purpose and the driver reclaims them with the process), and no handle belongs in
//! a `thread_local!`. The pool itself keeps only weak references in its per-thread caches, so
//! a thread that exits releases nothing of the driver's. A `CUDA_ERROR_DEINITIALIZED` while
//! destroying a stream or event, or freeing memory, counts as success (the rule is
//! `crate::cuda`'s, for every caller).

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::order::{StreamId, StreamOrder};
use super::upstream::{MemoryKind, Upstream};
use crate::cuda::calls::{self, RawStream};
use crate::cuda::{self, Context, Event, Latch, Stream};
use crate::error::{Error, Result};

/// How long a [`StreamGate`] holds its stream at most, so that a test that forgets to open
/// one cannot hang the process.
const GATE_LIMIT: Duration = Duration::from_secs(60);

/// The real CUDA driver as the pool's [`StreamOrder`]: every stream and event belongs to one
/// context, made current for each call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaStreams {
    context: Context,
}

struct StreamInner {
    id: StreamId,
    raw: RawStream,
    /// Created here (destroyed when the last handle drops this, the only owner; queued work
    /// still completes) or registered (`None`: the owner destroys it).
    owned: Option<Stream>,
    context: Context,
}

// SAFETY: a CUstream is an opaque driver handle that the driver accepts from any thread; the
// struct is never written after it is built.
unsafe impl Send for StreamInner {}
// SAFETY: as above.
unsafe impl Sync for StreamInner {}

/// A CUDA stream as the pool knows it: the handle and its process-unique [`StreamId`].
/// Cloning is cheap and shares the stream.
#[derive(Clone)]
pub struct StreamHandle(Arc<StreamInner>);

impl StreamHandle {
    /// The stream's unique id.
    pub fn id(&self) -> StreamId {
        self.0.id
    }

    /// The raw `CUstream` (null for the legacy default stream), to launch work on.
    pub fn as_raw(&self) -> *mut c_void {
        self.0.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> Context {
        self.0.context
    }

    /// Whether ferrio created the stream (and destroys it when the last handle is dropped).
    pub fn is_owned(&self) -> bool {
        self.0.owned.is_some()
    }
}

impl fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamHandle")
            .field("id", &self.0.id)
            .field("raw", &self.0.raw)
            .field("owned", &self.0.owned.is_some())
            .finish()
    }
}

/// An event of [`CudaStreams`], created with timing disabled; destroyed on drop.
///
/// The pool drops events only with a free list (pool drop or a drained detached stream), never
/// from a thread-local or static destructor. It serializes records of one event under its
/// list's lock.
pub struct OrderEvent(Event);

impl fmt::Debug for OrderEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OrderEvent").field(&self.0.as_raw()).finish()
    }
}

/// Holds a stream (see [`CudaStreams::hold`]) until [`open`](StreamGate::open) or drop.
#[derive(Debug)]
pub struct StreamGate {
    latch: Arc<Latch>,
}

impl StreamGate {
    /// Lets the held stream go on.
    pub fn open(self) {
        // Drop opens.
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        self.latch.open();
    }
}

impl CudaStreams {
    /// Streams and events in `context`.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver.
    pub fn new(context: Context) -> Result<CudaStreams> {
        cuda::available()?;
        Ok(CudaStreams { context })
    }

    /// Streams and events in the primary context of device `ordinal` (the context CuPy,
    /// PyTorch and the CUDA runtime use).
    ///
    /// # Errors
    /// As for [`Context::primary`].
    pub fn for_device(ordinal: usize) -> Result<CudaStreams> {
        CudaStreams::new(Context::primary(ordinal)?)
    }

    /// The context.
    pub fn context(&self) -> Context {
        self.context
    }

    /// A new non-blocking stream with a fresh id, destroyed when its last handle is dropped.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver refuses.
    pub fn create_stream(&self) -> Result<StreamHandle> {
        let stream = Stream::new(self.context)?;
        Ok(StreamHandle(Arc::new(StreamInner {
            id: StreamId::unique(),
            raw: stream.as_raw(),
            owned: Some(stream),
            context: self.context,
        })))
    }

    /// A handle with a fresh id for a stream someone else created (CuPy's, PyTorch's), or for
    /// the legacy default stream (null). ferrio never destroys it.
    ///
    /// # Safety
    /// `raw` must be null or a stream of this context, and must stay alive while any clone of
    /// the handle does, the pool's included: call
    /// [`PoolResource::detach_stream`](super::PoolResource::detach_stream) (which drops the
    /// pool's clone) and drop your own clones before destroying the stream.
    pub unsafe fn register_stream(&self, raw: *mut c_void) -> StreamHandle {
        StreamHandle(Arc::new(StreamInner {
            id: StreamId::unique(),
            raw,
            owned: None,
            context: self.context,
        }))
    }

    /// Blocks until everything queued on `stream` has completed.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver reports a failure of the stream's work.
    pub fn synchronize(&self, stream: &StreamHandle) -> Result<()> {
        // SAFETY: a handle keeps its stream alive (owned) or is covered by the registration's
        // contract (foreign).
        unsafe { calls::stream_synchronize(stream.context(), stream.as_raw()) }
    }

    /// Holds `stream`: work enqueued on it from now on runs only once the returned gate is
    /// opened or dropped (or after a minute, as a safety net). For tests and demonstrations of
    /// stream ordering: the host never waits, the stream does.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver refuses `cuLaunchHostFunc`.
    pub fn hold(&self, stream: &StreamHandle) -> Result<StreamGate> {
        let latch = Arc::new(Latch::default());
        // SAFETY: the handle keeps its stream alive (see `synchronize`).
        unsafe {
            cuda::hold_stream(
                stream.context(),
                stream.as_raw(),
                Arc::clone(&latch),
                GATE_LIMIT,
            )
        }?;
        Ok(StreamGate { latch })
    }

    /// Enqueues on `stream` a fill of `bytes` bytes at device address `addr` with the 32-bit
    /// `value` (`cuMemsetD32Async`). For tests and benchmarks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `addr` or `bytes` is not a multiple of 4, [`Error::Cuda`]
    /// if the driver refuses.
    ///
    /// # Safety
    /// `addr..addr + bytes` must be device memory of this context (a block of a device pool)
    /// that stays allocated until the fill has run, and no other stream may use it meanwhile
    /// unless ordered with this one.
    pub unsafe fn fill_async(
        &self,
        addr: usize,
        value: u32,
        bytes: usize,
        stream: &StreamHandle,
    ) -> Result<()> {
        if addr % 4 != 0 || bytes % 4 != 0 {
            return Err(Error::InvalidArgument(format!(
                "fill of {bytes} bytes at {addr:#x}: both must be multiples of 4"
            )));
        }
        // SAFETY: the caller's contract; the stream is alive (see `synchronize`).
        unsafe {
            calls::memset_d32_async(
                stream.context(),
                addr as u64,
                value,
                bytes / 4,
                stream.as_raw(),
            )
        }
    }

    /// Enqueues on `stream` a copy of `len` bytes from device address `src` to `dst`
    /// (`cuMemcpyDtoHAsync`). For tests and benchmarks.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver refuses.
    ///
    /// # Safety
    /// `dst..dst + len` must be pinned host memory that nothing else reads or writes until the
    /// copy has run; `src..src + len` device memory of this context that stays allocated until
    /// then.
    pub unsafe fn copy_to_host_async(
        &self,
        dst: *mut u8,
        src: usize,
        len: usize,
        stream: &StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller's contract; the stream is alive (see `synchronize`).
        unsafe {
            calls::memcpy_dtoh_async(
                stream.context(),
                dst.cast(),
                src as u64,
                len,
                stream.as_raw(),
            )
        }
    }
}

impl StreamOrder for CudaStreams {
    type Stream = StreamHandle;
    type Event = OrderEvent;

    fn stream_id(&self, stream: &StreamHandle) -> StreamId {
        stream.id()
    }

    fn create_event(&self) -> Result<OrderEvent> {
        Event::new(self.context).map(OrderEvent)
    }

    fn record(&self, event: &OrderEvent, stream: &StreamHandle) -> Result<()> {
        // SAFETY: the event is alive (owned by `event`), the stream too (see `synchronize`).
        unsafe { calls::event_record(event.0.context(), event.0.as_raw(), stream.as_raw()) }
    }

    fn is_complete(&self, event: &OrderEvent) -> Result<bool> {
        // SAFETY: the event is alive (owned by `event`).
        unsafe { calls::event_query(event.0.context(), event.0.as_raw()) }
    }

    fn wait(&self, stream: &StreamHandle, event: &OrderEvent) -> Result<()> {
        // SAFETY: the event is alive (owned by `event`), the stream too (see `synchronize`).
        unsafe { calls::stream_wait_event(stream.context(), stream.as_raw(), event.0.as_raw()) }
    }
}

/// Chunks whose alignment was made by over-allocating: aligned address → what the driver
/// returned. Upstream calls are rare (one per pool growth), so one mutex is plenty.
#[derive(Debug, Default)]
struct Overallocated(Mutex<HashMap<usize, usize>>);

impl Overallocated {
    /// Allocates `bytes` aligned to `align` with `alloc`, which aligns to `natural` by itself.
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        natural: usize,
        alloc: impl FnOnce(usize) -> Result<usize>,
    ) -> Result<usize> {
        if bytes == 0 || !align.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "upstream asked for {bytes} bytes aligned to {align}"
            )));
        }
        if align <= natural {
            return alloc(bytes);
        }
        let total = bytes.checked_add(align - natural).ok_or_else(|| {
            Error::OutOfMemory(format!(
                "{bytes} bytes aligned to {align} overflow the address space"
            ))
        })?;
        let raw = alloc(total)?;
        let aligned = raw.next_multiple_of(align);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(aligned, raw);
        Ok(aligned)
    }

    /// What the driver returned for the chunk at `addr`.
    fn original(&self, addr: usize) -> usize {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&addr)
            .unwrap_or(addr)
    }
}

/// Device memory from `cuMemAlloc` in one context, for a pool of device memory.
///
/// `cuMemAlloc` aligns to at least 256 bytes; a larger alignment is made by over-allocating.
#[derive(Debug)]
pub struct DeviceUpstream {
    context: Context,
    over: Overallocated,
}

impl DeviceUpstream {
    /// An upstream allocating in `context`.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver.
    pub fn new(context: Context) -> Result<DeviceUpstream> {
        cuda::available()?;
        Ok(DeviceUpstream {
            context,
            over: Overallocated::default(),
        })
    }

    /// The context memory is allocated in.
    pub fn context(&self) -> Context {
        self.context
    }
}

/// What `cuMemAlloc` guarantees.
const DEVICE_NATURAL_ALIGN: usize = 256;
/// What `cuMemHostAlloc` guarantees (whole pages).
const PINNED_NATURAL_ALIGN: usize = 4096;

impl Upstream for DeviceUpstream {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<usize> {
        self.over.allocate(bytes, align, DEVICE_NATURAL_ALIGN, |n| {
            calls::mem_alloc(self.context, n)
                .map(|p| p as usize)
                .map_err(|e| calls::pool_alloc_error(e, n))
        })
    }

    unsafe fn deallocate(&self, addr: usize, _bytes: usize, _align: usize) -> Result<()> {
        let raw = self.over.original(addr);
        // SAFETY: `raw` is what `cuMemAlloc` returned for this chunk (the caller's contract),
        // returned once; cuMemFree waits for device work still using it.
        unsafe { calls::mem_free(self.context, raw as u64) }
    }
}

/// Page-locked host memory from `cuMemHostAlloc` (pinned for every context), for a pool of
/// pinned memory. The host can read and write it, and copies from and to it run
/// asynchronously.
#[derive(Debug)]
pub struct PinnedUpstream {
    context: Context,
    over: Overallocated,
}

impl PinnedUpstream {
    /// An upstream allocating with `context` current.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver.
    pub fn new(context: Context) -> Result<PinnedUpstream> {
        cuda::available()?;
        Ok(PinnedUpstream {
            context,
            over: Overallocated::default(),
        })
    }
}

impl Upstream for PinnedUpstream {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Pinned
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<usize> {
        self.over.allocate(bytes, align, PINNED_NATURAL_ALIGN, |n| {
            calls::mem_host_alloc(self.context, n)
                .map(|p| p.as_ptr() as usize)
                .map_err(|e| calls::pool_alloc_error(e, n))
        })
    }

    unsafe fn deallocate(&self, addr: usize, _bytes: usize, _align: usize) -> Result<()> {
        let raw = self.over.original(addr);
        let Some(ptr) = NonNull::new(raw as *mut c_void) else {
            return Err(Error::InvalidArgument(
                "pinned upstream asked to free a null pointer".to_string(),
            ));
        };
        // SAFETY: `ptr` is what `cuMemHostAlloc` returned for this chunk (the caller's
        // contract), freed once.
        unsafe { calls::mem_free_host(self.context, ptr) }
    }
}

/// The driver's own stream-ordered pool (`cuMemAllocAsync` / `cuMemFreeAsync` on the device's
/// default memory pool), with the same shape of interface as
/// [`PoolResource`](super::PoolResource), so benchmarks can compare the two.
#[derive(Clone, Copy, Debug)]
pub struct DriverPool {
    context: Context,
}

impl DriverPool {
    /// The default memory pool of `context`'s device, set to keep freed memory across
    /// synchronizations (release threshold: no limit, as RMM's `cuda_async_memory_resource`
    /// sets it). That setting is the device's, for the whole process.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`], or [`Error::Cuda`] if the device has no memory pools.
    pub fn new(context: Context) -> Result<DriverPool> {
        calls::keep_default_mem_pool(context)?;
        Ok(DriverPool { context })
    }

    /// `bytes` of device memory usable on `stream` in stream order.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] or [`Error::Cuda`] as the driver reports.
    pub fn allocate(&self, bytes: usize, stream: &StreamHandle) -> Result<usize> {
        // SAFETY: the handle keeps its stream alive (see `CudaStreams::synchronize`).
        unsafe { calls::mem_alloc_async(self.context, bytes, stream.as_raw()) }
            .map(|p| p as usize)
            .map_err(|e| calls::pool_alloc_error(e, bytes))
    }

    /// Returns `addr` to the pool in `stream`'s order.
    ///
    /// # Errors
    /// [`Error::Cuda`] as the driver reports.
    ///
    /// # Safety
    /// `addr` must come from [`allocate`](Self::allocate) and not be freed before; every use of
    /// it must be ordered before this point of `stream`.
    pub unsafe fn deallocate(&self, addr: usize, stream: &StreamHandle) -> Result<()> {
        // SAFETY: the caller's contract; the stream is alive.
        unsafe { calls::mem_free_async(self.context, addr as u64, stream.as_raw()) }
    }
}
