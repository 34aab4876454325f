//! [`CudaEngine`]: the bounce ring's [`CopyEngine`] over the real driver.
//!
//! A thin adapter: every operation is one call of [`crate::cuda`]'s driver wrappers, in the
//! engine's context; streams and events are [`crate::cuda`]'s owned [`Stream`] and [`Event`].
//! This file has no FFI of its own and knows nothing of the ring's logic.

use std::ptr::NonNull;

use super::CopyEngine;
use crate::cuda::{self, calls, Context, ContextGuard, DevicePtr, Event, Stream};
use crate::error::Result;

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
}

impl CopyEngine for CudaEngine {
    type Stream = Stream;
    type Event = Event;
    type Binding = ContextGuard;

    fn bind(&self) -> Result<ContextGuard> {
        self.context.push()
    }

    fn alloc_pinned(&self, len: usize) -> Result<NonNull<u8>> {
        calls::mem_host_alloc(self.context, len).map(NonNull::cast)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, _len: usize) -> Result<()> {
        // SAFETY: the caller passes a pointer from `alloc_pinned` (`cuMemHostAlloc`) that no
        // copy uses any more, freed once.
        unsafe { calls::mem_free_host(self.context, ptr.cast()) }
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
