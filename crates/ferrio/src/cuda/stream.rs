//! Owned streams and events: [`Stream`] and [`Event`] destroy their driver handle when dropped
//! (or explicitly, with the error reported, through `destroy`). Also [`hold_stream`], which
//! holds a stream's progress on a host-side latch, for tests of stream ordering.
//!
//! Neither may be dropped at process exit (from a static or thread-local destructor): their
//! drop calls the driver, which may already be gone. Owners that live that long leak them on
//! purpose (see the bounce ring's thread-local ring set and the memory pool). The driver calls
//! go through `calls.rs`.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::calls::{self, RawStream};
use super::driver::HostFn;
use super::Context;
use crate::error::Result;

/// A CUDA stream created by ferrio (non-blocking: it never waits for the legacy default
/// stream), destroyed on drop; work still queued on it completes first.
#[derive(Debug)]
pub struct Stream {
    raw: NonNull<c_void>,
    context: Context,
}

/// A CUDA event created by ferrio (with timing disabled, the cheap kind), destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: NonNull<c_void>,
    context: Context,
}

// SAFETY: stream and event handles are opaque driver handles that the driver accepts from any
// thread; neither type has interior state of its own.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}
// SAFETY: as above.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Stream {
    /// A new non-blocking stream in `context` (`cuStreamCreate`).
    pub(crate) fn new(context: Context) -> Result<Stream> {
        Ok(Stream {
            raw: calls::stream_create(context)?,
            context,
        })
    }

    /// The raw `CUstream`, to enqueue work on.
    pub(crate) fn as_raw(&self) -> RawStream {
        self.raw.as_ptr()
    }

    /// Destroys the stream now, reporting the driver's error (drop ignores it).
    pub(crate) fn destroy(self) -> Result<()> {
        let this = ManuallyDrop::new(self);
        // SAFETY: the stream came from `stream_create` in this context; `this` is never dropped,
        // so it is destroyed once, here, and the consumed value cannot be used afterwards.
        unsafe { calls::stream_destroy(this.context, this.raw) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream came from `stream_create` in this context, and this is its owner
        // going away: nothing can use it afterwards. An error cannot be reported from drop;
        // queued work still completes.
        let _ = unsafe { calls::stream_destroy(self.context, self.raw) };
    }
}

impl Event {
    /// A new event in `context` (`cuEventCreate`, timing disabled).
    pub(crate) fn new(context: Context) -> Result<Event> {
        Ok(Event {
            raw: calls::event_create(context)?,
            context,
        })
    }

    /// The raw `CUevent`.
    pub(crate) fn as_raw(&self) -> NonNull<c_void> {
        self.raw
    }

    /// The context the event belongs to.
    pub(crate) fn context(&self) -> Context {
        self.context
    }

    /// Destroys the event now, reporting the driver's error (drop ignores it).
    pub(crate) fn destroy(self) -> Result<()> {
        let this = ManuallyDrop::new(self);
        // SAFETY: the event came from `event_create` in this context; `this` is never dropped,
        // so it is destroyed once, here, and the consumed value cannot be used afterwards.
        unsafe { calls::event_destroy(this.context, this.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event came from `event_create` in this context and is dropped once. An
        // error cannot be reported from drop.
        let _ = unsafe { calls::event_destroy(self.context, self.raw) };
    }
}

/// A latch that streams can be held on until it opens (see [`hold_stream`]).
#[derive(Debug, Default)]
pub(crate) struct Latch {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Latch {
    /// Opens the latch, releasing every stream held on it.
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.opened.notify_all();
    }

    /// Waits until the latch opens or `limit` has passed.
    fn wait(&self, limit: Duration) {
        let guard = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .opened
            .wait_timeout_while(guard, limit, |open| !*open)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// What the host function of [`hold_stream`] receives.
struct Hold {
    latch: Arc<Latch>,
    limit: Duration,
}

/// The host function of [`hold_stream`]: blocks the stream's progress until the latch opens.
///
/// # Safety
/// `data` must be a `Box<Hold>` turned into a raw pointer, given to this function once.
unsafe extern "C" fn hold_until_open(data: *mut c_void) {
    // SAFETY: `data` is the `Box<Hold>` leaked by `hold_stream` for this one call; the driver
    // calls a host function exactly once.
    let hold = unsafe { Box::from_raw(data.cast::<Hold>()) };
    hold.latch.wait(hold.limit);
}

/// Enqueues on `stream` a host function that holds every later operation of the stream until
/// `latch` opens (or `limit` passes, so a forgotten latch cannot hang the process).
///
/// # Safety
/// `stream` must be a live stream of `ctx` (or null).
pub(crate) unsafe fn hold_stream(
    ctx: Context,
    stream: RawStream,
    latch: Arc<Latch>,
    limit: Duration,
) -> Result<()> {
    let data = Box::into_raw(Box::new(Hold { latch, limit }));
    let hold: HostFn = hold_until_open;
    // SAFETY: `hold_until_open` takes back the box exactly once, calls no CUDA function and
    // returns within `limit`; the stream is live (the caller's contract).
    let launched = unsafe { calls::launch_host_func(ctx, stream, hold, data.cast()) };
    if launched.is_err() {
        // SAFETY: the launch failed, so the driver will never call the function: the box is
        // still ours, and freed once, here.
        drop(unsafe { Box::from_raw(data) });
    }
    launched
}
