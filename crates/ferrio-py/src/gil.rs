//! The one place the GIL is released.
//!
//! Every call that may block on I/O (opening a file, waiting on a future, dropping the page
//! cache, running the command line) goes through [`release_gil`]. It waits in short slices with
//! the GIL released and, between slices, re-attaches and runs Python's signal handlers, so Ctrl-C
//! raises `KeyboardInterrupt` within one slice. On an interrupt the work is aborted and waited
//! for *before* the exception is raised: no task may outlive the buffer it writes into.

use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How long one wait runs with the GIL released before signals are checked again. Short enough
/// that Ctrl-C feels immediate; long enough that re-attaching costs nothing measurable.
const SLICE: Duration = Duration::from_millis(50);

/// Work that can be waited on in slices with the GIL released.
pub(crate) trait Blocking: Send {
    /// What the work produces.
    type Output: Send;

    /// Waits up to `slice` for the work (never touching Python); `Some` once it has finished.
    fn wait_slice(&mut self, slice: Duration) -> Option<Self::Output>;

    /// Called when a signal handler raised (Ctrl-C): stop the work and return only once nothing
    /// it started can touch caller memory any more. Runs with the GIL released.
    fn abort(&mut self);
}

/// Runs `work` with the GIL released until it finishes, `timeout` passes (`Ok(None)`), or a
/// signal handler raises (the work is aborted first, then the handler's exception returned).
pub(crate) fn release_gil<B: Blocking>(
    py: Python<'_>,
    mut work: B,
    timeout: Option<Duration>,
) -> PyResult<Option<B::Output>> {
    // A deadline further away than the clock can count (a timeout of centuries) is none.
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let slice = match deadline {
            None => SLICE,
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
        };
        if let Some(out) = py.detach(|| work.wait_slice(slice)) {
            return Ok(Some(out));
        }
        if let Err(interrupt) = py.check_signals() {
            py.detach(|| work.abort());
            return Err(interrupt);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}

/// A plain blocking call (a syscall or two) run once, as [`Blocking`] work.
struct Call<F>(Option<F>);

impl<T: Send, F: FnOnce() -> T + Send> Blocking for Call<F> {
    type Output = T;

    fn wait_slice(&mut self, _slice: Duration) -> Option<T> {
        self.0.take().map(|f| f())
    }

    fn abort(&mut self) {}
}

/// Runs `f` once with the GIL released (through [`release_gil`]) and returns what it returned.
pub(crate) fn without_gil<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    match release_gil(py, Call(Some(f)), None)? {
        Some(out) => Ok(out),
        // `Call` finishes on its first slice; this arm exists only so nothing can panic.
        None => Err(PyRuntimeError::new_err("blocking call did not run")),
    }
}
