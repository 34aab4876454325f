//! Addresses: [`DevicePtr`], and [`classify`] / [`try_classify`], which ask the driver whether
//! an address is host or device memory ([`Memory`]).
//!
//! Without a driver every address is host memory. The driver call goes through `calls.rs`.

use std::ptr::NonNull;

use super::{calls, driver, Context};
use crate::error::{Error, Result};

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

/// The context of device memory at `ptr`, for a transfer between it and a file or an object:
/// [`Error::CudaUnavailable`] without a driver, and [`Error::InvalidArgument`] naming the
/// address when it is not device memory (`host_calls` says what to use for host memory instead).
pub(crate) fn device_context(ptr: DevicePtr, host_calls: &str) -> Result<Context> {
    super::available()?;
    match try_classify(ptr.0 as usize)? {
        Memory::Device { context, .. } => Ok(context),
        Memory::Host => Err(Error::InvalidArgument(format!(
            "address {:#x} is not GPU memory ({host_calls})",
            ptr.0
        ))),
    }
}

/// Where `addr` points: [`Memory::Host`] unless the driver knows it as device or managed memory.
///
/// Loads the driver on first use (see [`available`](super::available)), so call it only for
/// addresses that may be device memory (raw addresses from Python, say), not for Rust slices. A
/// driver error while asking counts as host memory: the address is then read and written by the
/// CPU, and an address the CPU cannot reach fails there with `EFAULT` instead of being copied
/// wrongly. Use [`try_classify`] to see such errors.
pub fn classify(addr: usize) -> Memory {
    try_classify(addr).unwrap_or(Memory::Host)
}

/// Like [`classify`], but a failure to ask the driver is an error.
///
/// # Errors
/// [`Error::Cuda`] if `cuPointerGetAttributes` fails or the device's primary context cannot be
/// retained. Without a driver the answer is `Ok(Memory::Host)`.
pub fn try_classify(addr: usize) -> Result<Memory> {
    if driver::get().is_err() {
        return Ok(Memory::Host);
    }
    let attrs = calls::pointer_get_attributes(addr)?;
    let is_device = attrs.managed
        || match attrs.memory_type {
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
    let ordinal = attrs.device_ordinal;
    let device_ordinal = usize::try_from(ordinal).map_err(|_| Error::Cuda {
        call: "cuPointerGetAttributes",
        code: 0,
        message: format!("device memory at {addr:#x} has no device ordinal ({ordinal})"),
    })?;
    let context = match NonNull::new(attrs.context) {
        Some(c) => Context::from_raw(c),
        None => Context::primary(device_ordinal)?,
    };
    Ok(Memory::Device {
        context,
        device_ordinal,
    })
}
