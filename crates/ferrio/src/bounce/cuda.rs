//! [`CudaEngine`]: the bounce ring's [`CopyEngine`] over the real driver.
//!
//! A thin adapter: every operation is one call of [`crate::cuda`]'s driver wrappers, in the
//! engine's context; streams and events are [`crate::cuda`]'s owned [`Stream`] and [`Event`].
//! This file has no FFI of its own and knows nothing of the ring's logic.
//!
//! Pinned memory is made as [`topology::pinning`] decides from the engine's [`PinnedMemory`].
//! Mapped memory is mapped here (`sys::numa`), in huge pages and on the GPU's NUMA node where
//! that was decided, faulted in, and pinned with `cuMemHostRegister`: the driver pins a huge
//! page as one, and the bytes cross no inter-socket link on their way to the GPU. The rest, and
//! everything once the driver has refused to register, comes from `cuMemHostAlloc`.
//! Which kind each allocation is, is remembered, so that it is freed the way it was made.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::{ahead, CopyEngine};
use crate::config::{PinnedMemory, Settings};
use crate::cuda::{self, calls, Context, ContextGuard, DevicePtr, Event, Stream};
use crate::error::{Error, Result};
use crate::topology::Pinning;
use crate::{sys, topology};

/// Pinned allocations mapped here and registered (not `cuMemHostAlloc`ed): start address →
/// length mapped.
fn mapped() -> &'static Mutex<HashMap<usize, usize>> {
    static MAPPED: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    MAPPED.get_or_init(Mutex::default)
}

/// Streams and events made for a context's rings before they asked, in one pass for all.
#[derive(Debug, Default)]
struct Spare {
    streams: Vec<Stream>,
    events: Vec<Event>,
}

/// Context id → what was made ahead for its rings and not yet handed out. Never dropped (a
/// stream may not be destroyed at exit).
fn spare() -> &'static Mutex<HashMap<u64, Spare>> {
    static SPARE: OnceLock<Mutex<HashMap<u64, Spare>>> = OnceLock::new();
    SPARE.get_or_init(Mutex::default)
}

/// Set once the driver refused to register memory: later allocations go to `cuMemHostAlloc`
/// straight away rather than mapping and faulting in memory that cannot be pinned.
static REGISTER_REFUSED: AtomicBool = AtomicBool::new(false);

/// The real driver as a [`CopyEngine`]: every resource belongs to one context, which
/// [`CopyEngine::bind`] makes current for the duration of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaEngine {
    context: Context,
    pinned: PinnedMemory,
}

impl CudaEngine {
    /// An engine for `context` (from [`cuda::classify`] or [`Context::primary`]) that pins
    /// memory the default way ([`PinnedMemory::Mapped`]).
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) without a driver.
    pub fn new(context: Context) -> Result<CudaEngine> {
        cuda::available()?;
        Ok(CudaEngine {
            context,
            pinned: PinnedMemory::Mapped,
        })
    }

    /// This engine, pinning memory as `pinned` says.
    pub fn pinning(self, pinned: PinnedMemory) -> CudaEngine {
        CudaEngine { pinned, ..self }
    }

    /// The context this engine works in.
    pub fn context(&self) -> Context {
        self.context
    }

    /// Pinned memory of `len` bytes mapped here (placed on NUMA node `node` if given, in huge
    /// pages if `huge`), faulted in, then registered with the driver. [`CopyEngine::free_pinned`]
    /// frees it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the node cannot be used, [`Error::OutOfMemory`] when
    /// nothing can be mapped; the driver's error when it cannot pin the memory (nothing stays
    /// mapped then).
    pub(crate) fn alloc_mapped(
        &self,
        len: usize,
        node: Option<u32>,
        huge: bool,
    ) -> Result<NonNull<u8>> {
        // Memory made ahead where it is what would be mapped here (huge pages, no node).
        if huge && node.is_none() {
            let register = |slab: NonNull<u8>, slab_len: usize| {
                // SAFETY: the slab is mapped for the rest of the process and registered once.
                unsafe { calls::mem_host_register(self.context, slab.cast(), slab_len) }
            };
            if let Some(p) = ahead::take(len, register) {
                return Ok(p);
            }
        }
        let (p, mapped_len) = sys::numa::map_anonymous(len, node, huge).map_err(|e| {
            let what = format!("pinned memory of {len} bytes: {e}");
            if e.kind() == std::io::ErrorKind::OutOfMemory {
                Error::OutOfMemory(what)
            } else {
                Error::InvalidArgument(what)
            }
        })?;
        // SAFETY: `p..p+mapped_len` was just mapped; it stays mapped until `free_pinned`
        // unregisters it first.
        if let Err(e) = unsafe { calls::mem_host_register(self.context, p.cast(), mapped_len) } {
            // SAFETY: mapped above with this length, never handed out.
            let _ = unsafe { sys::numa::unmap(p, mapped_len) };
            return Err(e);
        }
        mapped()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p.as_ptr() as usize, mapped_len);
        Ok(p)
    }

    #[cfg(any(test, feature = "testing"))]
    /// [`alloc_mapped`](Self::alloc_mapped) for the integration tests: pinned memory placed on
    /// `node` (even on a machine with one node), in huge pages if `huge`.
    ///
    /// # Errors
    /// As for `alloc_mapped`.
    pub fn alloc_pinned_on_node(&self, len: usize, node: u32, huge: bool) -> Result<NonNull<u8>> {
        self.alloc_mapped(len, Some(node), huge)
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
        if REGISTER_REFUSED.load(Ordering::Relaxed) {
            return calls::mem_host_alloc(self.context, len).map(NonNull::cast);
        }
        let node = topology::context_node(self.context);
        if let Pinning::Mapped { huge, node } = topology::pinning(self.pinned, len, node) {
            match self.alloc_mapped(len, node, huge) {
                Ok(p) => return Ok(p),
                // Placement is an optimisation: memory from elsewhere is slower, not wrong.
                Err(Error::InvalidArgument(_)) if node.is_some() => {
                    if let Ok(p) = self.alloc_mapped(len, None, huge) {
                        return Ok(p);
                    }
                }
                // Short of memory now, perhaps not later.
                Err(Error::OutOfMemory(_)) => {}
                Err(Error::Cuda { code, .. }) if code == cuda::CUDA_ERROR_OUT_OF_MEMORY => {}
                // The driver would not register it: it will not later either.
                Err(_) => REGISTER_REFUSED.store(true, Ordering::Relaxed),
            }
        }
        calls::mem_host_alloc(self.context, len).map(NonNull::cast)
    }

    /// Memory ferrio mapped itself is: the kernel hands out anonymous pages zero-filled, and
    /// mapping faulted every page in; so is a buffer of the slab made ahead that no ring has
    /// given back. The driver's own (`cuMemHostAlloc`) is not known to be.
    fn pinned_is_zeroed(&self, ptr: NonNull<u8>) -> bool {
        ahead::still_zero(ptr)
            || mapped()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&(ptr.as_ptr() as usize))
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, _len: usize) -> Result<()> {
        if ahead::give_back(ptr) {
            return Ok(()); // back to the slab made ahead, still pinned
        }
        let mapped_len = mapped()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr.as_ptr() as usize));
        match mapped_len {
            Some(mapped_len) => {
                // SAFETY: the caller passes a pointer from `alloc_pinned` that no copy uses any
                // more, freed once; it was registered by `alloc_mapped`.
                unsafe { calls::mem_host_unregister(self.context, ptr.cast()) }?;
                // SAFETY: mapped by `alloc_mapped` with `mapped_len` bytes, unregistered just
                // now, and removed from the table, so unmapped once.
                unsafe { sys::numa::unmap(ptr, mapped_len) }
                    .map_err(|e| Error::InvalidArgument(format!("unmapping pinned memory: {e}")))
            }
            None => {
                // SAFETY: the caller passes a pointer from `alloc_pinned` (`cuMemHostAlloc`)
                // that no copy uses any more, freed once.
                unsafe { calls::mem_free_host(self.context, ptr.cast()) }
            }
        }
    }

    /// The first stream asked for in a context comes with the streams of the other rings a
    /// read is likely to start ([`ahead::ring_workers`]) and every ring's events (one per
    /// buffer), all made at once on this thread before any of their copies runs. 16 streams and
    /// 32 events took 0.55 ms so on an H200, where each worker making its own while the others
    /// pinned and copied waited up to 9 ms for a stream, and up to 26 ms for an event once the
    /// streams were made ahead (`benchmarks/RESULTS.md`, "Checkpoints", sessions 18-19). Later
    /// rings take those first.
    fn create_stream(&self) -> Result<Stream> {
        let mut spare = spare().lock().unwrap_or_else(|e| e.into_inner());
        match spare.get_mut(&self.context.id()) {
            Some(left) => {
                if let Some(stream) = left.streams.pop() {
                    return Ok(stream);
                }
            }
            None => {
                let settings = Settings::current();
                let workers = ahead::ring_workers(&settings);
                // The others wait on the lock meanwhile, and take theirs right after.
                let made = Spare {
                    streams: (1..workers)
                        .map_while(|_| Stream::new(self.context).ok())
                        .collect(),
                    events: (0..workers * settings.bounce_buffers.max(1))
                        .map_while(|_| Event::new(self.context).ok())
                        .collect(),
                };
                spare.insert(self.context.id(), made);
            }
        }
        drop(spare);
        Stream::new(self.context)
    }

    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        stream.destroy()
    }

    /// One of the events made with the context's first stream while any is left
    /// ([`create_stream`](CopyEngine::create_stream)), else a new one.
    fn create_event(&self) -> Result<Event> {
        let made = spare()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&self.context.id())
            .and_then(|left| left.events.pop());
        match made {
            Some(event) => Ok(event),
            None => Event::new(self.context),
        }
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
