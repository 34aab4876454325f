//! The raw CUDA driver API: `libcuda.so.1` opened with `dlopen` on first use and the few
//! functions ferrio calls looked up into one table of function pointers.
//!
//! This file is the only place that talks to the driver library. It owns loading, `cuInit`, the
//! symbol table and the conversion of result codes into [`Error::Cuda`]; it knows nothing about
//! rings, pointers or contexts beyond the raw handles.
//!
//! Why a table of our own and not a bindings crate: the driver returns result codes that newer
//! drivers keep adding to (`CUDA_ERROR_CONTAINED`, `CUDA_ERROR_KEY_ROTATION`, ... on Hopper).
//! Bindings that declare the result as a Rust `enum` make an unknown code undefined behaviour;
//! here every result is a plain `c_int`. A missing library or symbol is an error value, never a
//! panic. Only functions present in every CUDA 12.x driver (and most 11.x) are looked up, and
//! only their original, ABI-stable versions (`_v2` where the header maps to it).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// `CUresult`: kept as a plain integer so any code a driver returns is a valid value.
pub(crate) type CuResult = c_int;
/// `CUdevice`.
pub(crate) type CuDevice = c_int;
/// `CUdeviceptr` (64-bit on every supported platform).
pub(crate) type CuDevicePtr = u64;
/// `CUcontext`, `CUstream`, `CUevent`: opaque handles.
pub(crate) type Handle = *mut c_void;

pub(crate) const CUDA_SUCCESS: CuResult = 0;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub(crate) const CUDA_ERROR_DEINITIALIZED: CuResult = 4;
pub(crate) const CUDA_ERROR_NOT_READY: CuResult = 600;

pub(crate) const CU_POINTER_ATTRIBUTE_CONTEXT: c_int = 1;
pub(crate) const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
pub(crate) const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;

pub(crate) const CU_MEMORYTYPE_HOST: c_uint = 1;
pub(crate) const CU_MEMORYTYPE_DEVICE: c_uint = 2;
pub(crate) const CU_MEMORYTYPE_ARRAY: c_uint = 3;
pub(crate) const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 1;
pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 2;
pub(crate) const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;
pub(crate) const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 1;
pub(crate) const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: bytes a memory pool keeps before trimming at a sync.
pub(crate) const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;

/// The oldest driver ferrio accepts (CUDA 12.0, `cuDriverGetVersion` encoding).
const MIN_DRIVER_VERSION: c_int = 12000;

/// Library names tried in order: the runtime soname first (always installed with the driver),
/// then the development symlink.
const LIBRARY_NAMES: [&CStr; 2] = [c"libcuda.so.1", c"libcuda.so"];

macro_rules! driver_api {
    ($( $(#[$doc:meta])* $field:ident = $symbol:literal : fn($($arg:ty),* $(,)?); )*) => {
        /// The driver functions ferrio uses, resolved once.
        pub(crate) struct Api {
            $( $(#[$doc])* pub(crate) $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
        }

        impl Api {
            /// Looks every function up in `lib`, naming the first one missing.
            ///
            /// # Safety
            /// `lib` must be a live handle from `dlopen` of the CUDA driver library, so that each
            /// symbol has the C signature declared for it here.
            unsafe fn resolve(lib: *mut c_void) -> std::result::Result<Api, String> {
                Ok(Api {
                    $( $field: {
                        let p = symbol(lib, $symbol)?;
                        // SAFETY: `p` is the address of the driver's `$symbol`, whose C prototype
                        // in cuda.h is the one declared above; fn pointers and data pointers have
                        // the same size on every platform ferrio supports.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(p)
                        }
                    }, )*
                })
            }
        }
    };
}

driver_api! {
    /// `cuInit(flags)`.
    init = c"cuInit": fn(c_uint);
    /// `cuDriverGetVersion(int*)`.
    driver_get_version = c"cuDriverGetVersion": fn(*mut c_int);
    /// `cuGetErrorName(CUresult, const char**)`.
    get_error_name = c"cuGetErrorName": fn(CuResult, *mut *const c_char);
    /// `cuGetErrorString(CUresult, const char**)`.
    get_error_string = c"cuGetErrorString": fn(CuResult, *mut *const c_char);
    /// `cuDeviceGetCount(int*)`.
    device_get_count = c"cuDeviceGetCount": fn(*mut c_int);
    /// `cuDeviceGet(CUdevice*, int ordinal)`.
    device_get = c"cuDeviceGet": fn(*mut CuDevice, c_int);
    /// `cuDeviceGetName(char*, len, CUdevice)`.
    device_get_name = c"cuDeviceGetName": fn(*mut c_char, c_int, CuDevice);
    /// `cuDeviceGetPCIBusId(char*, len, CUdevice)`: `domain:bus:device.function`.
    device_get_pci_bus_id = c"cuDeviceGetPCIBusId": fn(*mut c_char, c_int, CuDevice);
    /// `cuDeviceTotalMem(size_t*, CUdevice)`.
    device_total_mem = c"cuDeviceTotalMem_v2": fn(*mut usize, CuDevice);
    /// `cuDevicePrimaryCtxRetain(CUcontext*, CUdevice)`.
    primary_ctx_retain = c"cuDevicePrimaryCtxRetain": fn(*mut Handle, CuDevice);
    /// `cuCtxGetCurrent(CUcontext*)`.
    ctx_get_current = c"cuCtxGetCurrent": fn(*mut Handle);
    /// `cuCtxPushCurrent(CUcontext)`.
    ctx_push_current = c"cuCtxPushCurrent_v2": fn(Handle);
    /// `cuCtxPopCurrent(CUcontext*)`.
    ctx_pop_current = c"cuCtxPopCurrent_v2": fn(*mut Handle);
    /// `cuCtxGetDevice(CUdevice*)` of the current context.
    ctx_get_device = c"cuCtxGetDevice": fn(*mut CuDevice);
    /// `cuPointerGetAttributes(n, attributes*, data**, ptr)`.
    pointer_get_attributes = c"cuPointerGetAttributes": fn(c_uint, *mut c_int, *mut *mut c_void, CuDevicePtr);
    /// `cuStreamCreate(CUstream*, flags)`.
    stream_create = c"cuStreamCreate": fn(*mut Handle, c_uint);
    /// `cuStreamDestroy(CUstream)`.
    stream_destroy = c"cuStreamDestroy_v2": fn(Handle);
    /// `cuStreamSynchronize(CUstream)`.
    stream_synchronize = c"cuStreamSynchronize": fn(Handle);
    /// `cuEventCreate(CUevent*, flags)`.
    event_create = c"cuEventCreate": fn(*mut Handle, c_uint);
    /// `cuEventDestroy(CUevent)`.
    event_destroy = c"cuEventDestroy_v2": fn(Handle);
    /// `cuEventRecord(CUevent, CUstream)`.
    event_record = c"cuEventRecord": fn(Handle, Handle);
    /// `cuEventQuery(CUevent)`: `CUDA_SUCCESS` when complete, `CUDA_ERROR_NOT_READY` if not.
    event_query = c"cuEventQuery": fn(Handle);
    /// `cuEventSynchronize(CUevent)`.
    event_synchronize = c"cuEventSynchronize": fn(Handle);
    /// `cuMemcpyHtoDAsync(dst, src, bytes, stream)`.
    memcpy_htod_async = c"cuMemcpyHtoDAsync_v2": fn(CuDevicePtr, *const c_void, usize, Handle);
    /// `cuMemcpyDtoHAsync(dst, src, bytes, stream)`.
    memcpy_dtoh_async = c"cuMemcpyDtoHAsync_v2": fn(*mut c_void, CuDevicePtr, usize, Handle);
    /// `cuMemcpyHtoD(dst, src, bytes)`: synchronous, legacy default stream.
    memcpy_htod = c"cuMemcpyHtoD_v2": fn(CuDevicePtr, *const c_void, usize);
    /// `cuMemcpyDtoH(dst, src, bytes)`: synchronous, legacy default stream.
    memcpy_dtoh = c"cuMemcpyDtoH_v2": fn(*mut c_void, CuDevicePtr, usize);
    /// `cuMemHostAlloc(void**, bytes, flags)`: pinned host memory.
    mem_host_alloc = c"cuMemHostAlloc": fn(*mut *mut c_void, usize, c_uint);
    /// `cuMemFreeHost(void*)`.
    mem_free_host = c"cuMemFreeHost": fn(*mut c_void);
    /// `cuMemHostRegister(void*, bytes, flags)`: pins host memory allocated elsewhere.
    mem_host_register = c"cuMemHostRegister_v2": fn(*mut c_void, usize, c_uint);
    /// `cuMemHostUnregister(void*)`.
    mem_host_unregister = c"cuMemHostUnregister": fn(*mut c_void);
    /// `cuMemAlloc(CUdeviceptr*, bytes)`.
    mem_alloc = c"cuMemAlloc_v2": fn(*mut CuDevicePtr, usize);
    /// `cuMemAllocManaged(CUdeviceptr*, bytes, flags)`.
    mem_alloc_managed = c"cuMemAllocManaged": fn(*mut CuDevicePtr, usize, c_uint);
    /// `cuMemFree(CUdeviceptr)`.
    mem_free = c"cuMemFree_v2": fn(CuDevicePtr);
    /// `cuStreamWaitEvent(CUstream, CUevent, flags)`: later work on the stream waits, on the
    /// device, for the event's latest record.
    stream_wait_event = c"cuStreamWaitEvent": fn(Handle, Handle, c_uint);
    /// `cuLaunchHostFunc(CUstream, void (*)(void*), void*)`: runs a host function in stream
    /// order, on a driver thread.
    launch_host_func = c"cuLaunchHostFunc": fn(Handle, HostFn, *mut c_void);
    /// `cuMemsetD32Async(dst, value, count, stream)`: `count` 32-bit words.
    memset_d32_async = c"cuMemsetD32Async": fn(CuDevicePtr, c_uint, usize, Handle);
    /// `cuMemAllocAsync(CUdeviceptr*, bytes, stream)`: the driver's stream-ordered pool.
    mem_alloc_async = c"cuMemAllocAsync": fn(*mut CuDevicePtr, usize, Handle);
    /// `cuMemFreeAsync(CUdeviceptr, stream)`.
    mem_free_async = c"cuMemFreeAsync": fn(CuDevicePtr, Handle);
    /// `cuDeviceGetDefaultMemPool(CUmemoryPool*, CUdevice)`.
    device_get_default_mem_pool = c"cuDeviceGetDefaultMemPool": fn(*mut Handle, CuDevice);
    /// `cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute, void*)`.
    mem_pool_set_attribute = c"cuMemPoolSetAttribute": fn(Handle, c_int, *mut c_void);
}

/// `CUhostFn`: a function the driver calls in stream order from one of its threads.
pub(crate) type HostFn = unsafe extern "C" fn(*mut c_void);

/// The loaded and initialised driver.
pub(crate) struct Driver {
    /// The function table.
    pub(crate) api: Api,
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor.
    pub(crate) version: c_int,
    /// Number of devices `cuDeviceGetCount` reported (at least 1).
    pub(crate) device_count: c_int,
    /// The process that initialised the driver. A child made by `fork` inherits this table but
    /// not a usable driver (CUDA does not survive `fork`), so it is refused there.
    pid: u32,
}

// SAFETY: `Api` holds plain function pointers into the driver library, which stays loaded for
// the life of the process (it is never `dlclose`d); the driver's entry points are thread-safe.
unsafe impl Send for Driver {}
// SAFETY: as above; the table is never written after it is built.
unsafe impl Sync for Driver {}

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// The driver, loaded and initialised on first call; the reason it is unusable otherwise.
///
/// The outcome is decided once per process: a driver that failed to load is not retried.
pub(crate) fn get() -> Result<&'static Driver> {
    let driver = DRIVER
        .get_or_init(load)
        .as_ref()
        .map_err(|reason| Error::CudaUnavailable {
            reason: reason.clone(),
        })?;
    if driver.pid != crate::sys::process_id() {
        return Err(Error::CudaUnavailable {
            reason: "CUDA was initialised in the parent of this forked process, and CUDA does \
                     not survive fork(): start workers with the 'spawn' or 'forkserver' method, \
                     or use the GPU only in the children"
                .into(),
        });
    }
    Ok(driver)
}

/// Whether this process has started CUDA already: the driver library is loaded (by anyone) and
/// a device's primary context (the one CUDA's runtime, PyTorch and CuPy use) is active. Asked
/// without loading or initialising the driver: where it is not loaded, or loaded and not
/// initialised (`cuDeviceGetCount` refuses), the answer is no.
pub fn primary_context_active() -> bool {
    type GetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
    type Get = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type GetState = unsafe extern "C" fn(c_int, *mut c_uint, *mut c_int) -> c_int;
    for name in LIBRARY_NAMES {
        // SAFETY: `name` is NUL-terminated; with `RTLD_NOLOAD` nothing is loaded or initialised:
        // a handle comes back only for a library loaded already, and is closed below.
        let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            continue;
        }
        let active = (|| {
            let count = symbol(lib, c"cuDeviceGetCount").ok()?;
            let get = symbol(lib, c"cuDeviceGet").ok()?;
            let state = symbol(lib, c"cuDevicePrimaryCtxGetState").ok()?;
            // SAFETY: the driver API's own signatures for these three symbols.
            let (count, get, state) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, GetCount>(count),
                    std::mem::transmute::<*mut c_void, Get>(get),
                    std::mem::transmute::<*mut c_void, GetState>(state),
                )
            };
            let mut n: c_int = 0;
            // SAFETY: a live out-pointer; an uninitialised driver answers an error, not a count.
            if unsafe { count(&mut n) } != CUDA_SUCCESS {
                return Some(false);
            }
            Some((0..n).any(|ordinal| {
                let (mut dev, mut flags, mut on): (c_int, c_uint, c_int) = (0, 0, 0);
                // SAFETY: live out-pointers; `ordinal` is below the count just given.
                let asked = unsafe {
                    get(&mut dev, ordinal) == CUDA_SUCCESS
                        && state(dev, &mut flags, &mut on) == CUDA_SUCCESS
                };
                asked && on != 0
            }))
        })();
        // SAFETY: `lib` is the handle dlopen returned above, closed once; that only drops the
        // reference it took.
        unsafe { libc::dlclose(lib) };
        return active.unwrap_or(false);
    }
    false
}

fn load() -> std::result::Result<Driver, String> {
    let mut failures = Vec::new();
    let mut lib = std::ptr::null_mut();
    for name in LIBRARY_NAMES {
        // SAFETY: `name` is NUL-terminated. Loading the NVIDIA driver library runs its
        // initialisers, which are made to be loaded this way (it is how the CUDA runtime loads
        // it). The handle is never closed: the library stays mapped until the process exits, so
        // the function pointers taken from it stay valid.
        lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !lib.is_null() {
            break;
        }
        failures.push(dl_error());
    }
    if lib.is_null() {
        return Err(format!(
            "the CUDA driver library could not be loaded ({})",
            failures.join("; ")
        ));
    }
    // SAFETY: `lib` is a live handle of the driver library just opened.
    let api = unsafe { Api::resolve(lib) }?;
    let driver = Driver {
        api,
        version: 0,
        device_count: 0,
        pid: crate::sys::process_id(),
    };
    // SAFETY: cuInit takes flags that must be 0 and may be called any number of times.
    let code = unsafe { (driver.api.init)(0) };
    if code != CUDA_SUCCESS {
        return Err(format!("cuInit failed: {}", driver.describe(code)));
    }
    let mut version = 0;
    // SAFETY: the out-pointer is a live local.
    let code = unsafe { (driver.api.driver_get_version)(&mut version) };
    if code != CUDA_SUCCESS {
        return Err(format!(
            "cuDriverGetVersion failed: {}",
            driver.describe(code)
        ));
    }
    if version < MIN_DRIVER_VERSION {
        return Err(format!(
            "the driver supports CUDA {}.{}; ferrio needs a driver for CUDA 12.0 or newer",
            version / 1000,
            version % 1000 / 10
        ));
    }
    let mut count = 0;
    // SAFETY: the out-pointer is a live local; cuInit succeeded.
    let code = unsafe { (driver.api.device_get_count)(&mut count) };
    if code != CUDA_SUCCESS {
        return Err(format!(
            "cuDeviceGetCount failed: {}",
            driver.describe(code)
        ));
    }
    if count < 1 {
        return Err("the driver found no CUDA device".to_string());
    }
    Ok(Driver {
        version,
        device_count: count,
        ..driver
    })
}

/// Looks `name` up in `lib`.
fn symbol(lib: *mut c_void, name: &CStr) -> std::result::Result<*mut c_void, String> {
    // SAFETY: `lib` is a live dlopen handle (callers' contract) and `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        Err(format!(
            "the CUDA driver library lacks {} ({}); a driver for CUDA 12.0 or newer is needed",
            name.to_string_lossy(),
            dl_error()
        ))
    } else {
        Ok(p)
    }
}

/// The text of the last `dlopen`/`dlsym` failure on this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string that stays valid until the next
    // dl* call on this thread; it is copied out at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-NULL results of dlerror point to a NUL-terminated string (see above).
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Driver {
    /// `NAME: description` of a result code, in the driver's words.
    pub(crate) fn describe(&self, code: CuResult) -> String {
        let text = |f: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult| {
            let mut s: *const c_char = std::ptr::null();
            // SAFETY: both functions accept any code and write a pointer to a static string, or
            // return CUDA_ERROR_INVALID_VALUE for codes they do not know.
            let rc = unsafe { f(code, &mut s) };
            if rc == CUDA_SUCCESS && !s.is_null() {
                // SAFETY: on success `s` points to a static NUL-terminated string.
                Some(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
            } else {
                None
            }
        };
        match (
            text(self.api.get_error_name),
            text(self.api.get_error_string),
        ) {
            (Some(name), Some(desc)) => format!("{name}: {desc}"),
            (Some(name), None) => name,
            (None, Some(desc)) => desc,
            (None, None) => "unknown CUDA error".to_string(),
        }
    }

    /// `Ok` for `CUDA_SUCCESS`, otherwise an [`Error::Cuda`] naming `call`.
    pub(crate) fn check(&self, call: &'static str, code: CuResult) -> Result<()> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(Error::Cuda {
                call,
                code,
                message: self.describe(code),
            })
        }
    }
}
