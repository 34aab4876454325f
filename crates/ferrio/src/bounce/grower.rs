//! The one background thread that pins bounce buffers for rings growing in the background
//! ([`Settings::bounce_grow_in_background`](crate::Settings::bounce_grow_in_background)).
//!
//! One thread for the process, because the driver pins one allocation at a time anyway: a single
//! thread working through the rings' requests in order delays a worker's own first buffer by at
//! most one allocation, where a thread per ring would queue every ring's later buffers ahead of
//! the last workers' first ones. The thread starts on first use and lives for the process; a
//! forked child starts its own (the parent's thread is not in the child). This file knows
//! nothing of rings: it runs closures in order.

use std::sync::mpsc;
use std::sync::Mutex;

/// Work for the thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// The thread's queue and the process that started it.
static QUEUE: Mutex<Option<(u32, mpsc::Sender<Job>)>> = Mutex::new(None);

/// Runs `job` on the background thread, after the jobs before it; gives the job back when no
/// thread could be started, so the caller can do the work itself.
pub(super) fn submit(job: Job) -> Result<(), Job> {
    let pid = crate::sys::process_id();
    let Ok(mut queue) = QUEUE.lock() else {
        return Err(job);
    };
    if let Some((owner, sender)) = queue.as_ref() {
        if *owner == pid {
            return match sender.send(job) {
                Ok(()) => Ok(()),
                Err(mpsc::SendError(job)) => Err(job),
            };
        }
    }
    let (sender, jobs) = mpsc::channel::<Job>();
    let started = std::thread::Builder::new()
        .name("ferrio-pin".into())
        .spawn(move || {
            for job in jobs {
                job();
            }
        });
    if started.is_err() {
        return Err(job);
    }
    let sent = sender.send(job);
    *queue = Some((pid, sender));
    sent.map_err(|mpsc::SendError(job)| job)
}
