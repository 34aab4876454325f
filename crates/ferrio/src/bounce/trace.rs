//! The opt-in timeline of GPU transfers (`FERRIO_TRACE=1`): when each worker got its first task,
//! made its ring's stream, pinned each buffer, read its first chunks and started its first
//! copies, and how long it waited for the copy engine; for remote reads, when each GET task first
//! ran, its waits for the store's permit and for its first byte, and its body, and, into GPU
//! memory, the copies' stream, each wait for a pinned piece, and the copies; and, on the thread
//! that makes ring memory ahead, whether CUDA had started (`ahead-check`, 1 if so) and the
//! slab's faulting (`ahead-made`) —
//! so one run on a GPU machine shows where a fresh process's first read loses time.
//!
//! Off (the variable unset, empty or `0`), every call is one load of a cached flag. On, events
//! go to a process-wide list and are written to standard error when the process exits, one line
//! each, sorted by start:
//!
//! ```text
//! ferrio-trace <start s> <duration ms> <thread> <what> <bytes or count>
//! ```
//!
//! Start times are `CLOCK_MONOTONIC` seconds, the clock of Python's `time.monotonic()`, so a
//! benchmark can place its own marks among them. This file knows nothing of rings or files.

use std::sync::{Mutex, OnceLock};

/// One thing that happened on one thread.
#[derive(Debug, Clone, Copy)]
struct Event {
    start_ns: u64,
    duration_ns: u64,
    thread: u64,
    what: &'static str,
    amount: u64,
}

/// Events recorded so far (only while tracing is on).
static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

thread_local! {
    /// The kernel's id of this thread, asked once.
    static THREAD: u64 = thread_id();
}

/// Whether `FERRIO_TRACE` asks for the timeline (read once; the dump at exit is registered then).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        // Any value but an empty one or a "no" of the settings' (`0`, `off`, `false`, `no`).
        let on = std::env::var("FERRIO_TRACE")
            .is_ok_and(|v| !v.is_empty() && crate::config::parse_bool(&v) != Some(false));
        if on {
            // SAFETY: `dump_at_exit` is an `extern "C" fn()` that never unwinds (it only writes
            // to stderr and ignores every error), as `atexit` requires.
            unsafe { libc::atexit(dump_at_exit) };
        }
        on
    })
}

/// The time now, for [`record`]: `CLOCK_MONOTONIC` nanoseconds, or 0 while tracing is off.
pub(crate) fn start() -> u64 {
    if enabled() {
        now_ns()
    } else {
        0
    }
}

/// Records `what` on the calling thread, from `start` (from [`start`]) to now, with an amount
/// (bytes, or a count). Nothing while tracing is off.
pub(crate) fn record(what: &'static str, start: u64, amount: u64) {
    if !enabled() {
        return;
    }
    let end = now_ns();
    let event = Event {
        start_ns: start,
        duration_ns: end.saturating_sub(start),
        thread: THREAD.with(|t| *t),
        what,
        amount,
    };
    if let Ok(mut events) = EVENTS.lock() {
        events.push(event);
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

fn thread_id() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    u64::try_from(unsafe { libc::gettid() }).unwrap_or(0)
}

/// The timeline as text, one line per event, sorted by start.
fn render(events: &mut [Event]) -> String {
    use std::fmt::Write;
    events.sort_by_key(|e| e.start_ns);
    let mut out = String::new();
    for e in events.iter() {
        let _ = writeln!(
            out,
            "ferrio-trace {}.{:09} {:.3} {} {} {}",
            e.start_ns / 1_000_000_000,
            e.start_ns % 1_000_000_000,
            e.duration_ns as f64 / 1e6,
            e.thread,
            e.what,
            e.amount
        );
    }
    out
}

extern "C" fn dump_at_exit() {
    use std::io::Write;
    // `try_lock`: a thread stopped mid-record at exit must not hang the exit.
    let Ok(mut events) = EVENTS.try_lock() else {
        return;
    };
    let text = render(&mut events);
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_sorted_and_parseable() {
        let mut events = vec![
            Event {
                start_ns: 2_500_000_000,
                duration_ns: 1_250_000,
                thread: 7,
                what: "pin",
                amount: 4096,
            },
            Event {
                start_ns: 1_000_000_123,
                duration_ns: 0,
                thread: 3,
                what: "request",
                amount: 8,
            },
        ];
        let text = render(&mut events);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "ferrio-trace 1.000000123 0.000 3 request 8",
                "ferrio-trace 2.500000000 1.250 7 pin 4096",
            ]
        );
    }
}
