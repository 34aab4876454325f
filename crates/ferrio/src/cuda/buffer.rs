//! [`DeviceBuffer`]: device memory owned by a value, for tests, smoke tests and benchmarks (the
//! I/O engine never allocates device memory).
//!
//! Its drop frees through the driver, so it must never live in a static or thread-local, whose
//! destructors run at process exit. The driver calls go through `calls.rs`.

use super::{calls, Context, DevicePtr};
use crate::error::{Error, Result};

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
        let context = Context::primary(ordinal)?;
        let bytes = len.max(1);
        let raw = if managed {
            calls::mem_alloc_managed(context, bytes)?
        } else {
            calls::mem_alloc(context, bytes)?
        };
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
        // SAFETY: the destination range lies within this live allocation (checked above) and
        // `src` is a live slice of `src.len()` bytes; the call returns when the copy is done.
        unsafe {
            calls::memcpy_htod(
                self.context,
                self.ptr.0 + offset as u64,
                src.as_ptr().cast(),
                src.len(),
            )
        }
    }

    /// Copies `dst.len()` bytes from `offset` in this buffer into `dst` (`cuMemcpyDtoH`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range does not fit, [`Error::Cuda`] if the copy fails.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        // SAFETY: the source range lies within this live allocation (checked above) and `dst`
        // is a live, exclusively borrowed slice; the call returns when the copy is done.
        unsafe {
            calls::memcpy_dtoh(
                self.context,
                dst.as_mut_ptr().cast(),
                self.ptr.0 + offset as u64,
                dst.len(),
            )
        }
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
        // SAFETY: the pointer came from cuMemAlloc/cuMemAllocManaged in this context and is
        // freed once. cuMemFree waits for work using it. An error cannot be reported from drop.
        let _ = unsafe { calls::mem_free(self.context, self.ptr.0) };
    }
}
