//! Worker pools: one per block device (or one global pool), the global thread cap, per-pool
//! statistics, and [`IoFuture`]. Which pool a file gets is `registry.rs`; how many threads a
//! pool gets is `threads.rs`; this file is the pool itself (workers, jobs, scheduling).
//!
//! A pool runs *jobs*. A job is one request split into tasks. Workers take tasks round-robin
//! across the jobs queued on their pool: after a worker claims a task of the job at the front,
//! the job goes to the back. So a huge read cannot starve a small one behind it; each gets a
//! share of the pool's threads. Threads start lazily when work arrives (one for every task
//! queued or running, up to the pool's size) and live for the rest of the process. The pool
//! knows nothing of files: a job carries a closure that runs one task.
//!
//! A task may return with work still running on its worker (a bounce ring's last copies to the
//! GPU): it says so with `Worker::leave_running`, and its outcome is held back until the worker
//! settles that work, which it does before it turns to another job, before it waits for work and
//! before its thread ends. A worker running several tasks of one job in a row so keeps its copies
//! flowing, and the job still completes only when all its work has. A job whose tasks leave their
//! work on the same ring (`Request::leaves_running`) needs no settling before it: its task says
//! when the ring has seen the earlier work finish (`Worker::earlier_work_done`), so a worker
//! moving between several such jobs (the shards of one checkpoint) keeps its copies flowing too.
//!
//! Pools belong to the process that built them: a forked child never uses its parent's (their
//! threads are gone; see `registry.rs`), and `DevicePool::is_current` tells which is which.
//!
//! Lock order: the registry lock is never held while a pool's queue lock is taken; a pool's
//! queue lock is held only to push or pop jobs (never across a task or a syscall); a
//! `Completion` lock is taken last and only by `future.rs`.

mod future;
mod registry;
mod threads;

pub(crate) use future::Completion;
pub use future::{wait_all, IoFuture};
pub use registry::stats;
pub(crate) use registry::{pool_for_device, pool_in_this_process};
#[cfg(any(test, feature = "testing"))]
pub use threads::suggested_threads;
pub use threads::default_threads;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::error::Result;
use crate::plan::Task;
use crate::policy::{self, WriteProbe};
use crate::buffer::AlignedBuf;
use registry::Process;

/// Per-thread state a task may use: scratch memory for unaligned direct I/O, reused across
/// tasks so no task allocates, and work a task left running on the thread.
pub(crate) struct Worker {
    scratch: Option<AlignedBuf>,
    unsettled: Unsettled,
    /// The request of the task running on this worker ([`Worker::cancelled`]).
    running: Option<Arc<Completion>>,
}

/// Waits for work a task left running on its worker (copies still in flight on a bounce ring's
/// stream, say); an error fails the tasks that left it.
pub(crate) type Settle = Box<dyn FnOnce() -> Result<()>>;

/// Work tasks left running on one worker, and the tasks whose outcome waits for it.
///
/// A task that returns with work in flight (see [`Worker::leave_running`]) is not reported to
/// its request until that work has finished, so a request completes only when all of it has.
/// The worker settles before it runs a task of another job (unless that job's task will say when
/// the work is done: [`Request::leaves_running`]), before it waits for work, and before its
/// thread ends: a worker taking the next task of the same job keeps its work flowing, and the
/// request's completion is not delayed (it waits for that next task anyway).
#[derive(Default)]
struct Unsettled {
    /// How to wait for each kind of work left running, by a key chosen by the task.
    settle: Vec<(u64, Settle)>,
    /// Tasks that returned while work was left running: their job, index and outcome.
    tasks: Vec<(Arc<Job>, usize, Result<usize>)>,
    /// A task of another job began without settling (its request's tasks say when the work is
    /// done): the next [`Worker::earlier_work_done`] reports the tasks waiting here.
    report_when_done: bool,
}

/// Bytes of each worker's aligned scratch buffer. Direct I/O into unaligned memory and
/// over-read go through it in windows of this size; total scratch memory is capped by the thread
/// cap times this.
pub(crate) const SCRATCH_BYTES: usize = 4 << 20;

impl Worker {
    fn new() -> Worker {
        Worker {
            scratch: None,
            unsettled: Unsettled::default(),
            running: None,
        }
    }

    /// Whether the request of the running task was cancelled (or one of its tasks failed): a
    /// long task that works in steps (a fill of 64 MiB on a slow file system) stops between
    /// them, rather than finishing work nobody will use.
    pub(crate) fn cancelled(&self) -> bool {
        self.running.as_ref().is_some_and(|c| c.is_cancelled())
    }

    /// Says that the running task leaves work in flight on this thread: its outcome (and the
    /// outcome of later tasks on this worker, until it settles) is reported only after `settle`
    /// has returned. One `settle` per `key` is kept; a second one with the same key is dropped,
    /// so `key` must name the work (one bounce ring, say) and `settle` wait for all of it.
    pub(crate) fn leave_running(&mut self, key: u64, settle: Settle) {
        if !self.unsettled.settle.iter().any(|(k, _)| *k == key) {
            self.unsettled.settle.push((key, settle));
        }
    }

    /// Says that all work left running under `key` before the running task began has finished
    /// without error (a bounce ring has waited for each of its buffers since): the tasks whose
    /// outcome waited only for that work are reported now, rather than at the next settle.
    /// Nothing happens while work under another key is left running too.
    ///
    /// Only a worker that moved to another job without settling reports anything: tasks of one
    /// job wait for the next settle as before (their request waits for the last one anyway).
    pub(crate) fn earlier_work_done(&mut self, key: u64) {
        if !self.unsettled.report_when_done || !self.only_running(key) {
            return;
        }
        self.unsettled.report_when_done = false;
        for (job, index, outcome) in std::mem::take(&mut self.unsettled.tasks) {
            job.completion.finish_task(&job.tasks[index], Some(outcome));
        }
    }

    /// Whether the only work left running here is under `key`.
    fn only_running(&self, key: u64) -> bool {
        matches!(self.unsettled.settle.as_slice(), [(k, _)] if *k == key)
    }

    /// Whether tasks' outcomes wait for work left running here.
    fn is_unsettled(&self) -> bool {
        !self.unsettled.settle.is_empty() || !self.unsettled.tasks.is_empty()
    }

    /// Whether work left running belongs to a job other than `job`.
    fn unsettled_other_than(&self, job: &Arc<Job>) -> bool {
        self.unsettled
            .tasks
            .iter()
            .any(|(j, _, _)| !Arc::ptr_eq(j, job))
    }

    /// Waits for the work left running, then reports the tasks that waited for it; if waiting
    /// fails, tasks that had succeeded report that error.
    fn settle(&mut self) {
        let Unsettled { settle, tasks, .. } = std::mem::take(&mut self.unsettled);
        let mut failed = None;
        for (_, f) in settle {
            if let Err(e) = f() {
                failed.get_or_insert(e);
            }
        }
        for (job, index, outcome) in tasks {
            let outcome = match (&failed, outcome) {
                (Some(e), Ok(_)) => Err(e.clone()),
                (_, outcome) => outcome,
            };
            job.completion.finish_task(&job.tasks[index], Some(outcome));
        }
    }

    /// The worker's scratch buffer, aligned to `align` (allocated on first use, reused after).
    pub(crate) fn scratch(&mut self, align: usize) -> Option<&mut AlignedBuf> {
        let align = align.max(crate::sys::page_size());
        if self.scratch.as_ref().is_none_or(|s| s.align() < align) {
            self.scratch = Some(AlignedBuf::new(SCRATCH_BYTES, align)?);
        }
        self.scratch.as_mut()
    }
}

thread_local! {
    /// The worker state of the calling thread, for tasks run inline on it.
    static INLINE_WORKER: std::cell::RefCell<Worker> = std::cell::RefCell::new(Worker::new());
}

/// Direction of a job, for statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Read,
    Write,
}

/// Runs one task of a job on a worker; returns the bytes moved.
pub(crate) type TaskFn = dyn Fn(&mut Worker, &Task) -> Result<usize> + Send + Sync;

/// One request for a pool: its tasks, how to run one, and how many may run at once.
pub(crate) struct Request {
    /// The tasks, in file order.
    pub(crate) tasks: Vec<Task>,
    /// Where the tasks report.
    pub(crate) completion: Arc<Completion>,
    /// Read or write, for statistics.
    pub(crate) direction: Direction,
    /// A small single-task request may run on the calling thread.
    pub(crate) inline_ok: bool,
    /// Most tasks of this request running at once (`usize::MAX`: as many as there are threads).
    pub(crate) max_active: usize,
    /// The key under which this request's tasks leave work running, where each task calls
    /// [`Worker::earlier_work_done`] with it once the work left before it has finished: a worker
    /// with only such work left running then starts a task of this request without settling.
    pub(crate) leaves_running: Option<u64>,
    /// Runs one task.
    pub(crate) run: Box<TaskFn>,
}

struct Job {
    tasks: Vec<Task>,
    next: AtomicUsize,
    /// Tasks claimed and not yet finished.
    active: AtomicUsize,
    max_active: usize,
    leaves_running: Option<u64>,
    run: Box<TaskFn>,
    completion: Arc<Completion>,
    direction: Direction,
}

impl Job {
    fn new(r: Request, next: usize) -> Job {
        Job {
            tasks: r.tasks,
            next: AtomicUsize::new(next),
            active: AtomicUsize::new(0),
            max_active: r.max_active.max(1),
            leaves_running: r.leaves_running,
            run: r.run,
            completion: r.completion,
            direction: r.direction,
        }
    }

    /// Whether a worker may claim a task of this job now.
    fn may_start(&self) -> bool {
        self.completion.is_cancelled() || self.active.load(Ordering::Acquire) < self.max_active
    }
}

/// Statistics of one pool, as counted since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// The pool's key: the device (or device set, or file system) it serves.
    pub key: String,
    /// Worker threads started.
    pub threads: usize,
    /// Most threads it may start.
    pub max_threads: usize,
    /// Bytes read by its tasks.
    pub bytes_read: u64,
    /// Bytes written by its tasks.
    pub bytes_written: u64,
    /// Tasks run (including failed ones).
    pub tasks: u64,
    /// Tasks queued and not yet started.
    pub queued: u64,
    /// Nanoseconds workers spent running tasks, summed over workers.
    pub busy_ns: u64,
    /// Bytes read or written with `O_DIRECT`.
    pub bytes_direct: u64,
    /// Bytes read or written through the page cache.
    pub bytes_buffered: u64,
}

#[derive(Default)]
struct Counters {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    tasks: AtomicU64,
    queued: AtomicU64,
    busy_ns: AtomicU64,
    bytes_direct: AtomicU64,
    bytes_buffered: AtomicU64,
}

/// A set of worker threads serving one device (or, in global mode, everything).
pub struct DevicePool {
    key: String,
    max_threads: AtomicUsize,
    queue: Mutex<VecDeque<Arc<Job>>>,
    ready: Condvar,
    started: AtomicUsize,
    /// Workers running a task now: with the tasks queued, the work there is for threads.
    running: AtomicUsize,
    counters: Counters,
    /// The process whose pool this is, and where its threads are counted.
    process: &'static Process,
    /// What the first `auto` write that could go either way measured on this device
    /// ([`crate::policy::WriteProbe`]); `None` inside where it could not be measured.
    write_probe: OnceLock<Option<WriteProbe>>,
    /// The `auto` writes that went through the page cache here: what buffered writes really
    /// deliver, which the probe's few MiB may not show (fresh memory in a VM, the kernel's dirty
    /// limit).
    buffered: Mutex<BufferedMeter>,
    /// The meter's rate in bytes per second (`f64` bits) once it has seen
    /// [`policy::WRITE_RATE_WINDOW`], else 0: read by every write task without the meter's lock.
    buffered_rate: AtomicU64,
}

/// Bytes written through the page cache and the wall time during which at least one such write
/// ran: their rate together, however many ran at once (writers to one file wait on each other
/// for the inode's lock, so each one's own time says little).
#[derive(Default)]
struct BufferedMeter {
    running: usize,
    since: Option<Instant>,
    busy: std::time::Duration,
    bytes: u64,
}

impl DevicePool {
    fn new(key: String, max_threads: usize) -> Arc<DevicePool> {
        Arc::new(DevicePool {
            key,
            max_threads: AtomicUsize::new(max_threads.max(1)),
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            started: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            counters: Counters::default(),
            process: registry::process(),
            write_probe: OnceLock::new(),
            buffered: Mutex::new(BufferedMeter::default()),
            buffered_rate: AtomicU64::new(0),
        })
    }

    /// Whether this pool belongs to the calling process. A pool inherited through `fork` has no
    /// threads in the child and may have its locks held forever: the child must use its own
    /// ([`pool_in_this_process`]).
    pub(crate) fn is_current(&self) -> bool {
        self.process.is_current()
    }

    /// The device's write probe: measured by `measure` on the first call (others wait for it),
    /// remembered for the process.
    pub(crate) fn write_probe(
        &self,
        measure: impl FnOnce() -> Option<WriteProbe>,
    ) -> Option<WriteProbe> {
        *self.write_probe.get_or_init(measure)
    }

    /// What the device's write probe measured, if one has run in this process, with its buffered
    /// rate replaced by that of the `auto` writes that went through the page cache since, once
    /// they add up to [`policy::WRITE_RATE_WINDOW`] ([`DevicePool::time_buffered_write`]).
    pub fn measured_writes(&self) -> Option<WriteProbe> {
        let probe = self.write_probe.get().copied().flatten()?;
        let rate = f64::from_bits(self.buffered_rate.load(Ordering::Relaxed));
        if rate <= 0.0 {
            return Some(probe);
        }
        Some(WriteProbe {
            buffered: rate,
            ..probe
        })
    }

    /// Runs `write`, an `auto` write of `bytes` through the page cache, on the meter of such
    /// writes ([`DevicePool::measured_writes`]).
    pub(crate) fn time_buffered_write<T>(&self, bytes: u64, write: impl FnOnce() -> T) -> T {
        {
            let mut m = self.meter();
            if m.running == 0 {
                m.since = Some(Instant::now());
            }
            m.running += 1;
        }
        let out = write();
        let mut m = self.meter();
        m.running -= 1;
        m.bytes += bytes;
        if m.running == 0 {
            if let Some(since) = m.since.take() {
                m.busy += since.elapsed();
            }
            let busy = m.busy.as_secs_f64();
            if m.bytes >= policy::WRITE_RATE_WINDOW && busy > 0.0 {
                let rate = m.bytes as f64 / busy;
                self.buffered_rate.store(rate.to_bits(), Ordering::Relaxed);
            }
        }
        out
    }

    fn meter(&self) -> MutexGuard<'_, BufferedMeter> {
        // Every update leaves the meter consistent: a poisoned one is too.
        self.buffered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Most threads this pool may run.
    pub(crate) fn width(&self) -> usize {
        self.max_threads.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<Job>>> {
        // Only whole pushes/pops happen under this lock, so a poisoned queue is consistent.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a request's tasks and returns at once. Small single-task requests run inline on
    /// the calling thread (a thread hop would cost more than the I/O).
    pub(crate) fn submit(self: &Arc<Self>, request: Request, thread_cap: usize) {
        let n = request.tasks.len();
        if n == 0 {
            return;
        }
        if request.inline_ok && n == 1 && request.tasks[0].len <= INLINE_MAX_BYTES {
            let job = Arc::new(Job::new(request, 1));
            INLINE_WORKER.with(|w| {
                let mut w = w.borrow_mut();
                self.run_task(&mut w, &job, 0);
                w.settle();
            });
            return;
        }
        let job = Arc::new(Job::new(request, 0));
        let queued = self.counters.queued.fetch_add(n as u64, Ordering::Relaxed) as usize + n;
        self.lock().push_back(job);
        // Threads for every task queued or running, not only this request's: single-task
        // requests from several callers at once (16 threads each reading its own 512 KiB into
        // GPU memory) ran one after another on the pool's first thread.
        self.grow(queued + self.running.load(Ordering::Acquire), thread_cap);
        if n == 1 {
            self.ready.notify_one();
        } else {
            self.ready.notify_all();
        }
    }

    /// Starts threads up to this pool's size while there is work for them (`tasks` queued or
    /// running), within the global cap (a pool always gets its first thread, so no device is
    /// left without one).
    fn grow(self: &Arc<Self>, tasks: usize, thread_cap: usize) {
        let want = tasks.min(self.max_threads.load(Ordering::Relaxed));
        loop {
            let have = self.started.load(Ordering::Acquire);
            if have >= want {
                return;
            }
            if have > 0 && self.process.threads.load(Ordering::Acquire) >= thread_cap {
                return;
            }
            if self
                .started
                .compare_exchange(have, have + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            self.process.threads.fetch_add(1, Ordering::AcqRel);
            let pool = Arc::clone(self);
            let name = format!("ferrio-{}-{}", self.key, have);
            if std::thread::Builder::new()
                .name(name)
                .spawn(move || pool.work())
                .is_err()
            {
                // Out of threads: the ones already running will drain the queue.
                self.started.fetch_sub(1, Ordering::AcqRel);
                self.process.threads.fetch_sub(1, Ordering::AcqRel);
                return;
            }
        }
    }

    fn work(self: Arc<Self>) {
        let mut worker = Worker::new();
        loop {
            let (job, claimed) = {
                let mut q = self.lock();
                loop {
                    if self.retire_one() {
                        drop(q);
                        worker.settle();
                        // A thread that ends normally gives its pinned bounce buffers back.
                        crate::bounce::release_thread_rings();
                        return;
                    }
                    // Round-robin over the jobs, passing over those at their concurrency cap.
                    let Some(job) = q
                        .iter()
                        .position(|j| j.may_start())
                        .and_then(|i| q.remove(i))
                    else {
                        if worker.is_unsettled() {
                            // No task to run now: report the ones waiting on this worker
                            // before sleeping (without the queue lock), then look again.
                            drop(q);
                            worker.settle();
                            q = self.lock();
                            continue;
                        }
                        q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
                        continue;
                    };
                    let n = job.tasks.len();
                    if job.completion.is_cancelled() {
                        // Claim every task left at once: a cancelled job must not wait its turn
                        // behind the other jobs once per task to be skipped.
                        let first = job.next.swap(n, Ordering::Relaxed);
                        if first < n {
                            break (job, first..n);
                        }
                        continue;
                    }
                    let index = job.next.fetch_add(1, Ordering::Relaxed);
                    if index + 1 < n {
                        // The job waits behind the others for its next task.
                        q.push_back(Arc::clone(&job));
                    }
                    if index < n {
                        job.active.fetch_add(1, Ordering::AcqRel);
                        break (job, index..index + 1);
                    }
                }
            };
            // Counted running before no longer queued, so a caller in between sees it once at
            // least.
            self.running.fetch_add(1, Ordering::AcqRel);
            self.counters
                .queued
                .fetch_sub(claimed.len() as u64, Ordering::Relaxed);
            if worker.unsettled_other_than(&job) {
                if job.leaves_running.is_some_and(|k| worker.only_running(k)) {
                    // This job's task says when the other job's work is done.
                    worker.unsettled.report_when_done = true;
                } else {
                    // Another job's outcome waits on this worker: do not make it wait for this
                    // one.
                    worker.settle();
                }
            }
            let capped = job.max_active != usize::MAX && claimed.len() == 1;
            for index in claimed {
                self.run_task(&mut worker, &job, index);
            }
            self.running.fetch_sub(1, Ordering::AcqRel);
            if capped {
                job.active.fetch_sub(1, Ordering::AcqRel);
                // Another worker may be waiting for this job to drop below its cap.
                self.ready.notify_one();
            }
        }
    }

    /// Ends one thread of this pool if it has more than its size (after a resize down).
    fn retire_one(&self) -> bool {
        let mut have = self.started.load(Ordering::Acquire);
        while have > self.max_threads.load(Ordering::Relaxed) {
            match self
                .started
                .compare_exchange(have, have - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.process.threads.fetch_sub(1, Ordering::AcqRel);
                    return true;
                }
                Err(now) => have = now,
            }
        }
        false
    }

    fn run_task(&self, worker: &mut Worker, job: &Arc<Job>, index: usize) {
        let task = &job.tasks[index];
        if job.completion.is_cancelled() {
            job.completion.finish_task(task, None);
            return;
        }
        let t0 = Instant::now();
        worker.running = Some(Arc::clone(&job.completion));
        let outcome = (job.run)(worker, task);
        worker.running = None;
        let c = &self.counters;
        c.busy_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.tasks.fetch_add(1, Ordering::Relaxed);
        if let Ok(n) = outcome {
            let bytes = match job.direction {
                Direction::Read => &c.bytes_read,
                Direction::Write => &c.bytes_written,
            };
            bytes.fetch_add(n as u64, Ordering::Relaxed);
            job.completion.add_progress(n as u64);
        }
        if worker.is_unsettled() {
            if outcome.is_err() {
                // Skip the job's tasks not started now, not once the outcome is reported.
                job.completion.cancel();
            }
            worker
                .unsettled
                .tasks
                .push((Arc::clone(job), index, outcome));
        } else {
            job.completion.finish_task(task, Some(outcome));
        }
    }

    /// Counts bytes moved with or without `O_DIRECT` (called by tasks).
    pub(crate) fn count_path(&self, direct: bool, n: usize) {
        let c = if direct {
            &self.counters.bytes_direct
        } else {
            &self.counters.bytes_buffered
        };
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A snapshot of the pool's statistics.
    pub fn stats(&self) -> PoolStats {
        let c = &self.counters;
        PoolStats {
            key: self.key.clone(),
            threads: self.started.load(Ordering::Relaxed),
            max_threads: self.max_threads.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            tasks: c.tasks.load(Ordering::Relaxed),
            queued: c.queued.load(Ordering::Relaxed),
            busy_ns: c.busy_ns.load(Ordering::Relaxed),
            bytes_direct: c.bytes_direct.load(Ordering::Relaxed),
            bytes_buffered: c.bytes_buffered.load(Ordering::Relaxed),
        }
    }
}

impl std::fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePool")
            .field("key", &self.key)
            .field("threads", &self.started.load(Ordering::Relaxed))
            .field("max_threads", &self.max_threads.load(Ordering::Relaxed))
            .finish()
    }
}

/// Requests of one task up to this size run on the calling thread.
const INLINE_MAX_BYTES: usize = 64 << 10;

#[cfg(any(test, feature = "testing"))]
/// I/O worker threads started by all pools of this process together.
pub fn total_threads() -> usize {
    registry::process().threads.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tasks(n: usize) -> Vec<Task> {
        (0..n)
            .map(|i| Task {
                offset: i as u64,
                len: 1,
                buf_offset: i,
            })
            .collect()
    }

    #[test]
    fn buffered_writes_replace_the_probes_buffered_rate_once_they_fill_the_window() {
        let pool = DevicePool::new("probe-test".into(), 1);
        assert_eq!(pool.measured_writes(), None);
        let probe = WriteProbe {
            buffered: 4e9,
            direct: 1e9,
        };
        assert_eq!(pool.write_probe(|| Some(probe)), Some(probe));
        // Measured once: a second caller gets the first answer.
        assert_eq!(pool.write_probe(|| None), Some(probe));
        assert!(pool.measured_writes().unwrap().prefers_buffered());
        // Slow buffered writes, short of the window: the probe still decides.
        let half = policy::WRITE_RATE_WINDOW / 2;
        let slow = || std::thread::sleep(Duration::from_millis(100));
        pool.time_buffered_write(half, slow);
        assert_eq!(pool.measured_writes(), Some(probe));
        // Two at once fill the window: their rate together decides, over the 200 ms during which
        // one ran or both did (not the 300 ms of their own times added up): 64 MiB in 200 ms is
        // not 1.25 × the probe's direct rate, so direct writes win.
        std::thread::scope(|s| {
            s.spawn(|| pool.time_buffered_write(half / 2, slow));
            s.spawn(|| pool.time_buffered_write(half / 2, slow));
        });
        let seen = pool.measured_writes().unwrap();
        let window = policy::WRITE_RATE_WINDOW as f64;
        assert!(seen.buffered <= window / 0.2, "{seen:?}");
        assert!(seen.buffered > window / 0.27, "{seen:?}");
        assert_eq!(seen.direct, probe.direct);
        assert!(!seen.prefers_buffered());
    }

    fn req(tasks: Vec<Task>, completion: Arc<Completion>, run: Box<TaskFn>) -> Request {
        Request {
            tasks,
            completion,
            direction: Direction::Read,
            inline_ok: false,
            max_active: usize::MAX,
            leaves_running: None,
            run,
        }
    }

    fn sleepy(ms: u64) -> Box<TaskFn> {
        Box::new(move |_, _| {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(1)
        })
    }

    #[test]
    fn a_huge_request_cannot_starve_a_small_one() {
        let pool = DevicePool::new("test-fairness".into(), 1);
        let huge = Completion::new(0, 200, 200);
        pool.submit(req(tasks(200), Arc::clone(&huge), sleepy(2)), usize::MAX);
        std::thread::sleep(Duration::from_millis(10));
        let small = Completion::new(0, 2, 2);
        let small_fut = IoFuture::new(Arc::clone(&small), ());
        pool.submit(req(tasks(2), small, sleepy(2)), usize::MAX);
        assert_eq!(small_fut.wait().unwrap(), 2);
        let huge_fut = IoFuture::new(huge, ());
        assert!(
            !huge_fut.is_done(),
            "the small request waited for the whole huge one"
        );
        assert_eq!(huge_fut.wait().unwrap(), 200);
    }

    #[test]
    fn requests_on_one_pool_share_it_round_robin() {
        let pool = DevicePool::new("test-round-robin".into(), 1);
        let order = Arc::new(Mutex::new(Vec::new()));
        let futs: Vec<_> = (0..3)
            .map(|id| {
                let c = Completion::new(0, 4, 4);
                let order = Arc::clone(&order);
                let run: Box<TaskFn> = Box::new(move |_, _| {
                    order.lock().unwrap().push(id);
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(1)
                });
                pool.submit(req(tasks(4), Arc::clone(&c), run), usize::MAX);
                IoFuture::new(c, ())
            })
            .collect();
        assert_eq!(wait_all(futs).unwrap(), 12);
        let order = order.lock().unwrap();
        // After the first task (taken before the others were queued), every window of three
        // consecutive tasks while all three are queued holds each request once.
        let tail: Vec<_> = order.iter().copied().skip_while(|&id| id == 0).collect();
        assert!(tail.len() >= 6, "{order:?}");
        for w in tail[..6].chunks(3) {
            let mut w = w.to_vec();
            w.sort();
            w.dedup();
            assert!(w.len() >= 2, "not interleaved: {order:?}");
        }
    }

    #[test]
    fn the_global_cap_bounds_new_threads_but_every_pool_gets_one() {
        let cap = total_threads();
        let pool = DevicePool::new("test-cap".into(), 8);
        let c = Completion::new(0, 16, 16);
        pool.submit(req(tasks(16), Arc::clone(&c), sleepy(1)), cap);
        assert_eq!(IoFuture::new(c, ()).wait().unwrap(), 16);
        assert_eq!(
            pool.stats().threads,
            1,
            "at the cap a pool still gets its first thread only"
        );
        let roomy = DevicePool::new("test-roomy".into(), 3);
        let c = Completion::new(0, 16, 16);
        roomy.submit(req(tasks(16), Arc::clone(&c), sleepy(1)), usize::MAX);
        assert_eq!(IoFuture::new(c, ()).wait().unwrap(), 16);
        assert_eq!(
            roomy.stats().threads,
            3,
            "below the cap a pool grows to its size"
        );
    }

    #[test]
    fn the_first_error_cancels_tasks_not_started() {
        let pool = DevicePool::new("test-cancel".into(), 1);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        let run: Box<TaskFn> = Box::new(move |_, t| {
            r.fetch_add(1, Ordering::SeqCst);
            if t.offset == 3 {
                Err(crate::Error::InvalidArgument("task 3 fails".into()))
            } else {
                Ok(1)
            }
        });
        let c = Completion::new(0, 100, 100);
        pool.submit(req(tasks(100), Arc::clone(&c), run), usize::MAX);
        let e = IoFuture::new(c, ()).wait().unwrap_err();
        assert!(e.to_string().contains("task 3 fails"), "{e}");
        assert!(
            ran.load(Ordering::SeqCst) < 100,
            "tasks after the error were cancelled"
        );
        let s = pool.stats();
        assert_eq!(s.queued, 0, "cancelled tasks left the queue");
    }

    /// A task function that counts itself in `arrived` and succeeds once `all` tasks have
    /// arrived, or fails after 10 s: it passes only where that many tasks run at once.
    fn meets(arrived: &Arc<AtomicUsize>, all: usize) -> Box<TaskFn> {
        let arrived = Arc::clone(arrived);
        Box::new(move |_, _| {
            arrived.fetch_add(1, Ordering::SeqCst);
            let t0 = Instant::now();
            while arrived.load(Ordering::SeqCst) < all {
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err(crate::Error::InvalidArgument(format!(
                        "{} of {all} tasks ran at once",
                        arrived.load(Ordering::SeqCst)
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(1)
        })
    }

    #[test]
    fn single_task_requests_from_several_callers_run_at_once() {
        // Four callers, one task each: the pool grew by each request's own task count (one),
        // so all four waited for its first thread in turn.
        let pool = DevicePool::new("test-single-tasks".into(), 4);
        let arrived = Arc::new(AtomicUsize::new(0));
        let futs: Vec<_> = (0..4)
            .map(|_| {
                let c = Completion::new(0, 1, 1);
                pool.submit(req(tasks(1), Arc::clone(&c), meets(&arrived, 4)), usize::MAX);
                IoFuture::new(c, ())
            })
            .collect();
        assert_eq!(wait_all(futs).unwrap(), 4);
        assert_eq!(pool.stats().threads, 4);
        // One more while the four threads are idle again: no fifth thread (the pool's size).
        let c = Completion::new(0, 1, 1);
        pool.submit(req(tasks(1), Arc::clone(&c), sleepy(1)), usize::MAX);
        assert_eq!(IoFuture::new(c, ()).wait().unwrap(), 1);
        assert_eq!(pool.stats().threads, 4);
    }

    #[test]
    fn a_request_queued_behind_a_running_task_gets_a_thread_of_its_own() {
        let pool = DevicePool::new("test-behind-running".into(), 2);
        let arrived = Arc::new(AtomicUsize::new(0));
        let first = Completion::new(0, 1, 1);
        pool.submit(req(tasks(1), Arc::clone(&first), meets(&arrived, 2)), usize::MAX);
        // Wait until the first task runs (nothing queued then), then queue the second.
        while arrived.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let second = Completion::new(0, 1, 1);
        pool.submit(req(tasks(1), Arc::clone(&second), meets(&arrived, 2)), usize::MAX);
        assert_eq!(
            wait_all(vec![IoFuture::new(first, ()), IoFuture::new(second, ())]).unwrap(),
            2
        );
    }

    #[test]
    fn a_capped_request_never_runs_more_tasks_at_once_and_others_still_run() {
        let pool = DevicePool::new("test-capped".into(), 4);
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n2, p2) = (Arc::clone(&now), Arc::clone(&peak));
        let run: Box<TaskFn> = Box::new(move |_, _| {
            let cur = n2.fetch_add(1, Ordering::SeqCst) + 1;
            p2.fetch_max(cur, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            n2.fetch_sub(1, Ordering::SeqCst);
            Ok(1)
        });
        let capped = Completion::new(0, 40, 40);
        let mut r = req(tasks(40), Arc::clone(&capped), run);
        r.max_active = 2;
        pool.submit(r, usize::MAX);
        // An uncapped request queued behind it gets the other threads meanwhile.
        let other = Completion::new(0, 8, 8);
        pool.submit(req(tasks(8), Arc::clone(&other), sleepy(2)), usize::MAX);
        let other_fut = IoFuture::new(other, ());
        assert_eq!(other_fut.wait().unwrap(), 8);
        let capped_fut = IoFuture::new(capped, ());
        assert!(
            !capped_fut.is_done(),
            "the uncapped request waited for the capped one"
        );
        assert_eq!(capped_fut.wait().unwrap(), 40);
        assert_eq!(peak.load(Ordering::SeqCst), 2, "cap of 2 in flight");
    }

    /// A task function that leaves work running under `key`: settling it sleeps `ms`, counts
    /// itself in `settles` and fails if `fail`.
    fn leaves_running(key: u64, ms: u64, settles: &Arc<AtomicUsize>, fail: bool) -> Box<TaskFn> {
        let settles = Arc::clone(settles);
        Box::new(move |w, _| {
            let settles = Arc::clone(&settles);
            w.leave_running(
                key,
                Box::new(move || {
                    std::thread::sleep(Duration::from_millis(ms));
                    settles.fetch_add(1, Ordering::SeqCst);
                    if fail {
                        Err(crate::Error::InvalidArgument("the copies failed".into()))
                    } else {
                        Ok(())
                    }
                }),
            );
            Ok(1)
        })
    }

    #[test]
    fn work_left_running_is_settled_once_per_run_of_tasks_and_before_completion() {
        let pool = DevicePool::new("test-settle".into(), 1);
        let settles = Arc::new(AtomicUsize::new(0));
        let c = Completion::new(0, 10, 10);
        pool.submit(
            req(
                tasks(10),
                Arc::clone(&c),
                leaves_running(7, 30, &settles, false),
            ),
            usize::MAX,
        );
        assert_eq!(IoFuture::new(c, ()).wait().unwrap(), 10);
        assert_eq!(
            settles.load(Ordering::SeqCst),
            1,
            "one worker, ten tasks of one request: one wait at the end, none between tasks"
        );
        // Settling failed: the request fails with that error, though every task returned Ok.
        let c = Completion::new(0, 3, 3);
        pool.submit(
            req(
                tasks(3),
                Arc::clone(&c),
                leaves_running(7, 1, &settles, true),
            ),
            usize::MAX,
        );
        let e = IoFuture::new(c, ()).wait().unwrap_err();
        assert!(e.to_string().contains("the copies failed"), "{e}");
    }

    #[test]
    fn a_worker_settles_before_it_runs_another_request() {
        let pool = DevicePool::new("test-settle-switch".into(), 1);
        let settles = Arc::new(AtomicUsize::new(0));
        let first = Completion::new(0, 1, 1);
        let run = leaves_running(1, 1, &settles, false);
        let slow_task: Box<TaskFn> = Box::new(move |w, t| {
            std::thread::sleep(Duration::from_millis(30));
            run(w, t)
        });
        pool.submit(req(tasks(1), Arc::clone(&first), slow_task), usize::MAX);
        // Queued while the first request's task runs: the worker takes it next.
        let second = Completion::new(0, 1, 1);
        pool.submit(req(tasks(1), Arc::clone(&second), sleepy(500)), usize::MAX);
        let first_fut = IoFuture::new(first, ());
        assert!(
            first_fut.wait_timeout(Duration::from_millis(400)),
            "the first request waited for the second one's task"
        );
        assert_eq!(first_fut.wait().unwrap(), 1);
        assert_eq!(IoFuture::new(second, ()).wait().unwrap(), 1);
        assert_eq!(settles.load(Ordering::SeqCst), 1);
    }

    /// Requests whose tasks leave work on the same ring (key 1) and say when the work left
    /// before them is done: a worker moving between them settles only at the end, and the first
    /// request completes once the second's task has said so, not when that task ends.
    #[test]
    fn requests_on_one_ring_need_no_settling_between_them() {
        let pool = DevicePool::new("test-settle-ring".into(), 1);
        let settles = Arc::new(AtomicUsize::new(0));
        let ring_task = |ms_before: u64, ms_after: u64| -> Box<TaskFn> {
            let run = leaves_running(1, 1, &settles, false);
            Box::new(move |w, t| {
                std::thread::sleep(Duration::from_millis(ms_before));
                w.earlier_work_done(1);
                std::thread::sleep(Duration::from_millis(ms_after));
                run(w, t)
            })
        };
        let first = Completion::new(0, 1, 1);
        let mut r = req(tasks(1), Arc::clone(&first), ring_task(30, 0));
        r.leaves_running = Some(1);
        pool.submit(r, usize::MAX);
        // Queued while the first request's task runs: the worker takes it next.
        let second = Completion::new(0, 1, 1);
        let mut r = req(tasks(1), Arc::clone(&second), ring_task(0, 500));
        r.leaves_running = Some(1);
        pool.submit(r, usize::MAX);
        let first_fut = IoFuture::new(first, ());
        assert!(
            first_fut.wait_timeout(Duration::from_millis(400)),
            "the first request waited for the end of the second one's task"
        );
        assert_eq!(first_fut.wait().unwrap(), 1);
        assert_eq!(settles.load(Ordering::SeqCst), 0, "no settling between the requests");
        assert_eq!(IoFuture::new(second, ()).wait().unwrap(), 1);
        assert_eq!(settles.load(Ordering::SeqCst), 1, "one settle, at the end");

        // Work left under another key too: the report waits for the settle, as before.
        let settles_other = Arc::new(AtomicUsize::new(0));
        let other = leaves_running(2, 1, &settles_other, false);
        let third = Completion::new(0, 1, 1);
        let both: Box<TaskFn> = Box::new(move |w, t| {
            std::thread::sleep(Duration::from_millis(30));
            other(w, t)
        });
        pool.submit(req(tasks(1), Arc::clone(&third), both), usize::MAX);
        let fourth = Completion::new(0, 1, 1);
        let mut r = req(tasks(1), Arc::clone(&fourth), ring_task(0, 100));
        r.leaves_running = Some(1);
        pool.submit(r, usize::MAX);
        assert_eq!(IoFuture::new(third, ()).wait().unwrap(), 1);
        assert_eq!(
            settles_other.load(Ordering::SeqCst),
            1,
            "the request was reported before its work under key 2 was settled"
        );
        assert_eq!(IoFuture::new(fourth, ()).wait().unwrap(), 1);
    }

    /// Tasks of one request that leave work on a ring are not reported early: only a move to
    /// another request without settling makes `earlier_work_done` report (reporting at every
    /// task cost a single 8 GiB file ~1.5% on the H200; benchmarks/RESULTS.md, session 20).
    #[test]
    fn tasks_of_one_request_wait_for_the_settle() {
        let pool = DevicePool::new("test-one-ring".into(), 1);
        let settles = Arc::new(AtomicUsize::new(0));
        let waiting = Arc::new(AtomicUsize::new(usize::MAX));
        let run = leaves_running(1, 1, &settles, false);
        let seen = Arc::clone(&waiting);
        let done = Completion::new(0, 2, 2);
        let task: Box<TaskFn> = Box::new(move |w, t| {
            w.earlier_work_done(1);
            if t.offset == 1 {
                seen.store(w.unsettled.tasks.len(), Ordering::SeqCst);
            }
            run(w, t)
        });
        let mut r = req(tasks(2), Arc::clone(&done), task);
        r.leaves_running = Some(1);
        pool.submit(r, usize::MAX);
        assert_eq!(IoFuture::new(done, ()).wait().unwrap(), 2);
        assert_eq!(
            waiting.load(Ordering::SeqCst),
            1,
            "the first task was reported before the settle"
        );
        assert_eq!(settles.load(Ordering::SeqCst), 1, "one settle, at the end");
    }

    #[test]
    fn a_pool_resized_down_ends_its_surplus_threads() {
        let pool = DevicePool::new("test-shrink".into(), 4);
        let c = Completion::new(0, 16, 16);
        pool.submit(req(tasks(16), Arc::clone(&c), sleepy(2)), usize::MAX);
        assert_eq!(IoFuture::new(c, ()).wait().unwrap(), 16);
        assert_eq!(pool.stats().threads, 4);
        pool.max_threads.store(1, Ordering::Relaxed);
        pool.ready.notify_all();
        let t0 = std::time::Instant::now();
        while pool.stats().threads > 1 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(pool.stats().threads, 1);
        // The one left still works.
        let c = Completion::new(0, 4, 4);
        pool.submit(req(tasks(4), Arc::clone(&c), sleepy(1)), usize::MAX);
        assert_eq!(IoFuture::new(c, ()).wait().unwrap(), 4);
    }
}
