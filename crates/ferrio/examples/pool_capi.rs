//! A C ABI over ferrio's device-memory pool, built as a shared library
//! (`cargo build --release --example pool_capi` → `target/release/examples/libpool_capi.so`),
//! so that `benchmarks/memory_pool/pool_bench.cpp` drives ferrio's pool, RMM's pool and
//! `cudaMallocAsync` from the same C++ loop.
//!
//! Streams are the caller's (`cudaStream_t` / `CUstream`), registered once each; every block
//! is allocated and freed on a registered stream. The pool lives in device `device`'s primary
//! context, the one the CUDA runtime uses. Errors are printed to stderr and returned as null
//! pointers or -1.

use std::ffi::{c_int, c_void};

use ferrio::memory::{CudaStreams, DeviceUpstream, PoolOptions, PoolResource, StreamHandle};

/// A device-memory pool behind the C ABI.
pub struct FerrioPool {
    pool: PoolResource<DeviceUpstream, CudaStreams>,
}

fn report(what: &str, e: &ferrio::Error) {
    eprintln!("ferrio pool: {what}: {e}");
}

/// A pool of device memory on device `device`: `initial_bytes` taken at once (0: none), then
/// chunks of at least `grow_bytes`. Null on error.
#[no_mangle]
pub extern "C" fn ferrio_pool_create(
    device: c_int,
    initial_bytes: usize,
    grow_bytes: usize,
) -> *mut FerrioPool {
    let made = usize::try_from(device)
        .map_err(|_| ferrio::Error::InvalidArgument(format!("device {device}")))
        .and_then(CudaStreams::for_device)
        .and_then(|streams| {
            let up = DeviceUpstream::new(streams.context())?;
            let options = PoolOptions::default()
                .initial_bytes(initial_bytes)
                .grow_bytes(grow_bytes.max(1));
            PoolResource::new(up, streams, options)
        });
    match made {
        Ok(pool) => Box::into_raw(Box::new(FerrioPool { pool })),
        Err(e) => {
            report("create", &e);
            std::ptr::null_mut()
        }
    }
}

/// Destroys a pool and returns its memory to the device.
///
/// # Safety
/// `pool` must come from [`ferrio_pool_create`] and not be used afterwards; every stream
/// registered with it must be unregistered first, and no device work may still use its memory.
#[no_mangle]
pub unsafe extern "C" fn ferrio_pool_destroy(pool: *mut FerrioPool) {
    if !pool.is_null() {
        // SAFETY: the caller's contract: a live pool from `ferrio_pool_create`, given up.
        drop(unsafe { Box::from_raw(pool) });
    }
}

/// Registers the caller's stream (null: the legacy default stream) with a fresh id.
///
/// # Safety
/// `pool` must be live; `stream` must be a stream of the pool's context that outlives the
/// registration ([`ferrio_stream_unregister`]).
#[no_mangle]
pub unsafe extern "C" fn ferrio_stream_register(
    pool: *const FerrioPool,
    stream: *mut c_void,
) -> *mut StreamHandle {
    // SAFETY: the caller's contract: a live pool.
    let Some(p) = (unsafe { pool.as_ref() }) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's contract: the stream outlives the handle, which is dropped in
    // `ferrio_stream_unregister` after the pool has detached it.
    let handle = unsafe { p.pool.order().register_stream(stream) };
    Box::into_raw(Box::new(handle))
}

/// Detaches a registered stream from the pool and frees the registration.
///
/// # Safety
/// `pool` must be live and `handle` come from [`ferrio_stream_register`] on it, unused after.
#[no_mangle]
pub unsafe extern "C" fn ferrio_stream_unregister(
    pool: *const FerrioPool,
    handle: *mut StreamHandle,
) {
    // SAFETY: the caller's contract.
    let (Some(p), false) = (unsafe { pool.as_ref() }, handle.is_null()) else {
        return;
    };
    // SAFETY: the caller's contract: a handle from `ferrio_stream_register`, given up.
    let handle = unsafe { Box::from_raw(handle) };
    if let Err(e) = p.pool.detach_stream(&handle) {
        report("detach", &e);
    }
}

/// `bytes` of device memory usable on the registered stream `handle`; null on error.
///
/// # Safety
/// `pool` and `handle` must be live and belong together.
#[no_mangle]
pub unsafe extern "C" fn ferrio_allocate(
    pool: *const FerrioPool,
    bytes: usize,
    handle: *const StreamHandle,
) -> *mut c_void {
    // SAFETY: the caller's contract.
    let (Some(p), Some(h)) = (unsafe { pool.as_ref() }, unsafe { handle.as_ref() }) else {
        return std::ptr::null_mut();
    };
    match p.pool.allocate(bytes, h) {
        Ok(b) => b.addr() as *mut c_void,
        Err(e) => {
            report("allocate", &e);
            std::ptr::null_mut()
        }
    }
}

/// Returns a block on the registered stream `handle`, after all work using it was enqueued
/// there. 0 on success, -1 on error.
///
/// # Safety
/// `pool` and `handle` must be live and belong together; `ptr` and `bytes` must be a block of
/// this pool, freed once.
#[no_mangle]
pub unsafe extern "C" fn ferrio_deallocate(
    pool: *const FerrioPool,
    ptr: *mut c_void,
    bytes: usize,
    handle: *const StreamHandle,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(p), Some(h)) = (unsafe { pool.as_ref() }, unsafe { handle.as_ref() }) else {
        return -1;
    };
    match p.pool.deallocate(ptr as usize, bytes, h) {
        Ok(()) => 0,
        Err(e) => {
            report("deallocate", &e);
            -1
        }
    }
}
