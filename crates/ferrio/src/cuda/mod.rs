//! The CUDA driver, loaded at run time, as one thin layer: availability, contexts, pointer
//! classification, owned streams, events and device memory, and one safe wrapper per driver
//! call.
//!
//! The crate builds without a CUDA toolkit and runs without a driver: `libcuda.so.1` is opened
//! on first use (see [`available`]), and when it cannot be, every function here that needs it
//! returns [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) with the reason, while
//! [`classify`] calls everything host memory. It owns no threads and keeps no per-thread state.
//!
//! This module depends only on [`crate::error`]: the memory pool (`crate::memory`) and the
//! bounce ring's engine (`bounce::CudaEngine`) build on it, never the other way round.
//! The files:
//!
//! - `driver.rs`: loading `libcuda`, the table of function pointers, result codes to errors;
//! - `calls.rs`: one safe, typed wrapper per driver call, and the rule every caller gets (a
//!   destroy or free into a deinitialised driver succeeds);
//! - `context.rs`: [`Context`] and [`ContextGuard`];
//! - `pointer.rs`: [`DevicePtr`], [`Memory`], [`classify`] and [`try_classify`];
//! - `stream.rs`: [`Stream`] and [`Event`], owned handles destroyed on drop;
//! - `buffer.rs`: [`DeviceBuffer`], owned device memory for tests and benchmarks.
//!
//! Several GPUs in one process work: the context of an operation comes from the pointer
//! ([`classify`]), and a [`ContextGuard`] makes it current on the calling thread for the
//! duration of the operation only.

mod buffer;
pub(crate) mod calls;
mod context;
mod driver;
mod pointer;
mod stream;

pub use buffer::DeviceBuffer;
pub use context::{Context, ContextGuard};
pub use driver::primary_context_active;
pub(crate) use driver::CUDA_ERROR_OUT_OF_MEMORY;
pub(crate) use pointer::device_context;
pub use pointer::{classify, try_classify, DevicePtr, Memory};
pub(crate) use stream::{hold_stream, Latch};
pub use stream::{Event, Stream};

use crate::error::Result;

/// Loads and initialises the driver on first call; `Ok` if CUDA can be used in this process.
///
/// Loading means `dlopen("libcuda.so.1")`, looking up the driver functions ferrio needs, and
/// `cuInit`; the first call is slow (the driver sets up every device) and later ones cost
/// nothing. The outcome is decided once per process.
///
/// # Errors
/// [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) saying why: no driver library, a
/// driver older than CUDA 12.0, `cuInit` failing (no device, a stub library, ...).
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
/// [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) as for [`available`].
pub fn driver_info() -> Result<DriverInfo> {
    let d = driver::get()?;
    Ok(DriverInfo {
        version: d.version,
        device_count: usize::try_from(d.device_count).unwrap_or(0),
    })
}

/// What the driver says about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// The device's ordinal (as `CUDA_VISIBLE_DEVICES` leaves them).
    pub ordinal: usize,
    /// The product name (`NVIDIA H200`, say).
    pub name: String,
    /// The PCI address, `domain:bus:device.function` in lower case as sysfs spells it
    /// (`0000:0a:00.0`: `/sys/bus/pci/devices/0000:0a:00.0`).
    pub pci_address: String,
    /// The device's memory in bytes.
    pub total_memory: u64,
}

/// The name, PCI address and memory of device `ordinal`, loading the driver if needed.
///
/// # Errors
/// [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) as for [`available`];
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an ordinal past the device
/// count; [`Error::Cuda`](crate::Error::Cuda) if the driver refuses a query.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    let count = driver::get()?.device_count;
    let index = std::ffi::c_int::try_from(ordinal)
        .ok()
        .filter(|&i| i < count)
        .ok_or_else(|| {
            crate::Error::InvalidArgument(format!(
                "there is no GPU {ordinal}: the driver sees {count} (numbered from 0)"
            ))
        })?;
    let dev = calls::device_get(index)?;
    Ok(DeviceInfo {
        ordinal,
        name: calls::device_get_name(dev)?,
        pci_address: calls::device_get_pci_bus_id(dev)?.to_ascii_lowercase(),
        total_memory: calls::device_total_mem(dev)? as u64,
    })
}

/// Blocks until everything queued so far on `stream` has finished. `stream` is a raw `CUstream`
/// handle owned by another library (CuPy, PyTorch), or `1` / `2` for the legacy / per-thread
/// default stream, as `__cuda_array_interface__` and DLPack name them.
///
/// # Errors
/// [`Error::Cuda`](crate::Error::Cuda) if the driver reports a failure of the stream's work.
///
/// # Safety
/// `stream` must be a live stream of `context`, or 1 or 2.
pub unsafe fn synchronize_stream(context: Context, stream: usize) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { calls::stream_synchronize(context, stream as calls::RawStream) }
}
