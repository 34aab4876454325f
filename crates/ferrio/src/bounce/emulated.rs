//! A device emulated in host memory, so the bounce ring's logic is tested on every `cargo test`
//! without a GPU.
//!
//! [`EmulatedDevice`] implements [`CopyEngine`] the way the driver behaves: each stream is a
//! thread that executes its queued copies in order, each after a configurable delay; events are
//! completion markers queued behind the copies; "device memory" is host memory handed out by
//! [`EmulatedDevice::alloc_device`]. It also checks what the driver cannot:
//!
//! - every copy's addresses lie in emulated pinned memory on one side and in emulated device
//!   memory on the other (copies from pageable memory, or past an allocation, are errors);
//! - the source of a copy still holds, when the copy runs, the bytes it held when the copy was
//!   issued — a ring that overwrites a buffer whose copy is in flight is caught
//!   ([`EmulatedDevice::violations`]);
//! - the destination of a device-to-host copy is scribbled over when the copy is issued, so a
//!   ring that reads a buffer before its copy has completed writes garbage that tests see;
//! - every copy, record, stream, event and pinned allocation is issued while THIS device is
//!   bound, and a copy or record uses a stream (and event) of this device: with two devices, a
//!   driver fails an operation whose context is not current or whose stream belongs to another
//!   context, and so does the emulator (the operation is refused and listed in
//!   [`EmulatedDevice::violations`]);
//! - [`EmulatedDevice::host_range_busy`] tells a test callback whether a copy still uses a
//!   buffer, and the counters show how many copies were in flight at once.
//!
//! Failures can be injected when a copy is issued or while it runs (the latter is sticky, like
//! a CUDA context error). All of it is for tests: it is slow by design and never used for I/O.

use std::alloc::Layout;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{CopyEngine, PINNED_ALIGN};
use crate::cuda::DevicePtr;
use crate::error::{Error, Result};

/// The byte a device-to-host copy writes over its destination when it is issued.
pub const SCRIBBLE: u8 = 0xDB;

/// A device emulated in host memory; cloning gives another handle to the same device.
///
/// Two handles are equal when they are handles to the same device.
#[derive(Debug, Clone)]
pub struct EmulatedDevice {
    inner: Arc<Inner>,
}

impl PartialEq for EmulatedDevice {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for EmulatedDevice {}

#[derive(Debug)]
struct Inner {
    delay_ns: AtomicU64,
    state: Mutex<State>,
    idle: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Emulated device allocations: start address → length.
    device: BTreeMap<usize, (usize, Layout)>,
    /// Pinned allocations: address handed out → (length asked, allocation start, layout).
    pinned: HashMap<usize, (usize, usize, Layout)>,
    /// Hand out pinned memory 64 bytes past a page boundary (to test the ring's alignment).
    misalign_pinned: bool,
    next_copy: u64,
    completed: u64,
    in_flight: Vec<Pending>,
    max_in_flight: usize,
    violations: Vec<String>,
    fail_issue_at: Option<u64>,
    fail_run_at: Option<u64>,
    fault: Option<String>,
    streams: usize,
    events: usize,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    host: usize,
    len: usize,
}

/// One unit of work on an emulated stream.
enum Command {
    Copy {
        id: u64,
        dst: usize,
        src: usize,
        len: usize,
        expected: Vec<u8>,
        fail: bool,
    },
    Signal(Arc<EventState>, u64),
}

/// A stream of an [`EmulatedDevice`]: a thread executing its copies in order.
#[derive(Debug)]
pub struct EmulatedStream {
    queue: Option<mpsc::Sender<Command>>,
    thread: Option<JoinHandle<()>>,
    device: Arc<Inner>,
}

impl Drop for EmulatedStream {
    fn drop(&mut self) {
        // Closing the queue ends the thread once the copies queued before have run.
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.device.lock().streams -= 1;
    }
}

/// An event of an [`EmulatedDevice`].
#[derive(Debug)]
pub struct EmulatedEvent {
    state: Arc<EventState>,
    device: Arc<Inner>,
}

impl Drop for EmulatedEvent {
    fn drop(&mut self) {
        self.device.lock().events -= 1;
    }
}

#[derive(Debug, Default)]
struct EventState {
    /// (times recorded, highest record completed).
    marks: Mutex<(u64, u64)>,
    done: Condvar,
}

impl EventState {
    fn marks(&self) -> MutexGuard<'_, (u64, u64)> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Keeps an [`EmulatedDevice`] bound on this thread (the emulator's stand-in for a current
/// context) until dropped, which binds again the device bound before (as popping a context
/// does); copies issued without this device bound are refused.
#[derive(Debug)]
pub struct EmulatedBinding {
    previous: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

thread_local! {
    /// The device bound on this thread ([`EmulatedDevice::id`]), 0 for none.
    static BOUND: Cell<usize> = const { Cell::new(0) };
}

impl Drop for EmulatedBinding {
    fn drop(&mut self) {
        BOUND.with(|b| b.set(self.previous));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every stream holds a handle, so no copy runs any more: free what tests left behind.
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (&addr, &(_, layout)) in &st.device {
            // SAFETY: allocated with this layout in `alloc_device`, never freed (still listed).
            unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
        }
        for &(_, base, layout) in st.pinned.values() {
            // SAFETY: allocated with this layout in `alloc_pinned`, never freed (still listed).
            unsafe { std::alloc::dealloc(base as *mut u8, layout) };
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for EmulatedDevice {
    fn default() -> Self {
        EmulatedDevice::new(Duration::ZERO)
    }
}

impl EmulatedDevice {
    /// A device whose copies each take at least `copy_delay`.
    pub fn new(copy_delay: Duration) -> EmulatedDevice {
        EmulatedDevice {
            inner: Arc::new(Inner {
                delay_ns: AtomicU64::new(u64::try_from(copy_delay.as_nanos()).unwrap_or(u64::MAX)),
                state: Mutex::new(State::default()),
                idle: Condvar::new(),
            }),
        }
    }

    /// Changes the time each copy takes from now on.
    pub fn set_copy_delay(&self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.inner.delay_ns.store(ns, Ordering::Relaxed);
    }

    /// Hands out pinned memory that does not start on a page boundary (the driver does not
    /// promise page alignment; the ring must align by itself).
    pub fn set_misaligned_pinned(&self, misaligned: bool) {
        self.inner.lock().misalign_pinned = misaligned;
    }

    /// Allocates `len` bytes (at least 1) of emulated device memory, filled with a non-zero
    /// pattern.
    pub fn alloc_device(&self, len: usize) -> Result<DevicePtr> {
        let layout = Layout::from_size_align(len.max(1), 256).map_err(|e| {
            Error::OutOfMemory(format!("emulated device memory of {len} bytes: {e}"))
        })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(Error::OutOfMemory(format!(
                "emulated device memory of {len} bytes"
            )));
        }
        // SAFETY: `p` points to `layout.size()` freshly allocated bytes.
        unsafe { std::ptr::write_bytes(p, 0x5C, layout.size()) };
        self.inner.lock().device.insert(p as usize, (len, layout));
        Ok(DevicePtr(p as u64))
    }

    /// Frees emulated device memory from [`alloc_device`](Self::alloc_device).
    pub fn free_device(&self, ptr: DevicePtr) -> Result<()> {
        let (_, layout) = self
            .inner
            .lock()
            .device
            .remove(&(ptr.0 as usize))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{:#x} is no device allocation", ptr.0))
            })?;
        // SAFETY: the allocation was made with this layout in `alloc_device` and is removed from
        // the table, so it is freed once. (A copy still running on it would be a bug of the
        // caller, as with the driver.)
        unsafe { std::alloc::dealloc(ptr.0 as usize as *mut u8, layout) };
        Ok(())
    }

    /// Writes `data` to emulated device memory at `ptr` (synchronously).
    pub fn write_device(&self, ptr: DevicePtr, data: &[u8]) -> Result<()> {
        let st = self.inner.lock();
        check_device(&st, ptr.0 as usize, data.len())?;
        // SAFETY: the range lies within a live device allocation (checked under the lock, which
        // also keeps it from being freed meanwhile); `data` is a separate host slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.0 as usize as *mut u8, data.len())
        };
        Ok(())
    }

    /// Reads `len` bytes of emulated device memory at `ptr` (synchronously, without waiting for
    /// copies: what a kernel would see).
    pub fn read_device(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let st = self.inner.lock();
        check_device(&st, ptr.0 as usize, len)?;
        let mut out = vec![0; len];
        // SAFETY: the range lies within a live device allocation (checked under the lock).
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.0 as usize as *const u8, out.as_mut_ptr(), len)
        };
        Ok(out)
    }

    /// Makes the `n`-th copy issued from now on (0 = the next) fail when it is issued.
    pub fn fail_copy_issue(&self, n: u64) {
        let mut st = self.inner.lock();
        st.fail_issue_at = Some(st.next_copy + n);
    }

    /// Makes the `n`-th copy issued from now on fail while it runs: the failure is reported by
    /// waits, and sticks (later copies fail too) until [`clear_fault`](Self::clear_fault).
    pub fn fail_copy_run(&self, n: u64) {
        let mut st = self.inner.lock();
        st.fail_run_at = Some(st.next_copy + n);
    }

    /// Forgets a sticky failure.
    pub fn clear_fault(&self) {
        self.inner.lock().fault = None;
    }

    /// Copies issued so far.
    pub fn copies_issued(&self) -> u64 {
        self.inner.lock().next_copy
    }

    /// Copies completed so far (failed ones included).
    pub fn copies_completed(&self) -> u64 {
        self.inner.lock().completed
    }

    /// Copies issued and not yet completed.
    pub fn copies_in_flight(&self) -> usize {
        self.inner.lock().in_flight.len()
    }

    /// The most copies that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.inner.lock().max_in_flight
    }

    /// True if a copy in flight uses host memory in `ptr..ptr+len` (its pinned side).
    pub fn host_range_busy(&self, ptr: *const u8, len: usize) -> bool {
        let (start, end) = (ptr as usize, ptr as usize + len);
        self.inner
            .lock()
            .in_flight
            .iter()
            .any(|p| p.host < end && start < p.host + p.len)
    }

    /// Descriptions of the copies whose source changed between issue and execution, of pinned
    /// memory freed under a copy, and of operations issued while another device was bound or on
    /// another device's stream.
    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().violations.clone()
    }

    /// Pinned bytes allocated and not freed.
    pub fn pinned_bytes(&self) -> usize {
        self.inner.lock().pinned.values().map(|(len, ..)| len).sum()
    }

    /// Pinned allocations not freed.
    pub fn pinned_allocations(&self) -> usize {
        self.inner.lock().pinned.len()
    }

    /// Streams created and not destroyed.
    pub fn live_streams(&self) -> usize {
        self.inner.lock().streams
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.inner.lock().events
    }

    /// Blocks until no copy is in flight.
    pub fn wait_idle(&self) {
        let mut st = self.inner.lock();
        while !st.in_flight.is_empty() {
            st = self.inner.idle.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A number naming this device while it lives (never 0).
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Refuses `what` unless this device is the one bound on the calling thread. Binding another
    /// device is listed as a violation too: a ring that does it works on one GPU and fails with
    /// two.
    fn require_bound(&self, what: &str) -> Result<()> {
        let bound = BOUND.with(Cell::get);
        if bound == self.id() {
            return Ok(());
        }
        if bound == 0 {
            return Err(Error::InvalidArgument(format!(
                "emulated device: {what} without a binding (no current context)"
            )));
        }
        let why = format!("emulated device: {what} while another device is bound");
        self.inner.lock().violations.push(why.clone());
        Err(Error::InvalidArgument(why))
    }

    /// Refuses `what` on a stream (or event) of another device, listing it as a violation.
    fn require_own(&self, what: &str, owner: &Arc<Inner>) -> Result<()> {
        if Arc::ptr_eq(owner, &self.inner) {
            return Ok(());
        }
        let why = format!("emulated device: {what} on a stream or event of another device");
        self.inner.lock().violations.push(why.clone());
        Err(Error::InvalidArgument(why))
    }

    fn fault(st: &State, call: &'static str) -> Result<()> {
        match &st.fault {
            Some(why) => Err(Error::Cuda {
                call,
                code: 719,
                message: why.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Issues a copy of `len` bytes from `src` to `dst`; `host` is its pinned side.
    fn issue(
        &self,
        call: &'static str,
        dst: usize,
        src: usize,
        len: usize,
        to_device: bool,
        stream: &EmulatedStream,
    ) -> Result<()> {
        self.require_bound(call)?;
        self.require_own(call, &stream.device)?;
        let mut st = self.inner.lock();
        Self::fault(&st, call)?;
        let (host, device) = if to_device { (src, dst) } else { (dst, src) };
        check_pinned(&st, host, len)?;
        check_device(&st, device, len)?;
        let id = st.next_copy;
        if st.fail_issue_at == Some(id) {
            st.fail_issue_at = None;
            return Err(Error::Cuda {
                call,
                code: 1,
                message: format!("injected failure issuing copy {id}"),
            });
        }
        let fail = st.fail_run_at == Some(id);
        if fail {
            st.fail_run_at = None;
        }
        let mut expected = vec![0; len];
        // SAFETY: `src..src+len` lies in a live pinned or device allocation (checked above under
        // the lock); the caller's contract keeps it unchanged while the copy is in flight.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, expected.as_mut_ptr(), len) };
        if !to_device {
            // SAFETY: `dst..dst+len` lies in a live pinned allocation (checked above) that the
            // copy owns from now until it completes; scribbling on it is what makes a ring that
            // reads it too early fail visibly.
            unsafe { std::ptr::write_bytes(dst as *mut u8, SCRIBBLE, len) };
        }
        let queue = stream.queue.as_ref().ok_or_else(|| {
            Error::InvalidArgument("emulated device: stream already destroyed".to_string())
        })?;
        queue
            .send(Command::Copy {
                id,
                dst,
                src,
                len,
                expected,
                fail,
            })
            .map_err(|_| {
                Error::InvalidArgument("emulated device: stream thread gone".to_string())
            })?;
        st.next_copy += 1;
        st.in_flight.push(Pending { id, host, len });
        st.max_in_flight = st.max_in_flight.max(st.in_flight.len());
        Ok(())
    }
}

fn check_device(st: &State, addr: usize, len: usize) -> Result<()> {
    let inside = st
        .device
        .range(..=addr)
        .next_back()
        .is_some_and(|(&start, &(size, _))| addr + len <= start + size);
    if inside {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "emulated device: {addr:#x}+{len} is not within device memory"
        )))
    }
}

fn check_pinned(st: &State, addr: usize, len: usize) -> Result<()> {
    let inside = st
        .pinned
        .iter()
        .any(|(&start, &(size, ..))| start <= addr && addr + len <= start + size);
    if inside {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "emulated device: {addr:#x}+{len} is not within pinned host memory"
        )))
    }
}

/// The body of a stream's thread: runs copies in order, completes events behind them.
fn run_stream(device: Arc<Inner>, queue: mpsc::Receiver<Command>) {
    for command in queue {
        match command {
            Command::Copy {
                id,
                dst,
                src,
                len,
                expected,
                fail,
            } => {
                let delay = device.delay_ns.load(Ordering::Relaxed);
                if delay > 0 {
                    std::thread::sleep(Duration::from_nanos(delay));
                }
                let mut st = device.lock();
                if fail {
                    st.fault = Some(format!("injected failure running copy {id}"));
                }
                if st.fault.is_none() {
                    let mut now = vec![0; len];
                    // SAFETY: the source range was checked to lie in a live allocation when the
                    // copy was issued, and the issuer's contract keeps it alive and unchanged
                    // until the copy completes (below). A ring breaking that contract races
                    // with this read; catching such rings is this emulator's purpose.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src as *const u8, now.as_mut_ptr(), len)
                    };
                    if now != expected {
                        let first = now.iter().zip(&expected).position(|(a, b)| a != b);
                        st.violations.push(format!(
                            "copy {id}: source {src:#x}+{len} changed between issue and \
                             execution (first difference at byte {first:?})"
                        ));
                    }
                    // SAFETY: the destination range was checked likewise and belongs to this
                    // copy until it completes; source and destination are different
                    // allocations (one pinned, one device).
                    unsafe {
                        std::ptr::copy_nonoverlapping(expected.as_ptr(), dst as *mut u8, len)
                    };
                }
                st.completed += 1;
                st.in_flight.retain(|p| p.id != id);
                drop(st);
                device.idle.notify_all();
            }
            Command::Signal(event, mark) => {
                let mut marks = event.marks();
                marks.1 = marks.1.max(mark);
                drop(marks);
                event.done.notify_all();
            }
        }
    }
}

impl CopyEngine for EmulatedDevice {
    type Stream = EmulatedStream;
    type Event = EmulatedEvent;
    type Binding = EmulatedBinding;

    fn bind(&self) -> Result<EmulatedBinding> {
        let previous = BOUND.with(|b| b.replace(self.id()));
        Ok(EmulatedBinding {
            previous,
            _not_send: std::marker::PhantomData,
        })
    }

    fn alloc_pinned(&self, len: usize) -> Result<NonNull<u8>> {
        self.require_bound("alloc_pinned")?;
        let mut st = self.inner.lock();
        let skew = if st.misalign_pinned { 64 } else { 0 };
        let layout = Layout::from_size_align(len.max(1) + skew, PINNED_ALIGN)
            .map_err(|e| Error::OutOfMemory(format!("emulated pinned memory: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc(layout) };
        let base = NonNull::new(base)
            .ok_or_else(|| Error::OutOfMemory(format!("emulated pinned memory of {len} bytes")))?;
        // SAFETY: `skew` is less than the allocation's size, so the result stays inside it.
        let p = unsafe { base.add(skew) };
        st.pinned
            .insert(p.as_ptr() as usize, (len, base.as_ptr() as usize, layout));
        Ok(p)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, len: usize) -> Result<()> {
        let mut st = self.inner.lock();
        let addr = ptr.as_ptr() as usize;
        if st
            .in_flight
            .iter()
            .any(|p| p.host < addr + len && addr < p.host + p.len)
        {
            st.violations.push(format!(
                "pinned memory {addr:#x}+{len} freed while a copy used it"
            ));
        }
        let (size, base, layout) = st.pinned.remove(&addr).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "emulated device: {addr:#x} is no pinned allocation"
            ))
        })?;
        if size != len {
            return Err(Error::InvalidArgument(format!(
                "emulated device: pinned allocation {addr:#x} has {size} bytes, freed as {len}"
            )));
        }
        // SAFETY: `base` was allocated with `layout` in `alloc_pinned` and is removed from the
        // table, so it is freed once.
        unsafe { std::alloc::dealloc(base as *mut u8, layout) };
        Ok(())
    }

    fn create_stream(&self) -> Result<EmulatedStream> {
        self.require_bound("create_stream")?;
        let (tx, rx) = mpsc::channel();
        let device = self.inner.clone();
        let thread = std::thread::Builder::new()
            .name("ferrio-emulated-stream".to_string())
            .spawn(move || run_stream(device, rx))
            .map_err(|e| Error::InvalidArgument(format!("emulated stream thread: {e}")))?;
        self.inner.lock().streams += 1;
        Ok(EmulatedStream {
            queue: Some(tx),
            thread: Some(thread),
            device: self.inner.clone(),
        })
    }

    fn destroy_stream(&self, stream: EmulatedStream) -> Result<()> {
        drop(stream);
        Ok(())
    }

    fn create_event(&self) -> Result<EmulatedEvent> {
        self.require_bound("create_event")?;
        self.inner.lock().events += 1;
        Ok(EmulatedEvent {
            state: Arc::default(),
            device: self.inner.clone(),
        })
    }

    fn destroy_event(&self, event: EmulatedEvent) -> Result<()> {
        drop(event);
        Ok(())
    }

    fn record(&self, event: &EmulatedEvent, stream: &EmulatedStream) -> Result<()> {
        self.require_bound("record")?;
        self.require_own("record", &stream.device)?;
        self.require_own("record", &event.device)?;
        let mark = {
            let mut marks = event.state.marks();
            marks.0 += 1;
            marks.0
        };
        let queue = stream.queue.as_ref().ok_or_else(|| {
            Error::InvalidArgument("emulated device: stream already destroyed".to_string())
        })?;
        queue
            .send(Command::Signal(event.state.clone(), mark))
            .map_err(|_| Error::InvalidArgument("emulated device: stream thread gone".to_string()))
    }

    fn is_complete(&self, event: &EmulatedEvent) -> Result<bool> {
        let (recorded, completed) = *event.state.marks();
        Self::fault(&self.inner.lock(), "emulated cuEventQuery")?;
        Ok(completed >= recorded)
    }

    fn wait_event(&self, event: &EmulatedEvent) -> Result<()> {
        let mut marks = event.state.marks();
        let target = marks.0;
        while marks.1 < target {
            marks = event
                .state
                .done
                .wait(marks)
                .unwrap_or_else(|p| p.into_inner());
        }
        drop(marks);
        Self::fault(&self.inner.lock(), "emulated cuEventSynchronize")
    }

    fn wait_stream(&self, stream: &EmulatedStream) -> Result<()> {
        // A private event recorded now completes after everything queued so far.
        let _bound = self.bind()?;
        let marker = self.create_event()?;
        self.record(&marker, stream)?;
        self.wait_event(&marker).map_err(|e| match e {
            Error::Cuda { code, message, .. } => Error::Cuda {
                call: "emulated cuStreamSynchronize",
                code,
                message,
            },
            other => other,
        })
    }

    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: &EmulatedStream,
    ) -> Result<()> {
        self.issue(
            "emulated cuMemcpyHtoDAsync",
            dst.0 as usize,
            src as usize,
            len,
            true,
            stream,
        )
    }

    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: &EmulatedStream,
    ) -> Result<()> {
        self.issue(
            "emulated cuMemcpyDtoHAsync",
            dst as usize,
            src.0 as usize,
            len,
            false,
            stream,
        )
    }
}
