//! [`Context`], a CUDA context handle, and [`ContextGuard`], which keeps one current on the
//! calling thread for the duration of an operation.
//!
//! Contexts found by ferrio are never released: primary contexts are retained once per device
//! and kept for the life of the process, so that no ring or pointer outlives its context and no
//! release runs at process exit. The driver calls go through `calls.rs`.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::OnceLock;

use super::{calls, driver};
use crate::error::{Error, Result};

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
    /// A context from a handle the driver returned.
    pub(crate) fn from_raw(raw: NonNull<c_void>) -> Context {
        Context(raw)
    }

    /// The raw `CUcontext`.
    pub(crate) fn as_raw(self) -> *mut c_void {
        self.0.as_ptr()
    }

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
        let ordinal_c = std::ffi::c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("CUDA device {ordinal} out of range")))?;
        let dev = calls::device_get(ordinal_c)?;
        // The retain is never released (see `calls::primary_ctx_retain`).
        let raw = calls::primary_ctx_retain(dev)?;
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
        let current = calls::ctx_get_current()?;
        if current == self.0.as_ptr() {
            return Ok(ContextGuard {
                pushed: false,
                _not_send: std::marker::PhantomData,
            });
        }
        calls::ctx_push_current(self)?;
        Ok(ContextGuard {
            pushed: true,
            _not_send: std::marker::PhantomData,
        })
    }

    /// The ordinal of this context's device.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver refuses.
    pub fn device_ordinal(self) -> Result<usize> {
        let dev = calls::ctx_get_device(self)?;
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
    pushed: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.pushed {
            // This guard pushed a context on this thread (it is !Send) and pops it once. A
            // failure cannot be reported from drop; it would mean the caller unbalanced the
            // stack in between, and the pop is best effort.
            let _ = calls::ctx_pop_current();
        }
    }
}
