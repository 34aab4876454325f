//! One safe, typed wrapper per CUDA driver call that ferrio makes: the only code outside
//! `driver.rs` (loading, `cuInit`, error text) that calls through the driver's function table.
//!
//! Each wrapper that needs a context takes it and makes it current for the call (a
//! [`Context::push`], which costs one thread-local lookup in the driver when the context is
//! current already), then turns the result code into a [`Result`]. Handles are raw pointers
//! here: the owning types ([`Stream`](super::Stream), [`Event`](super::Event),
//! [`DeviceBuffer`](super::DeviceBuffer)) and the adapters of the memory pool and the bounce
//! ring are built on top. This file keeps no state and knows nothing of rings or pools.
//!
//! A failed call is an [`Error::Cuda`] naming it, with the driver's description, with one rule
//! decided here once, for every caller: **releasing into a shut-down driver succeeds**. A
//! destroy or free that finds the driver deinitialised (`CUDA_ERROR_DEINITIALIZED`, from the
//! call or from making the context current before it) counts as success. That happens only
//! during process teardown, when the driver has already been shut down; the stream, event or
//! memory went with its context, so there is nothing left to release and nothing the caller
//! could do about an error.
//!
//! The memory pool's upstreams report a failed allocation in the pool's terms instead (running
//! out is [`Error::OutOfMemory`]); they reshape the wrapper's error with [`pool_alloc_error`].

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::NonNull;

use super::driver::{self, CuDevice, CuDevicePtr, Driver, Handle, HostFn};
use super::{Context, ContextGuard};
use crate::error::{Error, Result};

/// A raw `CUstream`. Null is the legacy default stream, as in the driver API.
pub(crate) type RawStream = *mut c_void;

/// The driver, with `ctx` current on this thread until the guard is dropped.
fn bound(ctx: Context) -> Result<(&'static Driver, ContextGuard)> {
    let d = driver::get()?;
    let guard = ctx.push()?;
    Ok((d, guard))
}

/// As [`bound`] for a destroy or free: `None` when the driver is deinitialised, so the
/// resource is gone already (see the module docs).
fn bound_for_release(ctx: Context) -> Result<Option<(&'static Driver, ContextGuard)>> {
    match bound(ctx) {
        Ok(bound) => Ok(Some(bound)),
        Err(Error::Cuda {
            code: driver::CUDA_ERROR_DEINITIALIZED,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The result of a destroy or free: `CUDA_ERROR_DEINITIALIZED` is success (see the module
/// docs).
fn check_release(d: &Driver, call: &'static str, code: driver::CuResult) -> Result<()> {
    if code == driver::CUDA_ERROR_DEINITIALIZED {
        return Ok(());
    }
    d.check(call, code)
}

fn non_null(call: &'static str, raw: Handle) -> Result<NonNull<c_void>> {
    NonNull::new(raw).ok_or_else(|| Error::Cuda {
        call,
        code: 0,
        message: "returned a null handle".to_string(),
    })
}

/// An allocation wrapper's error of `bytes` as the memory pool reports it: the driver running
/// out of memory is [`Error::OutOfMemory`], another refusal an [`Error::Cuda`] that names the
/// size. Other errors pass unchanged: those of making the context current first, no driver,
/// and a null pointer returned with success (code 0).
pub(crate) fn pool_alloc_error(err: Error, bytes: usize) -> Error {
    const ALLOCATIONS: [&str; 4] = [
        "cuMemAlloc",
        "cuMemAllocManaged",
        "cuMemHostAlloc",
        "cuMemAllocAsync",
    ];
    match err {
        Error::Cuda {
            call,
            code,
            message,
        } if code != driver::CUDA_SUCCESS && ALLOCATIONS.contains(&call) => {
            if code == driver::CUDA_ERROR_OUT_OF_MEMORY {
                Error::OutOfMemory(format!("{call} of {bytes} bytes: {message}"))
            } else {
                Error::Cuda {
                    call,
                    code,
                    message: format!("allocating {bytes} bytes: {message}"),
                }
            }
        }
        other => other,
    }
}

/// `cuDeviceGet`: the device of ordinal `ordinal` (which the caller checked against the count).
pub(crate) fn device_get(ordinal: c_int) -> Result<CuDevice> {
    let d = driver::get()?;
    let mut dev: CuDevice = 0;
    // SAFETY: out-pointer to a live local; the driver checks the ordinal.
    d.check("cuDeviceGet", unsafe {
        (d.api.device_get)(&mut dev, ordinal)
    })?;
    Ok(dev)
}

/// Reads a NUL-terminated string of at most `N - 1` bytes that `fill(buf, len)` writes.
fn device_string<const N: usize>(
    d: &Driver,
    call: &'static str,
    fill: impl FnOnce(*mut std::ffi::c_char, c_int) -> driver::CuResult,
) -> Result<String> {
    let mut buf = [0u8; N];
    // N is a small constant, well within c_int.
    d.check(call, fill(buf.as_mut_ptr().cast(), N as c_int))?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(N);
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// `cuDeviceGetName`: the device's product name.
pub(crate) fn device_get_name(dev: CuDevice) -> Result<String> {
    let d = driver::get()?;
    device_string::<256>(d, "cuDeviceGetName", |buf, len| {
        // SAFETY: `buf` is writable for `len` bytes; the driver writes a NUL-terminated name
        // of at most `len` bytes; `dev` came from cuDeviceGet.
        unsafe { (d.api.device_get_name)(buf, len, dev) }
    })
}

/// `cuDeviceGetPCIBusId`: the device's PCI address as the driver writes it
/// (`0000:0A:00.0`: domain, bus, device, function; hex digits in upper case).
pub(crate) fn device_get_pci_bus_id(dev: CuDevice) -> Result<String> {
    let d = driver::get()?;
    device_string::<64>(d, "cuDeviceGetPCIBusId", |buf, len| {
        // SAFETY: as for `device_get_name` (the id needs 13 bytes of the 64).
        unsafe { (d.api.device_get_pci_bus_id)(buf, len, dev) }
    })
}

/// `cuDeviceTotalMem`: the device's memory in bytes.
pub(crate) fn device_total_mem(dev: CuDevice) -> Result<usize> {
    let d = driver::get()?;
    let mut bytes = 0usize;
    // SAFETY: out-pointer to a live local; `dev` came from cuDeviceGet.
    d.check("cuDeviceTotalMem", unsafe {
        (d.api.device_total_mem)(&mut bytes, dev)
    })?;
    Ok(bytes)
}

/// `cuDevicePrimaryCtxRetain`: retains the primary context of `dev` (null if the driver returns
/// none). Nothing here releases it.
pub(crate) fn primary_ctx_retain(dev: CuDevice) -> Result<Handle> {
    let d = driver::get()?;
    let mut raw: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; `dev` came from cuDeviceGet. The retain is never
    // released: the context must outlive every ring and pointer that refers to it, and
    // releasing at process exit is what ferrio must not do.
    d.check("cuDevicePrimaryCtxRetain", unsafe {
        (d.api.primary_ctx_retain)(&mut raw, dev)
    })?;
    Ok(raw)
}

/// `cuCtxGetCurrent`: the calling thread's current context (null if none).
pub(crate) fn ctx_get_current() -> Result<Handle> {
    let d = driver::get()?;
    let mut current: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local.
    d.check("cuCtxGetCurrent", unsafe {
        (d.api.ctx_get_current)(&mut current)
    })?;
    Ok(current)
}

/// `cuCtxPushCurrent`: makes `ctx` current on the calling thread, on top of its context stack.
/// Each successful push must be matched by one [`ctx_pop_current`] on the same thread.
pub(crate) fn ctx_push_current(ctx: Context) -> Result<()> {
    let d = driver::get()?;
    // SAFETY: the handle is a context the driver gave us and that is never destroyed by
    // ferrio; pushing it only changes this thread's context stack.
    d.check("cuCtxPushCurrent", unsafe {
        (d.api.ctx_push_current)(ctx.as_raw())
    })
}

/// `cuCtxPopCurrent`: pops the calling thread's current context (the caller pushed it).
pub(crate) fn ctx_pop_current() -> Result<()> {
    let d = driver::get()?;
    let mut popped: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; popping only changes this thread's context stack.
    d.check("cuCtxPopCurrent", unsafe {
        (d.api.ctx_pop_current)(&mut popped)
    })
}

/// `cuCtxGetDevice`: the device of `ctx`.
pub(crate) fn ctx_get_device(ctx: Context) -> Result<CuDevice> {
    let (d, _g) = bound(ctx)?;
    let mut dev: CuDevice = 0;
    // SAFETY: out-pointer to a live local; a context is current (the guard).
    d.check("cuCtxGetDevice", unsafe {
        (d.api.ctx_get_device)(&mut dev)
    })?;
    Ok(dev)
}

/// What [`pointer_get_attributes`] learns about an address; all zero (and ordinal -1) for an
/// address CUDA does not know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PointerAttributes {
    /// `CU_POINTER_ATTRIBUTE_CONTEXT`: null for memory that names no context.
    pub(crate) context: Handle,
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (`CU_MEMORYTYPE_*`, 0 if unknown).
    pub(crate) memory_type: c_uint,
    /// `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
    pub(crate) managed: bool,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
    pub(crate) device_ordinal: c_int,
}

/// `cuPointerGetAttributes` for the context, memory type, managed flag and device ordinal of
/// `addr`. Needs no current context, and succeeds for addresses CUDA does not know.
pub(crate) fn pointer_get_attributes(addr: usize) -> Result<PointerAttributes> {
    let d = driver::get()?;
    let mut context: Handle = std::ptr::null_mut();
    let mut memory_type: c_uint = 0;
    // IS_MANAGED is documented as a boolean; a zeroed u32 reads right whether the driver writes
    // one byte or four.
    let mut managed: c_uint = 0;
    let mut ordinal: c_int = -1;
    let mut attributes = [
        driver::CU_POINTER_ATTRIBUTE_CONTEXT,
        driver::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        driver::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        driver::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    let mut data: [*mut c_void; 4] = [
        (&mut context as *mut Handle).cast(),
        (&mut memory_type as *mut c_uint).cast(),
        (&mut managed as *mut c_uint).cast(),
        (&mut ordinal as *mut c_int).cast(),
    ];
    // SAFETY: `attributes` and `data` have 4 entries each, and every data pointer points to a
    // live local of the type the attribute writes (CUcontext, unsigned, bool within a zeroed
    // unsigned, int). Unlike cuPointerGetAttribute, this call succeeds for addresses CUDA does
    // not know and leaves the outputs zero; it needs no current context.
    let code = unsafe {
        (d.api.pointer_get_attributes)(
            attributes.len() as c_uint,
            attributes.as_mut_ptr(),
            data.as_mut_ptr(),
            addr as u64,
        )
    };
    d.check("cuPointerGetAttributes", code)?;
    Ok(PointerAttributes {
        context,
        memory_type,
        managed: managed != 0,
        device_ordinal: ordinal,
    })
}

/// `cuStreamCreate`: a new non-blocking stream (it never waits for the legacy default stream)
/// in `ctx`.
pub(crate) fn stream_create(ctx: Context) -> Result<NonNull<c_void>> {
    let (d, _g) = bound(ctx)?;
    let mut s: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    d.check("cuStreamCreate", unsafe {
        (d.api.stream_create)(&mut s, driver::CU_STREAM_NON_BLOCKING)
    })?;
    non_null("cuStreamCreate", s)
}

/// `cuStreamDestroy`: destroys a stream; work already queued on it still completes. A
/// deinitialised driver counts as success (see the module docs).
///
/// # Safety
/// `stream` must come from [`stream_create`] in `ctx` and not be used afterwards.
pub(crate) unsafe fn stream_destroy(ctx: Context, stream: NonNull<c_void>) -> Result<()> {
    let Some((d, _g)) = bound_for_release(ctx)? else {
        return Ok(());
    };
    // SAFETY: the caller passes a live stream of this context and gives it up.
    let code = unsafe { (d.api.stream_destroy)(stream.as_ptr()) };
    check_release(d, "cuStreamDestroy", code)
}

/// `cuStreamSynchronize`: blocks until every operation queued on `stream` has completed.
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

/// `cuStreamWaitEvent`: makes later work on `stream` wait, on the device, for the event's
/// latest record.
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

/// `cuEventCreate`: a new event used only for ordering (`CU_EVENT_DISABLE_TIMING`: cheaper to
/// record and query).
pub(crate) fn event_create(ctx: Context) -> Result<NonNull<c_void>> {
    let (d, _g) = bound(ctx)?;
    let mut e: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    d.check("cuEventCreate", unsafe {
        (d.api.event_create)(&mut e, driver::CU_EVENT_DISABLE_TIMING)
    })?;
    non_null("cuEventCreate", e)
}

/// `cuEventDestroy`: destroys an event. A deinitialised driver counts as success (see the
/// module docs).
///
/// # Safety
/// `event` must come from [`event_create`] in `ctx` and not be used afterwards.
pub(crate) unsafe fn event_destroy(ctx: Context, event: NonNull<c_void>) -> Result<()> {
    let Some((d, _g)) = bound_for_release(ctx)? else {
        return Ok(());
    };
    // SAFETY: the caller passes a live event of this context and gives it up.
    let code = unsafe { (d.api.event_destroy)(event.as_ptr()) };
    check_release(d, "cuEventDestroy", code)
}

/// `cuEventRecord`: records `event` on `stream`.
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

/// `cuEventQuery`: whether the event's latest record has completed (true if it was never
/// recorded). Never blocks.
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

/// `cuEventSynchronize`: blocks until the event's latest record has completed.
///
/// # Safety
/// `event` must be a live event of `ctx`.
pub(crate) unsafe fn event_synchronize(ctx: Context, event: NonNull<c_void>) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: a live event (the caller's contract).
    d.check("cuEventSynchronize", unsafe {
        (d.api.event_synchronize)(event.as_ptr())
    })
}

/// `cuMemAlloc`: `bytes` of device memory in `ctx` (aligned to at least 256 bytes).
pub(crate) fn mem_alloc(ctx: Context, bytes: usize) -> Result<CuDevicePtr> {
    let (d, _g) = bound(ctx)?;
    let mut p: CuDevicePtr = 0;
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    let code = unsafe { (d.api.mem_alloc)(&mut p, bytes) };
    d.check("cuMemAlloc", code)?;
    Ok(p)
}

/// `cuMemAllocManaged`: `bytes` of managed (unified) memory in `ctx`, attached globally
/// (`CU_MEM_ATTACH_GLOBAL`: any stream of any device may use it).
pub(crate) fn mem_alloc_managed(ctx: Context, bytes: usize) -> Result<CuDevicePtr> {
    let (d, _g) = bound(ctx)?;
    let mut p: CuDevicePtr = 0;
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    let code = unsafe { (d.api.mem_alloc_managed)(&mut p, bytes, driver::CU_MEM_ATTACH_GLOBAL) };
    d.check("cuMemAllocManaged", code)?;
    Ok(p)
}

/// `cuMemFree`: frees device memory; it waits for work still using it. A deinitialised driver
/// counts as success (see the module docs).
///
/// # Safety
/// `ptr` must come from [`mem_alloc`] or [`mem_alloc_managed`] in `ctx` and not be freed before
/// or used afterwards.
pub(crate) unsafe fn mem_free(ctx: Context, ptr: CuDevicePtr) -> Result<()> {
    let Some((d, _g)) = bound_for_release(ctx)? else {
        return Ok(());
    };
    // SAFETY: the caller's contract.
    let code = unsafe { (d.api.mem_free)(ptr) };
    check_release(d, "cuMemFree", code)
}

/// `cuMemHostAlloc`: `bytes` of page-locked host memory, pinned for every context
/// (`CU_MEMHOSTALLOC_PORTABLE`, so a buffer is never silently treated as pageable by another
/// context).
pub(crate) fn mem_host_alloc(ctx: Context, bytes: usize) -> Result<NonNull<c_void>> {
    let (d, _g) = bound(ctx)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; the context is current (the guard).
    let code = unsafe { (d.api.mem_host_alloc)(&mut p, bytes, driver::CU_MEMHOSTALLOC_PORTABLE) };
    d.check("cuMemHostAlloc", code)?;
    non_null("cuMemHostAlloc", p)
}

/// `cuMemHostRegister`: pins `bytes` of host memory at `ptr`, allocated elsewhere, for every
/// context (`CU_MEMHOSTREGISTER_PORTABLE`, as [`mem_host_alloc`] does).
///
/// # Safety
/// `ptr..ptr+bytes` must be mapped host memory that stays mapped until
/// [`mem_host_unregister`].
pub(crate) unsafe fn mem_host_register(
    ctx: Context,
    ptr: NonNull<c_void>,
    bytes: usize,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract; the context is current (the guard).
    let code = unsafe {
        (d.api.mem_host_register)(ptr.as_ptr(), bytes, driver::CU_MEMHOSTREGISTER_PORTABLE)
    };
    d.check("cuMemHostRegister", code)
}

/// `cuMemHostUnregister`: unpins memory from [`mem_host_register`]. A deinitialised driver
/// counts as success (see the module docs).
///
/// # Safety
/// `ptr` must be the start of a range registered with [`mem_host_register`], unregistered
/// once, and no copy may still use it.
pub(crate) unsafe fn mem_host_unregister(ctx: Context, ptr: NonNull<c_void>) -> Result<()> {
    let Some((d, _g)) = bound_for_release(ctx)? else {
        return Ok(());
    };
    // SAFETY: the caller's contract.
    let code = unsafe { (d.api.mem_host_unregister)(ptr.as_ptr()) };
    check_release(d, "cuMemHostUnregister", code)
}

/// `cuMemFreeHost`: frees pinned host memory. A deinitialised driver counts as success (see
/// the module docs).
///
/// # Safety
/// `ptr` must come from [`mem_host_alloc`] and not be freed before or used afterwards (no copy
/// may still use it).
pub(crate) unsafe fn mem_free_host(ctx: Context, ptr: NonNull<c_void>) -> Result<()> {
    let Some((d, _g)) = bound_for_release(ctx)? else {
        return Ok(());
    };
    // SAFETY: the caller's contract.
    let code = unsafe { (d.api.mem_free_host)(ptr.as_ptr()) };
    check_release(d, "cuMemFreeHost", code)
}

/// `cuDeviceGetDefaultMemPool`: the default memory pool of device `dev` (of `ctx`).
pub(crate) fn device_get_default_mem_pool(ctx: Context, dev: CuDevice) -> Result<Handle> {
    let (d, _g) = bound(ctx)?;
    let mut pool: Handle = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; `dev` came from the driver.
    d.check("cuDeviceGetDefaultMemPool", unsafe {
        (d.api.device_get_default_mem_pool)(&mut pool, dev)
    })?;
    Ok(pool)
}

/// `cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)`: the bytes `pool` keeps across
/// synchronizations before it trims.
///
/// # Safety
/// `pool` must be a memory pool from the driver (a device's default pool).
pub(crate) unsafe fn mem_pool_set_release_threshold(
    ctx: Context,
    pool: Handle,
    bytes: u64,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    let mut threshold: u64 = bytes;
    // SAFETY: a pool from the driver (the caller's contract); the release threshold attribute
    // takes a pointer to a cuuint64_t, here a live local.
    d.check("cuMemPoolSetAttribute", unsafe {
        (d.api.mem_pool_set_attribute)(
            pool,
            driver::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    })
}

/// Makes the default memory pool of `ctx`'s device keep what is freed into it across
/// synchronizations (release threshold = no limit), as RMM's `cuda_async_memory_resource`
/// does; otherwise every synchronization returns the pool's memory to the device.
pub(crate) fn keep_default_mem_pool(ctx: Context) -> Result<()> {
    // One push for the three calls (each wrapper's own push is then a no-op).
    let (_d, _g) = bound(ctx)?;
    let dev = ctx_get_device(ctx)?;
    let pool = device_get_default_mem_pool(ctx, dev)?;
    // SAFETY: `pool` came from cuDeviceGetDefaultMemPool just above.
    unsafe { mem_pool_set_release_threshold(ctx, pool, u64::MAX) }
}

/// `cuMemAllocAsync`: `bytes` from the driver's stream-ordered pool, usable on `stream`.
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
    d.check("cuMemAllocAsync", code)?;
    Ok(p)
}

/// `cuMemFreeAsync`: returns memory to the driver's stream-ordered pool in `stream`'s order. A
/// deinitialised driver counts as success (see the module docs).
///
/// # Safety
/// `ptr` must come from [`mem_alloc_async`] and not be freed before; every use of it must be
/// ordered before this point of `stream`.
pub(crate) unsafe fn mem_free_async(
    ctx: Context,
    ptr: CuDevicePtr,
    stream: RawStream,
) -> Result<()> {
    let Some((d, _g)) = bound_for_release(ctx)? else {
        return Ok(());
    };
    // SAFETY: the caller's contract.
    let code = unsafe { (d.api.mem_free_async)(ptr, stream) };
    check_release(d, "cuMemFreeAsync", code)
}

/// `cuMemsetD32Async`: enqueues, on `stream`, a fill of `words` 32-bit words at `dst` with
/// `value`.
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

/// `cuMemcpyHtoD`: copies `len` bytes from host memory at `src` to device address `dst`, and
/// returns when the copy is done (it runs on the legacy default stream).
///
/// # Safety
/// `src..src + len` must be live host memory and `dst..dst + len` live device memory of `ctx`.
pub(crate) unsafe fn memcpy_htod(
    ctx: Context,
    dst: CuDevicePtr,
    src: *const c_void,
    len: usize,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract; the call returns when the copy is done.
    d.check("cuMemcpyHtoD", unsafe {
        (d.api.memcpy_htod)(dst, src, len)
    })
}

/// `cuMemcpyDtoH`: copies `len` bytes from device address `src` to host memory at `dst`, and
/// returns when the copy is done (it runs on the legacy default stream).
///
/// # Safety
/// `dst..dst + len` must be live host memory nothing else uses meanwhile, and `src..src + len`
/// live device memory of `ctx`.
pub(crate) unsafe fn memcpy_dtoh(
    ctx: Context,
    dst: *mut c_void,
    src: CuDevicePtr,
    len: usize,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract; the call returns when the copy is done.
    d.check("cuMemcpyDtoH", unsafe {
        (d.api.memcpy_dtoh)(dst, src, len)
    })
}

/// `cuMemcpyHtoDAsync`: enqueues, on `stream`, a copy of `len` bytes from host memory at `src`
/// to device address `dst`.
///
/// # Safety
/// `src..src + len` must be host memory (pinned, for the copy to be asynchronous) that nothing
/// writes or frees until the copy has run; `dst..dst + len` device memory reachable from `ctx`
/// that stays allocated until then; `stream` a live stream of `ctx` (or null).
pub(crate) unsafe fn memcpy_htod_async(
    ctx: Context,
    dst: CuDevicePtr,
    src: *const c_void,
    len: usize,
    stream: RawStream,
) -> Result<()> {
    let (d, _g) = bound(ctx)?;
    // SAFETY: the caller's contract.
    d.check("cuMemcpyHtoDAsync", unsafe {
        (d.api.memcpy_htod_async)(dst, src, len, stream)
    })
}

/// `cuMemcpyDtoHAsync`: enqueues, on `stream`, a copy of `len` bytes from device address `src`
/// to `dst`.
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

/// `cuLaunchHostFunc`: enqueues `f(data)` on `stream`: the driver calls it from one of its
/// threads once the work before it has completed, and holds later work on the stream until it
/// returns.
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
