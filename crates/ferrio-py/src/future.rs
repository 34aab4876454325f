//! `IOFuture`: the Python handle of one parallel read or write, in the manner of
//! `concurrent.futures.Future`, and awaitable from asyncio.
//!
//! An `IOFuture` holds the caller's buffer export until the I/O is done, so the memory can be
//! neither freed nor resized while worker threads write into it; the export is released as soon
//! as the future is seen to be done. Done callbacks run on one dispatcher thread, never on the
//! engine's I/O workers, so a worker never waits for the GIL.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

use crate::errors::to_pyerr;
use crate::gil::{release_gil, Blocking};

type Outcome = Result<usize, ferrio::Error>;

/// Locks a mutex of this module. The data behind them stays consistent even if a thread
/// panicked while holding one (each critical section is a single replacement), so a poisoned
/// lock is used as is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits until `fut` is done, however long that takes.
fn wait_done(fut: &ferrio::IoFuture) {
    while !fut.wait_timeout(Duration::from_secs(3600)) {}
}

/// An operation under way: the engine's future and the buffer export it writes into or reads
/// from. Dropping it waits for the operation before releasing the export.
pub(crate) struct Pending {
    fut: Arc<ferrio::IoFuture>,
    keep: Option<Keep>,
}

/// What keeps an operation's memory alive: a buffer export, or a GPU array (or DLPack capsule).
pub(crate) enum Keep {
    /// A host buffer export.
    View(#[allow(dead_code)] crate::buffer::Export),
    /// The object owning GPU memory.
    Object(#[allow(dead_code)] Py<PyAny>),
}

impl Pending {
    /// Pairs an issued operation with what must outlive it.
    pub(crate) fn new(fut: ferrio::IoFuture, keep: Keep) -> Pending {
        Pending {
            fut: Arc::new(fut),
            keep: Some(keep),
        }
    }

    /// Waits (GIL released, Ctrl-C honoured) and returns the operation's result.
    pub(crate) fn wait(self, py: Python<'_>) -> PyResult<usize> {
        release_gil(py, WaitOne(Arc::clone(&self.fut)), None)?;
        match self.fut.try_result() {
            Some(outcome) => outcome.map_err(to_pyerr),
            None => Err(PyRuntimeError::new_err("I/O finished without a result")),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.fut.is_done() {
            // Only reached when an unfinished future is garbage-collected: wait for its tasks
            // with the GIL released so other Python threads run meanwhile.
            let fut = &self.fut;
            if Python::try_attach(|py| py.detach(|| wait_done(fut))).is_none() {
                wait_done(fut);
            }
        }
        // The tasks have all returned: the memory may now be freed or resized.
        drop(self.keep.take());
    }
}

/// Waiting on one operation, as [`Blocking`] work.
struct WaitOne(Arc<ferrio::IoFuture>);

impl Blocking for WaitOne {
    type Output = ();

    fn wait_slice(&mut self, slice: Duration) -> Option<()> {
        self.0.wait_timeout(slice).then_some(())
    }

    fn abort(&mut self) {
        self.0.cancel();
        wait_done(&self.0);
    }
}

/// Waiting on several operations, as [`Blocking`] work.
struct WaitAll(Vec<Arc<ferrio::IoFuture>>);

impl Blocking for WaitAll {
    type Output = ();

    fn wait_slice(&mut self, slice: Duration) -> Option<()> {
        let end = Instant::now() + slice;
        while let Some(fut) = self.0.last() {
            if !fut.wait_timeout(end.saturating_duration_since(Instant::now())) {
                return None;
            }
            self.0.pop();
        }
        Some(())
    }

    fn abort(&mut self) {
        for fut in &self.0 {
            fut.cancel();
        }
        for fut in &self.0 {
            wait_done(fut);
        }
    }
}

enum State {
    Running(Pending),
    Finished(Outcome),
}

#[derive(Default)]
struct Callbacks {
    /// Callbacks registered before the future was done, in order.
    list: Vec<Py<PyAny>>,
    /// The process in which the engine was asked to notify the dispatcher when the operation
    /// finishes. A child forked while the operation ran has a copy of the flag but neither
    /// the parent's dispatcher nor its workers: there nobody would ever notify.
    hooked_in: Option<u32>,
    /// Whether the dispatcher has run (or is running) the list; later ones run at once.
    fired: bool,
}

/// The handle of a parallel read or write started by `File.pread` or `File.pwrite`.
///
/// Like `concurrent.futures.Future`: `result()`, `exception()`, `done()`, `cancel()` and
/// `add_done_callback()`; also awaitable (`n = await f.pread(buf)`) without blocking the event
/// loop. The buffer given to the operation is held until it is done.
#[pyclass(frozen, module = "ferrio", name = "IOFuture")]
pub struct IOFuture {
    state: Mutex<State>,
    callbacks: Mutex<Callbacks>,
    what: String,
}

impl IOFuture {
    /// A future for an issued operation; `what` describes it for `repr`.
    pub(crate) fn new(pending: Pending, what: String) -> IOFuture {
        IOFuture {
            state: Mutex::new(State::Running(pending)),
            callbacks: Mutex::new(Callbacks::default()),
            what,
        }
    }

    /// The outcome if the operation is done. The first call that sees it done records the
    /// outcome and releases the buffer export.
    fn observe(&self) -> Option<Outcome> {
        let mut st = lock(&self.state);
        let outcome = match &*st {
            State::Finished(outcome) => return Some(outcome.clone()),
            State::Running(p) => p.fut.try_result()?,
        };
        let old = std::mem::replace(&mut *st, State::Finished(outcome.clone()));
        drop(st);
        // The operation is done, so dropping `Pending` releases the export without waiting.
        drop(old);
        Some(outcome)
    }

    /// The engine's future while the operation may still run.
    fn running(&self) -> Option<Arc<ferrio::IoFuture>> {
        match &*lock(&self.state) {
            State::Running(p) => Some(Arc::clone(&p.fut)),
            State::Finished(_) => None,
        }
    }

    /// Waits up to `timeout` (seconds, `None`: forever) and returns the outcome.
    fn outcome(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Outcome> {
        let timeout = timeout_of(timeout)?;
        if let Some(fut) = self.running() {
            if release_gil(py, WaitOne(fut), timeout)?.is_none() {
                return Err(PyTimeoutError::new_err(format!(
                    "{} did not finish within the timeout",
                    self.what
                )));
            }
        }
        self.observe()
            .ok_or_else(|| PyRuntimeError::new_err("I/O finished without a result"))
    }

    /// Runs the callbacks registered so far (on the dispatcher thread) and marks the list fired.
    fn fire(slf: &Bound<'_, IOFuture>) {
        let this = slf.get();
        this.observe();
        let list = {
            let mut cbs = lock(&this.callbacks);
            cbs.fired = true;
            std::mem::take(&mut cbs.list)
        };
        for cb in list {
            call_back(slf, cb.bind(slf.py()));
        }
    }
}

/// Calls a done callback with the future; its exception is reported, not raised, as
/// `concurrent.futures` does.
fn call_back(fut: &Bound<'_, IOFuture>, cb: &Bound<'_, PyAny>) {
    if let Err(e) = cb.call1((fut,)) {
        e.write_unraisable(fut.py(), Some(cb));
    }
}

/// Converts a timeout in seconds (`None`: no limit), refusing negative and NaN values. One too
/// long for a `Duration` (`float("inf")`, `1e20`) is no limit either.
fn timeout_of(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_nan() || s < 0.0 => Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, not {s}"
        ))),
        Some(s) => Ok(Duration::try_from_secs_f64(s).ok()),
    }
}

#[pymethods]
impl IOFuture {
    /// Waits up to `timeout` seconds (None, or one too long to count such as `float("inf")`:
    /// as long as it takes) and returns the bytes moved.
    ///
    /// For a read, fewer bytes than asked mean the file ended first. Raises the operation's
    /// exception if it failed (the same one on every call), `TimeoutError` if it is not done
    /// in time (the operation goes on), and `KeyboardInterrupt` on Ctrl-C (the operation is
    /// cancelled and has stopped when it is raised).
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<usize> {
        self.outcome(py, timeout)?.map_err(to_pyerr)
    }

    /// Waits like `result()` and returns the operation's exception, or None if it succeeded.
    /// Raises `ferrio.CancelledError` if it was cancelled, as `concurrent.futures` does.
    #[pyo3(signature = (timeout=None))]
    fn exception(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyErr>> {
        match self.outcome(py, timeout)? {
            Ok(_) => Ok(None),
            Err(e @ ferrio::Error::Cancelled) => Err(to_pyerr(e)),
            Err(e) => Ok(Some(to_pyerr(e))),
        }
    }

    /// Whether the operation has finished (successfully or not). Never blocks.
    fn done(&self) -> bool {
        self.observe().is_some()
    }

    /// Cancels the operation: parts not yet started are skipped, running parts finish, and
    /// `result()` then raises `ferrio.CancelledError` (or the error of a part that failed
    /// first). Returns False, changing nothing, if the operation had already finished.
    fn cancel(&self) -> bool {
        self.running().is_some_and(|fut| fut.cancel())
    }

    /// Whether the operation ended cancelled (`result()` raises `ferrio.CancelledError`).
    /// Never blocks.
    fn cancelled(&self) -> bool {
        matches!(self.observe(), Some(Err(ferrio::Error::Cancelled)))
    }

    /// Calls `fn(future)` once the operation has finished: at once (in this thread) if it
    /// already has, else on ferrio's callback thread. Exceptions raised by `fn` are reported
    /// through `sys.unraisablehook`, not raised.
    #[pyo3(signature = (r#fn, /))]
    fn add_done_callback(slf: &Bound<'_, Self>, r#fn: Bound<'_, PyAny>) -> PyResult<()> {
        let this = slf.get();
        // Observed before taking the lock: releasing the buffer may run Python code (the
        // exporter's finalizer), which must not find the lock held (it may add a callback too).
        let done = this.observe().is_some();
        let pid = std::process::id();
        let mut cbs = lock(&this.callbacks);
        // In a child forked while the parent waited to call them, the parent's callbacks are
        // the parent's: it runs them when its operation finishes. They are dropped here (after
        // the lock is released: dropping one may run Python code).
        let mut inherited = Vec::new();
        if cbs.hooked_in.is_some_and(|p| p != pid) && !cbs.fired {
            inherited = std::mem::take(&mut cbs.list);
            cbs.hooked_in = None;
        }
        let hooked = cbs.hooked_in.is_some();
        if cbs.fired || (!hooked && done) {
            drop(cbs);
            drop(inherited);
            call_back(slf, &r#fn);
            return Ok(());
        }
        cbs.list.push(r#fn.unbind());
        if hooked {
            return Ok(());
        }
        cbs.hooked_in = Some(pid);
        drop(cbs);
        drop(inherited);
        let sender = dispatcher()?;
        let me = slf.clone().unbind();
        match this.running() {
            Some(fut) => fut.on_done(move |_| {
                // If the dispatcher is gone (interpreter shutting down) there is nobody to call.
                let _ = sender.send(me);
            }),
            None => {
                let _ = sender.send(me);
            }
        }
        Ok(())
    }

    /// Lets asyncio code `await` the operation without blocking the event loop; the await
    /// returns the bytes moved or raises the operation's exception.
    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import(pyo3::intern!(py, "ferrio._asyncio"))?
            .call_method1(pyo3::intern!(py, "wrap"), (slf,))?
            .call_method0(pyo3::intern!(py, "__await__"))
    }

    fn __repr__(&self) -> String {
        let state = match &*lock(&self.state) {
            State::Running(p) if !p.fut.is_done() => {
                format!("running, {} bytes so far", p.fut.bytes())
            }
            State::Running(_) => "done".to_string(),
            State::Finished(Ok(n)) => format!("done, {n} bytes"),
            State::Finished(Err(e)) => format!("failed: {e}"),
        };
        format!("<ferrio.IOFuture {}: {state}>", self.what)
    }
}

/// Waits for every future (GIL released, Ctrl-C honoured) and returns their byte counts in
/// order.
///
/// Raises the first failed future's exception once all have finished, or `TimeoutError` if
/// they are not all done within `timeout` seconds (they go on; None or `float("inf")`: no
/// limit). On Ctrl-C every future is cancelled and has stopped before `KeyboardInterrupt` is
/// raised.
#[pyfunction]
#[pyo3(signature = (futures, timeout=None))]
pub(crate) fn wait(
    py: Python<'_>,
    futures: &Bound<'_, PyAny>,
    timeout: Option<f64>,
) -> PyResult<Vec<usize>> {
    let timeout = timeout_of(timeout)?;
    // Any iterable of futures (a list, a generator), as `concurrent.futures.wait` takes.
    let futures = futures
        .try_iter()?
        .map(|f| Ok(f?.cast_into::<IOFuture>()?))
        .collect::<PyResult<Vec<_>>>()?;
    let running: Vec<_> = futures.iter().filter_map(|f| f.get().running()).collect();
    if release_gil(py, WaitAll(running), timeout)?.is_none() {
        return Err(PyTimeoutError::new_err(format!(
            "not all of {} futures finished within the timeout",
            futures.len()
        )));
    }
    let mut counts = Vec::with_capacity(futures.len());
    for f in &futures {
        match f.get().observe() {
            Some(Ok(n)) => counts.push(n),
            Some(Err(e)) => return Err(to_pyerr(e)),
            None => return Err(PyRuntimeError::new_err("I/O finished without a result")),
        }
    }
    Ok(counts)
}

/// The sender of this process's callback dispatcher, started on first use. The thread runs for
/// the life of the process; it exits when it can no longer attach to the interpreter (shutdown).
/// A child forked from a process that had one gets its own: the parent's thread is not in it.
fn dispatcher() -> PyResult<mpsc::Sender<Py<IOFuture>>> {
    /// The dispatcher's sender, and the process it was started in.
    static DISPATCHER: Mutex<Option<(u32, mpsc::Sender<Py<IOFuture>>)>> = Mutex::new(None);
    let pid = std::process::id();
    if let Some((started_in, sender)) = &*lock(&DISPATCHER) {
        if *started_in == pid {
            return Ok(sender.clone());
        }
    }
    let (tx, rx) = mpsc::channel::<Py<IOFuture>>();
    let spawned = std::thread::Builder::new()
        .name("ferrio-callbacks".into())
        .spawn(move || {
            for fut in rx {
                let mut slot = Some(fut);
                let ran = Python::try_attach(|py| {
                    if let Some(fut) = slot.take() {
                        IOFuture::fire(fut.bind(py));
                    }
                });
                if ran.is_none() {
                    // The interpreter is gone: its objects must not be touched any more.
                    std::mem::forget(slot);
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        return Err(PyRuntimeError::new_err(format!(
            "cannot start ferrio's callback thread: {e}"
        )));
    }
    let mut current = lock(&DISPATCHER);
    match &*current {
        // Two threads raced to start one: the loser's thread ends when its sender drops.
        Some((started_in, sender)) if *started_in == pid => Ok(sender.clone()),
        _ => {
            // The parent's sender (if any) is forgotten, not dropped: its channel may hold the
            // parent's futures, which are not this process's to release.
            if let Some(inherited) = current.replace((pid, tx.clone())) {
                std::mem::forget(inherited);
            }
            Ok(tx)
        }
    }
}
