//! Which process is running: the id of the calling process, cheap enough to check on every
//! request, so that state built by a parent (worker pools, their threads) is never used by a
//! forked child. This module only tells processes apart; what to rebuild in a child is the
//! caller's business.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The id of this process, or 0 before the first call. A child's copy is corrected by the fork
/// handler before `fork` returns in the child, so no thread of the child ever reads the parent's.
static PID: AtomicU32 = AtomicU32::new(0);

/// The id of the calling process.
///
/// glibc no longer caches `getpid`, so every call would be a syscall; this reads a copy kept
/// current by a `pthread_atfork` child handler instead (one atomic load). A process created with
/// a raw `clone` that skips the fork handlers keeps its parent's id here: such a child must not
/// use state the parent built.
pub fn process_id() -> u32 {
    match PID.load(Ordering::Acquire) {
        0 => first_process_id(),
        pid => pid,
    }
}

fn first_process_id() -> u32 {
    // Whether the fork handler is registered: never waited on (a `Once` run by a parent thread
    // at the moment of a fork would block the child forever), so a thread that loses the race
    // asks the kernel this time.
    static REGISTERING: AtomicBool = AtomicBool::new(false);
    if REGISTERING
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        // SAFETY: `refresh_after_fork` is a plain `extern "C"` function that lives as long as
        // the process; it only calls `getpid` and stores an atomic, both async-signal-safe, as a
        // handler run in a freshly forked child must be.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(refresh_after_fork)) };
        if rc == 0 {
            // Set only once the handler is in place, so every fork from now on corrects the
            // child's copy. Without a handler (ENOMEM) it stays 0: the kernel is asked each time.
            PID.store(getpid(), Ordering::Release);
        }
    }
    match PID.load(Ordering::Acquire) {
        0 => getpid(),
        pid => pid,
    }
}

extern "C" fn refresh_after_fork() {
    PID.store(getpid(), Ordering::Release);
}

fn getpid() -> u32 {
    // SAFETY: getpid(2) takes no arguments and cannot fail.
    (unsafe { libc::getpid() }) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_this_process() {
        assert_eq!(process_id(), std::process::id());
        assert_eq!(process_id(), std::process::id());
    }
}
