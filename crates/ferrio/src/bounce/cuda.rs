//! [`CudaEngine`]: the bounce ring's [`CopyEngine`] over the real driver.
//!
//! A thin adapter: every operation is one call of [`crate::cuda`]'s driver wrappers, in the
//! engine's context; streams and events are [`crate::cuda`]'s owned [`Stream`] and [`Event`].
//! This file has no FFI of its own and knows nothing of the ring's logic.
//!
//! Pinned memory comes from `cuMemHostAlloc`, except on a machine with several NUMA nodes
//! where the GPU's node is known ([`topology::context_node`]): there it is mapped on that node
//! (`sys::numa`), faulted in, and pinned with `cuMemHostRegister`, so the bytes cross no
//! inter-socket link on their way to the GPU. Which kind each allocation is, is remembered, so
//! that it is freed the way it was made.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock};

use super::CopyEngine;
use crate::cuda::{self, calls, Context, ContextGuard, DevicePtr, Event, Stream};
use crate::error::{Error, Result};
use crate::{sys, topology};

/// Pinned allocations placed on a NUMA node (mapped and registered, not `cuMemHostAlloc`ed):
/// start address → length mapped.
fn placed() -> &'static Mutex<HashMap<usize, usize>> {
    static PLACED: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    PLACED.get_or_init(Mutex::default)
}

/// The real driver as a [`CopyEngine`]: every resource belongs to one context, which
/// [`CopyEngine::bind`] makes current for the duration of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaEngine {
    context: Context,
}

impl CudaEngine {
    /// An engine for `context` (from [`cuda::classify`] or [`Context::primary`]).
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) without a driver.
    pub fn new(context: Context) -> Result<CudaEngine> {
        cuda::available()?;
        Ok(CudaEngine { context })
    }

    /// The context this engine works in.
    pub fn context(&self) -> Context {
        self.context
    }

    /// Pinned memory of `len` bytes placed on NUMA node `node`: mapped there, faulted in, then
    /// registered with the driver. [`CopyEngine::free_pinned`] frees it.
    ///
    /// Used by `alloc_pinned` on machines with several nodes; tests call it to run this path
    /// on a machine with one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the node cannot be used; the driver's error when it
    /// cannot pin the memory (nothing stays mapped then).
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub(crate) fn alloc_pinned_on(&self, len: usize, node: u32) -> Result<NonNull<u8>> {
        let p = sys::numa::map_on_node(len, node).map_err(|e| {
            let what = format!("pinned memory of {len} bytes: {e}");
            if e.kind() == std::io::ErrorKind::OutOfMemory {
                Error::OutOfMemory(what)
            } else {
                Error::InvalidArgument(what)
            }
        })?;
        // SAFETY: `p..p+len` was just mapped; it stays mapped until `free_pinned` unregisters
        // it first.
        if let Err(e) = unsafe { calls::mem_host_register(self.context, p.cast(), len) } {
            // SAFETY: mapped above with this length, never handed out.
            let _ = unsafe { sys::numa::unmap(p, len) };
            return Err(e);
        }
        placed()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p.as_ptr() as usize, len);
        Ok(p)
    }

    #[cfg(any(test, feature = "testing"))]
    /// [`alloc_pinned_on`](Self::alloc_pinned_on) for the integration tests: pinned memory
    /// placed on `node` even on a machine with one node.
    ///
    /// # Errors
    /// As for `alloc_pinned_on`.
    pub fn alloc_pinned_on_node(&self, len: usize, node: u32) -> Result<NonNull<u8>> {
        self.alloc_pinned_on(len, node)
    }
}

impl CopyEngine for CudaEngine {
    type Stream = Stream;
    type Event = Event;
    type Binding = ContextGuard;

    fn bind(&self) -> Result<ContextGuard> {
        self.context.push()
    }

    fn alloc_pinned(&self, len: usize) -> Result<NonNull<u8>> {
        if let Some(node) = topology::context_node(self.context) {
            // Placement is an optimisation: memory from elsewhere is slower, not wrong.
            if let Ok(p) = self.alloc_pinned_on(len, node) {
                return Ok(p);
            }
        }
        calls::mem_host_alloc(self.context, len).map(NonNull::cast)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, _len: usize) -> Result<()> {
        let placed = placed()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr.as_ptr() as usize));
        match placed {
            Some(mapped) => {
                // SAFETY: the caller passes a pointer from `alloc_pinned` that no copy uses any
                // more, freed once; it was registered by `alloc_pinned_on`.
                unsafe { calls::mem_host_unregister(self.context, ptr.cast()) }?;
                // SAFETY: mapped by `alloc_pinned_on` with `mapped` bytes, unregistered just
                // now, and removed from the table, so unmapped once.
                unsafe { sys::numa::unmap(ptr, mapped) }
                    .map_err(|e| Error::InvalidArgument(format!("unmapping pinned memory: {e}")))
            }
            None => {
                // SAFETY: the caller passes a pointer from `alloc_pinned` (`cuMemHostAlloc`)
                // that no copy uses any more, freed once.
                unsafe { calls::mem_free_host(self.context, ptr.cast()) }
            }
        }
    }

    fn create_stream(&self) -> Result<Stream> {
        Stream::new(self.context)
    }

    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        stream.destroy()
    }

    fn create_event(&self) -> Result<Event> {
        Event::new(self.context)
    }

    fn destroy_event(&self, event: Event) -> Result<()> {
        event.destroy()
    }

    fn record(&self, event: &Event, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live (owned by the caller) and belong to this context.
        unsafe { calls::event_record(self.context, event.as_raw(), stream.as_raw()) }
    }

    fn is_complete(&self, event: &Event) -> Result<bool> {
        // SAFETY: the event handle is live (owned by the caller) and belongs to this context.
        unsafe { calls::event_query(self.context, event.as_raw()) }
    }

    fn wait_event(&self, event: &Event) -> Result<()> {
        // SAFETY: the event handle is live (owned by the caller) and belongs to this context.
        unsafe { calls::event_synchronize(self.context, event.as_raw()) }
    }

    fn wait_stream(&self, stream: &Stream) -> Result<()> {
        // SAFETY: the stream handle is live (owned by the caller) and belongs to this context.
        unsafe { calls::stream_synchronize(self.context, stream.as_raw()) }
    }

    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller guarantees `src..src+len` is pinned memory from `alloc_pinned`
        // left untouched until the copy completes, and `dst..dst+len` is device memory; the
        // stream is live (owned by the caller) and belongs to this context.
        unsafe { calls::memcpy_htod_async(self.context, dst.0, src.cast(), len, stream.as_raw()) }
    }

    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller guarantees `dst..dst+len` is pinned memory from `alloc_pinned`
        // that nothing reads or writes until the copy completes, and `src..src+len` is device
        // memory; the stream is live (owned by the caller) and belongs to this context.
        unsafe { calls::memcpy_dtoh_async(self.context, dst.cast(), src.0, len, stream.as_raw()) }
    }
}
