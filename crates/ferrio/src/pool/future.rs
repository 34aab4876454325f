//! [`IoFuture`]: the handle of one parallel read or write, and the shared completion state its
//! tasks report into.
//!
//! A future started before a `fork` and waited on in the child never completes there (its tasks
//! ran, or run, on the parent's threads, which the child does not have), and its lock may have
//! been held at the fork: in the child it fails at once without taking that lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::plan::Task;

type Callback = Box<dyn FnOnce(Result<usize>) + Send>;

/// Shared between an [`IoFuture`] and the tasks of its request.
pub(crate) struct Completion {
    state: Mutex<State>,
    cv: Condvar,
    cancelled: AtomicBool,
    bytes: AtomicU64,
    start: u64,
    len: usize,
    /// The process whose tasks report here.
    pid: u32,
}

struct State {
    remaining: usize,
    /// Lowest file offset where a task came up short (end of file); `u64::MAX` if none did.
    short_at: u64,
    error: Option<Error>,
    skipped: bool,
    /// The caller cancelled before the outcome was known ([`Completion::cancel_by_caller`]).
    cancel_asked: bool,
    /// Set once every task has reported: the outcome is known.
    done: bool,
    /// Set once, after `done`, the callbacks registered before completion have run.
    settled: bool,
    callbacks: Vec<Callback>,
}

impl State {
    fn outcome(&self, start: u64, len: usize) -> Result<usize> {
        match (&self.error, self.skipped || self.cancel_asked) {
            (Some(e), _) => Err(e.clone()),
            (None, true) => Err(Error::Cancelled),
            (None, false) => Ok(self.short_at.saturating_sub(start).min(len as u64) as usize),
        }
    }
}

impl Completion {
    /// State for a request of `tasks` tasks covering `[start, start+len)`.
    pub(crate) fn new(start: u64, len: usize, tasks: usize) -> Arc<Completion> {
        Arc::new(Completion {
            state: Mutex::new(State {
                remaining: tasks,
                short_at: u64::MAX,
                error: None,
                skipped: false,
                cancel_asked: false,
                done: tasks == 0,
                settled: tasks == 0,
                callbacks: Vec::new(),
            }),
            cv: Condvar::new(),
            cancelled: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            start,
            len,
            pid: crate::sys::process_id(),
        })
    }

    /// Whether this request was started by another process, the parent this one was forked from.
    fn is_inherited(&self) -> bool {
        self.pid != crate::sys::process_id()
    }

    /// The outcome of a request started before a fork, as seen in the child.
    fn inherited_error(&self) -> Error {
        Error::InvalidArgument(format!(
            "this request (offset {}, {} bytes) was started by process {} before it forked; \
             its tasks do not run in this process",
            self.start, self.len, self.pid
        ))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave `State` inconsistent (plain fields), so a
        // poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether tasks not yet started should be skipped.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Asks for tasks not yet started to be skipped.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// The caller's cancel: tasks not yet started are skipped, and the outcome is
    /// [`Error::Cancelled`] (unless a task failed first) even where every task had started.
    /// Returns false, changing nothing, if the outcome was already known.
    pub(crate) fn cancel_by_caller(&self) -> bool {
        if self.is_inherited() {
            return false;
        }
        let mut st = self.lock();
        if st.done {
            return false;
        }
        st.cancel_asked = true;
        self.cancel();
        true
    }

    /// Records that bytes were moved (for progress), before the task finishes.
    pub(crate) fn add_progress(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Reports one task's outcome: `Ok(n)` bytes moved (short only at end of file), an error,
    /// or `None` when the task was skipped because the request was cancelled.
    pub(crate) fn finish_task(&self, task: &Task, outcome: Option<Result<usize>>) {
        let mut st = self.lock();
        match outcome {
            Some(Ok(n)) => {
                if n < task.len {
                    st.short_at = st.short_at.min(task.offset + n as u64);
                }
            }
            Some(Err(e)) => {
                if st.error.is_none() {
                    st.error = Some(e);
                }
                self.cancel();
            }
            None => st.skipped = true,
        }
        st.remaining -= 1;
        if st.remaining > 0 {
            return;
        }
        // The outcome is known: mark done (a callback, or anyone polling, may ask for it), run
        // the callbacks without the lock, then mark settled, which `wait` waits for: once it
        // returns, every callback registered before completion has run. A callback registered
        // from now on sees `done` and runs at once on its own thread.
        let outcome = st.outcome(self.start, self.len);
        st.done = true;
        let callbacks = std::mem::take(&mut st.callbacks);
        drop(st);
        self.cv.notify_all();
        for cb in callbacks {
            cb(outcome.clone());
        }
        self.lock().settled = true;
        self.cv.notify_all();
    }

    /// Whether the outcome is known (every task has reported).
    pub(crate) fn is_done(&self) -> bool {
        self.is_inherited() || self.lock().done
    }

    /// Waits until the outcome is known (`settled`: and the callbacks have run) or `deadline`.
    fn wait_until(&self, deadline: Option<Instant>, settled: bool) -> bool {
        if self.is_inherited() {
            return true;
        }
        let mut st = self.lock();
        while !(if settled { st.settled } else { st.done }) {
            match deadline {
                None => st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    st = self
                        .cv
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
        true
    }

    fn result(&self) -> Result<usize> {
        if self.is_inherited() {
            return Err(self.inherited_error());
        }
        self.lock().outcome(self.start, self.len)
    }

    /// Runs `cb` with the outcome once every task has reported (at once if they have), before
    /// the waiters of the future wake ([`IoFuture::on_done`]).
    pub(crate) fn on_done(&self, cb: Callback) {
        if self.is_inherited() {
            return cb(Err(self.inherited_error()));
        }
        let mut st = self.lock();
        if st.done {
            let outcome = st.outcome(self.start, self.len);
            drop(st);
            cb(outcome);
        } else {
            st.callbacks.push(cb);
        }
    }
}

/// The handle of a parallel read or write.
///
/// The operation runs on worker threads whether or not anyone waits. [`IoFuture::wait`] returns
/// the bytes moved: for a read, fewer than asked only when the file ends first (0 past end of
/// file). On the first failing task, tasks not yet started are cancelled and the future resolves
/// once every running task has returned. Dropping a future waits for the operation: no task
/// outlives its future. `B` is the buffer the future owns while the operation runs (see
/// [`IoFuture::into_buffer`]). In a process forked after the operation started, the future
/// fails at once with [`Error::InvalidArgument`] and dropping it does not wait: its tasks run
/// only in the process that started them.
#[must_use = "an IoFuture does nothing useful unless waited on; dropping it blocks until done"]
pub struct IoFuture<B = ()> {
    completion: Arc<Completion>,
    buffer: Option<B>,
}

impl<B> IoFuture<B> {
    pub(crate) fn new(completion: Arc<Completion>, buffer: B) -> Self {
        IoFuture {
            completion,
            buffer: Some(buffer),
        }
    }

    /// The future of a request that `started` (queued, or refused before any I/O with its error).
    pub(crate) fn started(started: Result<Arc<Completion>>, buffer: B) -> Self {
        match started {
            Ok(c) => IoFuture::new(c, buffer),
            Err(e) => IoFuture::failed(e, buffer),
        }
    }

    /// A future that has already failed with `error` (validation errors, before any I/O).
    pub(crate) fn failed(error: Error, buffer: B) -> Self {
        let c = Completion::new(0, 0, 1);
        c.finish_task(&Task::at_buffer_start(0, 0), Some(Err(error)));
        IoFuture::new(c, buffer)
    }

    /// Blocks until the operation has finished; returns the bytes moved or the first error.
    pub fn wait(mut self) -> Result<usize> {
        self.completion.wait_until(None, true);
        self.buffer = None;
        self.completion.result()
    }

    /// The outcome if the operation has finished, without consuming the future.
    pub fn try_result(&self) -> Option<Result<usize>> {
        self.is_done().then(|| self.completion.result())
    }

    /// Blocks up to `timeout`. `Ok(true)` when the operation has finished (then call
    /// [`IoFuture::wait`] for its result), `Ok(false)` when it is still running.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.completion
            .wait_until(Some(Instant::now() + timeout), false)
    }

    /// Whether the operation has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.completion.is_done()
    }

    /// Bytes moved so far (progress; the final count comes from [`IoFuture::wait`]).
    pub fn bytes(&self) -> u64 {
        self.completion.bytes.load(Ordering::Relaxed)
    }

    /// Cancels the tasks not yet started; running tasks finish. The result is then
    /// [`Error::Cancelled`] unless another error came first. Returns false, changing nothing,
    /// if the operation had already finished.
    pub fn cancel(&self) -> bool {
        self.completion.cancel_by_caller()
    }

    /// Runs `f` with the outcome once the operation finishes: on the worker thread that finished
    /// the last task, or at once on this thread if it has already finished. `f` must not block
    /// for long (it holds up that worker). [`IoFuture::wait`] returns only after the callbacks
    /// registered before the operation finished have run.
    pub fn on_done(&self, f: impl FnOnce(Result<usize>) + Send + 'static) {
        self.completion.on_done(Box::new(f));
    }

    /// Waits for the operation and gives back the buffer it owned, with the result.
    pub fn into_buffer(mut self) -> (Result<usize>, B) {
        self.completion.wait_until(None, true);
        let result = self.completion.result();
        // `buffer` is `Some` from construction until here or `wait`, which consumes `self`.
        let buffer = self
            .buffer
            .take()
            .expect("an IoFuture holds its buffer until consumed");
        (result, buffer)
    }
}

impl<B> Drop for IoFuture<B> {
    fn drop(&mut self) {
        // The tasks may point into `buffer` (or into memory the caller promised to keep alive
        // while the future lives): they must all have returned before it goes.
        self.completion.wait_until(None, true);
    }
}

impl<B> std::fmt::Debug for IoFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoFuture")
            .field("done", &self.is_done())
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// Waits for every future; returns the total bytes moved, or the first error (after all have
/// finished, so no task outlives this call).
pub fn wait_all<B>(futures: impl IntoIterator<Item = IoFuture<B>>) -> Result<u64> {
    let mut total = 0u64;
    let mut first_error = None;
    for f in futures {
        match f.wait() {
            Ok(n) => total += n as u64,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(total),
    }
}
