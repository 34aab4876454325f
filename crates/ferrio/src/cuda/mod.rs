//! The CUDA driver, loaded at run time: availability, pointer classification, contexts, device
//! memory for tests, and [`CudaEngine`], the real-driver [`CopyEngine`] of the bounce ring.
//!
//! The crate builds without a CUDA toolkit and runs without a driver: `libcuda.so.1` is opened
//! on first use (see [`available`]), and when it cannot be, every function here that needs it
//! returns [`Error::CudaUnavailable`] with the reason, while [`classify`] calls everything host
//! memory. Raw driver calls live in the private `driver` module; this module turns them into
//! safe, typed operations. It owns no threads and keeps no per-thread state.
//!
//! Several GPUs in one process work: the context of an operation comes from the pointer
//! ([`classify`]), and a [`ContextGuard`] makes it current on the calling thread for the
//! duration of the operation only.

pub(crate) mod calls;
mod driver;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::bounce::CopyEngine;
use crate::error::{Error, Result};
use driver::{Driver, Handle};

/// Loads and initialises the driver on first call; `Ok` if CUDA can be used in this process.
///
/// Loading means `dlopen("libcuda.so.1")`, looking up the driver functions ferrio needs, and
/// `cuInit`; it costs from milliseconds to about a second the first time and nothing after. The
/// outcome is decided once per process.
///
/// # Errors
/// [`Error::CudaUnavailable`] saying why: no driver library, a driver older than CUDA 12.0,
/// `cuInit` failing (no device, a stub library, ...).
pub fn available() -> Result<()> {
    driver::get().map(|_| ())
}

/// What is known about the loaded driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverInfo {
    /// The CUDA version the driver supports, as `cuDriverGetVersion` encodes it
    /// (1000 × major + 10 × minor: 13000 is CUDA 13.0).
    pub version: i32,
    /// Number of visible devices (at least 1).
    pub device_count: usize,
}

/// The driver's version and device count, loading it if needed.
///
/// # Errors
/// [`Error::CudaUnavailable`] as for [`available`].
pub fn driver_info() -> Result<DriverInfo> {
    let d = driver::get()?;
    Ok(DriverInfo {
        version: d.version,
        device_count: usize::try_from(d.device_count).unwrap_or(0),
    })
}

/// A device address (`CUdeviceptr`). Plain data: holding one does not keep memory alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on, or `None` if it would overflow.
    pub fn checked_add(self, bytes: usize) -> Option<DevicePtr> {
        self.0
            .checked_add(u64::try_from(bytes).ok()?)
            .map(DevicePtr)
    }
}

/// A CUDA context (`CUcontext`): the handle operations on a device pointer run under.
///
/// Comparing and hashing compare the handle. Contexts found by ferrio are kept alive for the
/// life of the process (primary contexts are retained once and never released).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Context(NonNull<c_void>);

// SAFETY: a CUcontext is an opaque driver handle; the driver accepts it on any thread.
unsafe impl Send for Context {}
// SAFETY: as above; ferrio never dereferences the handle.
unsafe impl Sync for Context {}

impl Context {
    /// The primary context of device `ordinal`, retained on first use and never released (it
    /// is the context the CUDA runtime, PyTorch and CuPy use for that device).
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver, [`Error::InvalidArgument`] for an ordinal
    /// that names no device, [`Error::Cuda`] if the driver refuses.
    pub fn primary(ordinal: usize) -> Result<Context> {
        let d = driver::get()?;
        let count = usize::try_from(d.device_count).unwrap_or(0);
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA device {ordinal} does not exist ({count} visible)"
            )));
        }
        static PRIMARY: OnceLock<Vec<OnceLock<Context>>> = OnceLock::new();
        let slots = PRIMARY.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect());
        if let Some(ctx) = slots[ordinal].get() {
            return Ok(*ctx);
        }
        let ordinal_c = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("CUDA device {ordinal} out of range")))?;
        let mut dev = 0;
        // SAFETY: out-pointer to a live local; the ordinal is below the device count.
        d.check("cuDeviceGet", unsafe {
            (d.api.device_get)(&mut dev, ordinal_c)
        })?;
        let mut raw: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local; `dev` came from cuDeviceGet. The retain is never
        // released: the context must outlive every ring and pointer that refers to it, and
        // releasing at process exit is what ferrio must not do.
        d.check("cuDevicePrimaryCtxRetain", unsafe {
            (d.api.primary_ctx_retain)(&mut raw, dev)
        })?;
        let ctx = NonNull::new(raw).map(Context).ok_or(Error::Cuda {
            call: "cuDevicePrimaryCtxRetain",
            code: 0,
            message: "returned a null context".to_string(),
        })?;
        // Two threads may race to retain; both retains are leaked alike and the handles are equal.
        Ok(*slots[ordinal].get_or_init(|| ctx))
    }

    /// A number naming this context while the process lives (contexts ferrio finds are never
    /// released, so no other context takes the number).
    pub(crate) fn id(self) -> u64 {
        self.0.as_ptr() as usize as u64
    }

    /// Makes this context current on the calling thread until the guard is dropped, which
    /// restores the previous one. Nothing is pushed if it is current already.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver refuses the push; [`Error::CudaUnavailable`] without one.
    pub fn push(self) -> Result<ContextGuard> {
        let d = driver::get()?;
        let mut current: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuCtxGetCurrent", unsafe {
            (d.api.ctx_get_current)(&mut current)
        })?;
        if current == self.0.as_ptr() {
            return Ok(ContextGuard {
                pushed: None,
                _not_send: std::marker::PhantomData,
            });
        }
        // SAFETY: the handle is a context the driver gave us and that is never destroyed by
        // ferrio; pushing it only changes this thread's context stack.
        d.check("cuCtxPushCurrent", unsafe {
            (d.api.ctx_push_current)(self.0.as_ptr())
        })?;
        Ok(ContextGuard {
            pushed: Some(d),
            _not_send: std::marker::PhantomData,
        })
    }

    /// The ordinal of this context's device.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver refuses.
    pub fn device_ordinal(self) -> Result<usize> {
        let d = driver::get()?;
        let _g = self.push()?;
        let mut dev: c_int = 0;
        // SAFETY: out-pointer to a live local; a context is current (the guard).
        d.check("cuCtxGetDevice", unsafe {
            (d.api.ctx_get_device)(&mut dev)
        })?;
        usize::try_from(dev).map_err(|_| Error::Cuda {
            call: "cuCtxGetDevice",
            code: 0,
            message: format!("returned device {dev}"),
        })
    }
}

/// Keeps a context current on this thread; dropping it pops the context again.
///
/// Not `Send`: the context stack is per thread, so the guard must drop where it was made.
#[must_use = "the context is popped again when the guard is dropped"]
pub struct ContextGuard {
    pushed: Option<&'static Driver>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(d) = self.pushed {
            let mut popped: Handle = std::ptr::null_mut();
            // SAFETY: this guard pushed a context on this thread (it is !Send) and pops it once.
            // A failure cannot be reported from drop; it would mean the caller unbalanced the
            // stack in between, and the pop is best effort.
            let _ = unsafe { (d.api.ctx_pop_current)(&mut popped) };
        }
    }
}

/// Blocks until everything queued so far on `stream` has finished. `stream` is a raw `CUstream`
/// handle owned by another library (CuPy, PyTorch), or `1` / `2` for the legacy / per-thread
/// default stream, as `__cuda_array_interface__` and DLPack name them.
///
/// # Safety
/// `stream` must be a live stream of `context`, or 1 or 2.
pub unsafe fn synchronize_stream(context: Context, stream: usize) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { calls::stream_synchronize(context, stream as calls::RawStream) }
}

/// Where an address points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// Memory the CPU can read and write directly: ordinary (pageable) memory, memory unknown to
    /// CUDA, and pinned host memory (`cuMemHostAlloc`, `cuMemHostRegister`, `cudaMallocHost`).
    /// Without a driver, every address is host memory.
    Host,
    /// Device memory, to be reached through copies on a stream of `context`.
    ///
    /// Managed (unified) memory (`cuMemAllocManaged`, `cudaMallocManaged`) is classified here
    /// too: the CPU could touch it, but that faults its pages over to the host one by one, and
    /// `O_DIRECT` into it is not reliable; copying through the bounce ring leaves the data on the
    /// device, where a caller that chose managed memory for a GPU array wants it.
    Device {
        /// The context to run copies under: the one the memory was allocated in, or the
        /// device's primary context for memory that names none (virtual memory management
        /// allocations, `cuMemCreate`/`cuMemMap`, as PyTorch's expandable segments use).
        context: Context,
        /// The ordinal of the device that holds the memory.
        device_ordinal: usize,
    },
}

/// Where `addr` points: [`Memory::Host`] unless the driver knows it as device or managed memory.
///
/// Loads the driver on first use (see [`available`]), so call it only for addresses that may be
/// device memory (raw addresses from Python, say), not for Rust slices. A driver error while
/// asking counts as host memory: the address is then read and written by the CPU, and an
/// address the CPU cannot reach fails there with `EFAULT` instead of being copied wrongly. Use
/// [`try_classify`] to see such errors.
pub fn classify(addr: usize) -> Memory {
    try_classify(addr).unwrap_or(Memory::Host)
}

/// Like [`classify`], but a failure to ask the driver is an error.
///
/// # Errors
/// [`Error::Cuda`] if `cuPointerGetAttributes` fails or the device's primary context cannot be
/// retained. Without a driver the answer is `Ok(Memory::Host)`.
pub fn try_classify(addr: usize) -> Result<Memory> {
    let Ok(d) = driver::get() else {
        return Ok(Memory::Host);
    };
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
    let is_device = managed != 0
        || match memory_type {
            driver::CU_MEMORYTYPE_DEVICE
            | driver::CU_MEMORYTYPE_ARRAY
            | driver::CU_MEMORYTYPE_UNIFIED => true,
            // Pinned or registered host memory, memory unknown to CUDA (0), and kinds a future
            // driver may add: the CPU reads and writes them (or fails with EFAULT).
            driver::CU_MEMORYTYPE_HOST => false,
            _ => false,
        };
    if !is_device {
        return Ok(Memory::Host);
    }
    let device_ordinal = usize::try_from(ordinal).map_err(|_| Error::Cuda {
        call: "cuPointerGetAttributes",
        code: 0,
        message: format!("device memory at {addr:#x} has no device ordinal ({ordinal})"),
    })?;
    let context = match NonNull::new(context) {
        Some(c) => Context(c),
        None => Context::primary(device_ordinal)?,
    };
    Ok(Memory::Device {
        context,
        device_ordinal,
    })
}

/// Device memory from `cuMemAlloc` (or `cuMemAllocManaged`), freed on drop.
///
/// For tests, smoke tests and benchmarks; the I/O engine never allocates device memory. Do not
/// keep one in a static or thread-local: its drop calls the driver, which must not happen at
/// process exit.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: DevicePtr,
    len: usize,
    context: Context,
}

impl DeviceBuffer {
    /// `len` bytes (at least 1 is allocated) of device memory in the primary context of device
    /// `ordinal`; managed memory (`cuMemAllocManaged`, attached globally) if `managed`.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`], or [`Error::Cuda`] if the allocation fails.
    pub fn new(ordinal: usize, len: usize, managed: bool) -> Result<DeviceBuffer> {
        let d = driver::get()?;
        let context = Context::primary(ordinal)?;
        let _g = context.push()?;
        let mut raw: driver::CuDevicePtr = 0;
        let bytes = len.max(1);
        let code = if managed {
            // SAFETY: out-pointer to a live local; the context is current (the guard).
            unsafe { (d.api.mem_alloc_managed)(&mut raw, bytes, driver::CU_MEM_ATTACH_GLOBAL) }
        } else {
            // SAFETY: as above.
            unsafe { (d.api.mem_alloc)(&mut raw, bytes) }
        };
        d.check(
            if managed {
                "cuMemAllocManaged"
            } else {
                "cuMemAlloc"
            },
            code,
        )?;
        Ok(DeviceBuffer {
            ptr: DevicePtr(raw),
            len,
            context,
        })
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory was allocated in.
    pub fn context(&self) -> Context {
        self.context
    }

    /// Copies `src` to `offset` in this buffer and waits for the copy (`cuMemcpyHtoD`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range does not fit, [`Error::Cuda`] if the copy fails.
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        let d = driver::get()?;
        let _g = self.context.push()?;
        // SAFETY: the destination range lies within this live allocation (checked above) and
        // `src` is a live slice of `src.len()` bytes; the call returns when the copy is done.
        d.check("cuMemcpyHtoD", unsafe {
            (d.api.memcpy_htod)(self.ptr.0 + offset as u64, src.as_ptr().cast(), src.len())
        })
    }

    /// Copies `dst.len()` bytes from `offset` in this buffer into `dst` (`cuMemcpyDtoH`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range does not fit, [`Error::Cuda`] if the copy fails.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        let d = driver::get()?;
        let _g = self.context.push()?;
        // SAFETY: the source range lies within this live allocation (checked above) and `dst`
        // is a live, exclusively borrowed slice; the call returns when the copy is done.
        d.check("cuMemcpyDtoH", unsafe {
            (d.api.memcpy_dtoh)(
                dst.as_mut_ptr().cast(),
                self.ptr.0 + offset as u64,
                dst.len(),
            )
        })
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} outside a device buffer of {} bytes",
                self.len
            ))),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let Ok(d) = driver::get() else { return };
        let Ok(_g) = self.context.push() else { return };
        // SAFETY: the pointer came from cuMemAlloc/cuMemAllocManaged in this context and is
        // freed once. cuMemFree waits for work using it. An error cannot be reported from drop.
        let _ = unsafe { (d.api.mem_free)(self.ptr.0) };
    }
}

/// A CUDA stream of a [`CudaEngine`] (non-blocking: it never waits for the legacy default
/// stream).
#[derive(Debug)]
pub struct CudaStream(NonNull<c_void>);

/// A CUDA event of a [`CudaEngine`] (created with timing disabled, the cheap kind).
#[derive(Debug)]
pub struct CudaEvent(NonNull<c_void>);

// SAFETY: stream and event handles are opaque driver handles usable from any thread.
unsafe impl Send for CudaStream {}
// SAFETY: as above.
unsafe impl Send for CudaEvent {}

/// The real driver as a [`CopyEngine`]: every resource belongs to one context, which
/// [`CopyEngine::bind`] makes current for the duration of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaEngine {
    context: Context,
}

impl CudaEngine {
    /// An engine for `context` (from [`classify`] or [`Context::primary`]).
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver.
    pub fn new(context: Context) -> Result<CudaEngine> {
        driver::get()?;
        Ok(CudaEngine { context })
    }

    /// The context this engine works in.
    pub fn context(&self) -> Context {
        self.context
    }

    fn d(&self) -> Result<&'static Driver> {
        driver::get()
    }

    fn handle(call: &'static str, raw: Handle) -> Result<NonNull<c_void>> {
        NonNull::new(raw).ok_or_else(|| Error::Cuda {
            call,
            code: 0,
            message: "returned a null handle".to_string(),
        })
    }
}

impl CopyEngine for CudaEngine {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Binding = ContextGuard;

    fn bind(&self) -> Result<ContextGuard> {
        self.context.push()
    }

    fn alloc_pinned(&self, len: usize) -> Result<NonNull<u8>> {
        let d = self.d()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local. PORTABLE makes the memory pinned for every
        // context, so a buffer is never silently treated as pageable by another context.
        d.check("cuMemHostAlloc", unsafe {
            (d.api.mem_host_alloc)(&mut p, len, driver::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Self::handle("cuMemHostAlloc", p).map(NonNull::cast)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, _len: usize) -> Result<()> {
        let d = self.d()?;
        // SAFETY: the caller passes a pointer from `alloc_pinned` that no copy uses any more.
        d.check("cuMemFreeHost", unsafe {
            (d.api.mem_free_host)(ptr.as_ptr().cast())
        })
    }

    fn create_stream(&self) -> Result<CudaStream> {
        let d = self.d()?;
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local; the caller has bound the context.
        d.check("cuStreamCreate", unsafe {
            (d.api.stream_create)(&mut s, driver::CU_STREAM_NON_BLOCKING)
        })?;
        Self::handle("cuStreamCreate", s).map(CudaStream)
    }

    fn destroy_stream(&self, stream: CudaStream) -> Result<()> {
        let d = self.d()?;
        // SAFETY: the stream came from `create_stream` and is consumed; work still queued on it
        // completes before the driver releases it.
        d.check("cuStreamDestroy", unsafe {
            (d.api.stream_destroy)(stream.0.as_ptr())
        })
    }

    fn create_event(&self) -> Result<CudaEvent> {
        let d = self.d()?;
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local; the caller has bound the context.
        d.check("cuEventCreate", unsafe {
            (d.api.event_create)(&mut e, driver::CU_EVENT_DISABLE_TIMING)
        })?;
        Self::handle("cuEventCreate", e).map(CudaEvent)
    }

    fn destroy_event(&self, event: CudaEvent) -> Result<()> {
        let d = self.d()?;
        // SAFETY: the event came from `create_event` and is consumed.
        d.check("cuEventDestroy", unsafe {
            (d.api.event_destroy)(event.0.as_ptr())
        })
    }

    fn record(&self, event: &CudaEvent, stream: &CudaStream) -> Result<()> {
        let d = self.d()?;
        // SAFETY: both handles are live (owned by the caller) and belong to this context.
        d.check("cuEventRecord", unsafe {
            (d.api.event_record)(event.0.as_ptr(), stream.0.as_ptr())
        })
    }

    fn is_complete(&self, event: &CudaEvent) -> Result<bool> {
        let d = self.d()?;
        // SAFETY: the event handle is live.
        let code = unsafe { (d.api.event_query)(event.0.as_ptr()) };
        if code == driver::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        d.check("cuEventQuery", code).map(|()| true)
    }

    fn wait_event(&self, event: &CudaEvent) -> Result<()> {
        let d = self.d()?;
        // SAFETY: the event handle is live.
        d.check("cuEventSynchronize", unsafe {
            (d.api.event_synchronize)(event.0.as_ptr())
        })
    }

    fn wait_stream(&self, stream: &CudaStream) -> Result<()> {
        let d = self.d()?;
        // SAFETY: the stream handle is live.
        d.check("cuStreamSynchronize", unsafe {
            (d.api.stream_synchronize)(stream.0.as_ptr())
        })
    }

    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let d = self.d()?;
        // SAFETY: the caller guarantees `src..src+len` is pinned memory from `alloc_pinned`
        // left untouched until the copy completes, and `dst..dst+len` is device memory.
        d.check("cuMemcpyHtoDAsync", unsafe {
            (d.api.memcpy_htod_async)(dst.0, src.cast(), len, stream.0.as_ptr())
        })
    }

    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let d = self.d()?;
        // SAFETY: the caller guarantees `dst..dst+len` is pinned memory from `alloc_pinned`
        // that nothing reads or writes until the copy completes, and `src..src+len` is device
        // memory.
        d.check("cuMemcpyDtoHAsync", unsafe {
            (d.api.memcpy_dtoh_async)(dst.cast(), src.0, len, stream.0.as_ptr())
        })
    }
}
