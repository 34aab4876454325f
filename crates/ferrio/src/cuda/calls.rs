//! Thin wrappers over the driver calls that the stream-ordered memory pool (`crate::memory`)
//! and its tests and benchmarks make: streams, events, device and pinned allocations, the
//! driver's own stream-ordered pool, and a few asynchronous operations to put work on a
//! stream.
//!
//! Each wrapper makes its context current for the call (a [`Context::push`], which costs one
//! thread-local lookup in the driver when the context is current already) and turns the result
//! code into a [`Result`]. Handles are raw pointers: the typed, owning wrappers live in
//! `memory/cuda.rs`, which holds no FFI of its own.

use std::ffi::{c_uint, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::driver::{self, CuDevicePtr, Driver, Handle, HostFn};
use super::Context;
use crate::error::{Error, Result};

/// A raw `CUstream`. Null is the legacy default stream, as in the driver API.
pub(crate) type RawStream = *mut c_void;

fn bound(ctx: Context) -> Result<(&'static Driver, super::ContextGuard)> {
    let d = driver::get()?;
    let guard = ctx.push()?;
    Ok((d, guard))
}

fn non_null(call: &'static str, raw: Handle) -> Result<NonNull<c_void>> {
    NonNull::new(raw).ok_or_else(|| Error::Cuda {
        call,
        code: 0,
        message: "returned a null handle".to_string(),
    })
}

/// The error of an allocation call: running out of memory is [`Error::OutOfMemory`].
fn alloc_error(d: &Driver, call: &'static str, bytes: usize, code: driver::CuResult) -> Error {
    if code == driver::CUDA_ERROR_OUT_OF_MEMORY {
        Error::OutOfMemory(format!("{call} of {bytes} bytes: {}", d.describe(code)))
    } else {
        Error::Cuda {
            call,
            code,
            message: format!("allocating {bytes} bytes: {}", d.describe(code)),
        }
    }
}

/// A new non-blocking stream (it never waits for the legacy default stream) in `ctx`.
pub(crate) fn stream_create(ctx: Context) -> Result<NonNull<c_void>> {
    let (d, _g) = bound(ctx)?;
    let mut s: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    d.check("cuStreamCreate", unsafe {
        (d.api.stream_create)(&mut s, driver::CU_STREAM_NON_BLOCKING)
    })?;
    non_null("cuStreamCreate", s)
}

/// Destroys a stream; work already queued on it still completes.
///
/// # Safety
/// `stream` must come from [`stream_create`] in `ctx` and not be used afterwards.
pub(crate) unsafe fn stream_destroy(ctx: Context, stream: NonNull<c_void>) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller passes a live stream of this context and gives it up.
    let code = unsafe { (d.api.stream_destroy)(stream.as_ptr()) };
    if code == driver::CUDA_ERROR_DEINITIALIZED {
        return Ok(());
    }
    d.check("cuStreamDestroy", code)
}

/// A new event used only for ordering (`CU_EVENT_DISABLE_TIMING`: cheaper to record and query).
pub(crate) fn event_create(ctx: Context) -> Result<NonNull<c_void>> {
    let (d, _g) = bound(ctx)?;
    let mut e: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    d.check("cuEventCreate", unsafe {
        (d.api.event_create)(&mut e, driver::CU_EVENT_DISABLE_TIMING)
    })?;
    non_null("cuEventCreate", e)
}

/// Destroys an event. A driver that is shutting down (`CUDA_ERROR_DEINITIALIZED`) counts as
/// success: the event goes with it.
///
/// # Safety
/// `event` must come from [`event_create`] in `ctx` and not be used afterwards.
pub(crate) unsafe fn event_destroy(ctx: Context, event: NonNull<c_void>) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller passes a live event of this context and gives it up.
    let code = unsafe { (d.api.event_destroy)(event.as_ptr()) };
    if code == driver::CUDA_ERROR_DEINITIALIZED {
        return Ok(());
    }
    d.check("cuEventDestroy", code)
}

/// Records `event` on `stream`.
///
/// # Safety
/// `event` must be a live event of `ctx`, and `stream` a live stream of `ctx` (or null).
pub(crate) unsafe fn event_record(
    ctx: Context,
    event: NonNull<c_void>,
    stream: RawStream,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: live handles of the current context (the caller's contract).
    d.check("cuEventRecord", unsafe {
        (d.api.event_record)(event.as_ptr(), stream)
    })
}

/// Whether the event's latest record has completed (true if it was never recorded).
///
/// # Safety
/// `event` must be a live event of `ctx`.
pub(crate) unsafe fn event_query(ctx: Context, event: NonNull<c_void>) -> Result<bool> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: a live event (the caller's contract); the query never blocks.
    let code = unsafe { (d.api.event_query)(event.as_ptr()) };
    if code == driver::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    d.check("cuEventQuery", code).map(|()| true)
}

/// Makes later work on `stream` wait, on the device, for the event's latest record.
///
/// # Safety
/// As for [`event_record`].
pub(crate) unsafe fn stream_wait_event(
    ctx: Context,
    stream: RawStream,
    event: NonNull<c_void>,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: live handles of the current context (the caller's contract); flags must be 0.
    d.check("cuStreamWaitEvent", unsafe {
        (d.api.stream_wait_event)(stream, event.as_ptr(), 0)
    })
}

/// Blocks until every operation queued on `stream` has completed.
///
/// # Safety
/// `stream` must be a live stream of `ctx` (or null).
pub(crate) unsafe fn stream_synchronize(ctx: Context, stream: RawStream) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: a live stream (the caller's contract).
    d.check("cuStreamSynchronize", unsafe {
        (d.api.stream_synchronize)(stream)
    })
}

/// `bytes` of device memory in `ctx` (`cuMemAlloc`, aligned to at least 256 bytes).
pub(crate) fn mem_alloc(ctx: Context, bytes: usize) -> Result<CuDevicePtr> {
    let (d, _g) = bound(ctx)?;
    let mut p: CuDevicePtr = 0;
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    let code = unsafe { (d.api.mem_alloc)(&mut p, bytes) };
    if code != driver::CUDA_SUCCESS {
        return Err(alloc_error(d, "cuMemAlloc", bytes, code));
    }
    Ok(p)
}

/// Frees device memory; `cuMemFree` waits for work still using it.
///
/// # Safety
/// `ptr` must come from [`mem_alloc`] in `ctx` and not be freed before or used afterwards.
pub(crate) unsafe fn mem_free(ctx: Context, ptr: CuDevicePtr) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract.
    d.check("cuMemFree", unsafe { (d.api.mem_free)(ptr) })
}

/// `bytes` of page-locked host memory, pinned for every context (`CU_MEMHOSTALLOC_PORTABLE`).
pub(crate) fn mem_host_alloc(ctx: Context, bytes: usize) -> Result<NonNull<c_void>> {
    let (d, _g) = bound(ctx)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    let code = unsafe { (d.api.mem_host_alloc)(&mut p, bytes, driver::CU_MEMHOSTALLOC_PORTABLE) };
    if code != driver::CUDA_SUCCESS {
        return Err(alloc_error(d, "cuMemHostAlloc", bytes, code));
    }
    non_null("cuMemHostAlloc", p)
}

/// Frees pinned host memory.
///
/// # Safety
/// `ptr` must come from [`mem_host_alloc`] and not be freed before or used afterwards.
pub(crate) unsafe fn mem_free_host(ctx: Context, ptr: NonNull<c_void>) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract.
    d.check("cuMemFreeHost", unsafe {
        (d.api.mem_free_host)(ptr.as_ptr())
    })
}

/// Makes the default memory pool of `ctx`'s device keep what is freed into it across
/// synchronizations (release threshold = no limit), as RMM's `cuda_async_memory_resource`
/// does; otherwise every synchronization returns the pool's memory to the device.
pub(crate) fn keep_default_mem_pool(ctx: Context) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    let mut dev: driver::CuDevice = 0;
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    d.check("cuCtxGetDevice", unsafe {
        (d.api.ctx_get_device)(&mut dev)
    })?;
    let mut pool: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; `dev` came from the driver.
    d.check("cuDeviceGetDefaultMemPool", unsafe {
        (d.api.device_get_default_mem_pool)(&mut pool, dev)
    })?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release threshold attribute takes a pointer to a cuuint64_t, here a live local.
    d.check("cuMemPoolSetAttribute", unsafe {
        (d.api.mem_pool_set_attribute)(
            pool,
            driver::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    })
}

/// `bytes` from the driver's stream-ordered pool, usable on `stream` (`cuMemAllocAsync`).
///
/// # Safety
/// `stream` must be a live stream of `ctx` (or null).
pub(crate) unsafe fn mem_alloc_async(
    ctx: Context,
    bytes: usize,
    stream: RawStream,
) -> Result<CuDevicePtr> {
    let (d, _g) = bound(ctx)?;
    let mut p: CuDevicePtr = 0;
    // SAFETY: out-pointer to a live local; a live stream (the caller's contract).
    let code = unsafe { (d.api.mem_alloc_async)(&mut p, bytes, stream) };
    if code != driver::CUDA_SUCCESS {
        return Err(alloc_error(d, "cuMemAllocAsync", bytes, code));
    }
    Ok(p)
}

/// Returns memory to the driver's stream-ordered pool in `stream`'s order (`cuMemFreeAsync`).
///
/// # Safety
/// `ptr` must come from [`mem_alloc_async`] and not be freed before; every use of it must be
/// ordered before this point of `stream`.
pub(crate) unsafe fn mem_free_async(
    ctx: Context,
    ptr: CuDevicePtr,
    stream: RawStream,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract.
    d.check("cuMemFreeAsync", unsafe {
        (d.api.mem_free_async)(ptr, stream)
    })
}

/// Enqueues, on `stream`, a fill of `words` 32-bit words at `dst` with `value`.
///
/// # Safety
/// `dst..dst + 4 * words` must be device memory (or pinned host memory mapped for the device)
/// that stays allocated until the fill has run; `stream` a live stream of `ctx` (or null).
pub(crate) unsafe fn memset_d32_async(
    ctx: Context,
    dst: CuDevicePtr,
    value: u32,
    words: usize,
    stream: RawStream,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract.
    d.check("cuMemsetD32Async", unsafe {
        (d.api.memset_d32_async)(dst, c_uint::from(value), words, stream)
    })
}

/// Enqueues, on `stream`, a copy of `len` bytes from device address `src` to `dst`.
///
/// # Safety
/// `dst..dst + len` must be host memory (pinned, for the copy to be asynchronous) that nothing
/// else touches until the copy has run; `src..src + len` device memory that stays allocated
/// until then; `stream` a live stream of `ctx` (or null).
pub(crate) unsafe fn memcpy_dtoh_async(
    ctx: Context,
    dst: *mut c_void,
    src: CuDevicePtr,
    len: usize,
    stream: RawStream,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract.
    d.check("cuMemcpyDtoHAsync", unsafe {
        (d.api.memcpy_dtoh_async)(dst, src, len, stream)
    })
}

/// Enqueues `f(data)` on `stream`: the driver calls it from one of its threads once the work
/// before it has completed, and holds later work on the stream until it returns.
///
/// # Safety
/// `f` must be safe to call once with `data` from another thread, must not call the CUDA API,
/// and must return eventually; `stream` must be a live stream of `ctx` (or null).
pub(crate) unsafe fn launch_host_func(
    ctx: Context,
    stream: RawStream,
    f: HostFn,
    data: *mut c_void,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract.
    d.check("cuLaunchHostFunc", unsafe {
        (d.api.launch_host_func)(stream, f, data)
    })
}

/// A latch that streams can be held on until it opens (see [`hold_stream`]).
#[derive(Debug, Default)]
pub(crate) struct Latch {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Latch {
    /// Opens the latch, releasing every stream held on it.
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.opened.notify_all();
    }

    /// Waits until the latch opens or `limit` has passed.
    fn wait(&self, limit: Duration) {
        let guard = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .opened
            .wait_timeout_while(guard, limit, |open| !*open)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// What the host function of [`hold_stream`] receives.
struct Hold {
    latch: Arc<Latch>,
    limit: Duration,
}

/// The host function of [`hold_stream`]: blocks the stream's progress until the latch opens.
unsafe extern "C" fn hold_until_open(data: *mut c_void) {
    // SAFETY: `data` is the `Box<Hold>` leaked by `hold_stream` for this one call; the driver
    // calls a host function exactly once.
    let hold = unsafe { Box::from_raw(data.cast::<Hold>()) };
    hold.latch.wait(hold.limit);
}

/// Enqueues on `stream` a host function that holds every later operation of the stream until
/// `latch` opens (or `limit` passes, so a forgotten latch cannot hang the process).
///
/// # Safety
/// `stream` must be a live stream of `ctx` (or null).
pub(crate) unsafe fn hold_stream(
    ctx: Context,
    stream: RawStream,
    latch: Arc<Latch>,
    limit: Duration,
) -> Result<()> {
    let data = Box::into_raw(Box::new(Hold { latch, limit }));
    let hold: HostFn = hold_until_open;
    // SAFETY: `hold_until_open` takes back the box exactly once, calls no CUDA function and
    // returns within `limit`; the stream is live (the caller's contract).
    let launched = unsafe { launch_host_func(ctx, stream, hold, data.cast()) };
    if launched.is_err() {
        // SAFETY: the launch failed, so the driver will never call the function: the box is
        // still ours, and freed once, here.
        drop(unsafe { Box::from_raw(data) });
    }
    launched
}
