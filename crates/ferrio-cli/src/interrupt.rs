//! Ctrl-C, `SIGTERM` and `SIGHUP`: a handler that only notes the signal, installed for the length of one
//! [`crate::run`] and taken down afterwards, so that a process embedding the command line (the
//! Python console script, `ferrio._native.cli_main`) gets its own handlers back.
//!
//! Long loops poll [`interrupted`] between steps, clean up, and end with [`Interrupted`]
//! (exit status 128 + the signal: 130 for Ctrl-C, 143 for `SIGTERM`, 129 for `SIGHUP`, as a
//! shell reports a process the signal killed). `SIGTERM` is what `kill`, `timeout` and service
//! managers send, `SIGHUP` what a closed terminal or a dropped SSH session sends: left to kill
//! the process, either would leave a copy's temporary file, a half-written file or an upload's
//! parts. A signal the process was started ignoring (`nohup`, a shell's background job) stays
//! ignored.
//! The `ctrlc` crate was not used: it cannot remove its handler.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// How often a wait looks at the Ctrl-C flag: well under the few tenths of a second a person
/// notices.
pub(crate) const POLL: Duration = Duration::from_millis(25);

/// The user pressed Ctrl-C or the process was sent `SIGTERM` (exit status 128 + the signal, see
/// [`exit_status`]).
#[derive(Debug)]
pub(crate) struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// The signal that stopped the command (one of [`SIGNALS`]), or 0 while none came.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signals that stop a command cleanly.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Whether Ctrl-C was pressed (or `SIGTERM` came); long loops check this between steps and
/// clean up.
pub(crate) fn interrupted() -> bool {
    SIGNAL.load(Ordering::Relaxed) != 0
}

/// The message and exit status for an [`Interrupted`] command: `interrupted` and 130 after
/// Ctrl-C, `terminated` and 143 after `SIGTERM`, `hung up` and 129 after `SIGHUP`.
pub(crate) fn exit_status() -> (&'static str, i32) {
    match SIGNAL.load(Ordering::Relaxed) {
        libc::SIGTERM => ("terminated", 128 + libc::SIGTERM),
        libc::SIGHUP => ("hung up", 128 + libc::SIGHUP),
        _ => ("interrupted", 128 + libc::SIGINT),
    }
}

/// Fails with [`Interrupted`] if Ctrl-C was pressed.
pub(crate) fn check_interrupt() -> anyhow::Result<()> {
    if interrupted() {
        Err(Interrupted.into())
    } else {
        Ok(())
    }
}

/// Waits for `fut` while watching for Ctrl-C: on Ctrl-C, cancels it (running tasks finish, the
/// others never start) and fails with [`Interrupted`]. The caller then cancels whatever else it
/// has in flight; dropping a future waits for it.
pub(crate) fn wait_polled<B>(fut: &ferrio::IoFuture<B>) -> anyhow::Result<()> {
    while !fut.wait_timeout(POLL) {
        if interrupted() {
            fut.cancel();
            return Err(Interrupted.into());
        }
    }
    Ok(())
}

extern "C" fn on_signal(signal: libc::c_int) {
    // An atomic store is async-signal-safe; nothing else happens in the handler. The first
    // signal is kept: it is the one the command stops for.
    let _ = SIGNAL.compare_exchange(0, signal, Ordering::Relaxed, Ordering::Relaxed);
}

/// Our handler of [`SIGNALS`] while it lives; the previous dispositions come back when
/// it is dropped.
pub(crate) struct CtrlC {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl CtrlC {
    /// Clears the flag and installs the handler. If the handler cannot be installed the command
    /// still runs (the signal then does what it did before).
    pub(crate) fn install() -> CtrlC {
        SIGNAL.store(0, Ordering::Relaxed);
        // SAFETY: an all-zero `sigaction` is a valid value (empty mask, no flags) for the fields
        // set below to complete.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // Interrupted syscalls restart: the flag is polled, so no call needs to see EINTR.
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: `action.sa_mask` is a valid sigset_t owned by this frame.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        let mut previous = Vec::with_capacity(SIGNALS.len());
        for signal in SIGNALS {
            // SAFETY: as above, zeroed memory is a valid `sigaction` for the kernel to fill.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // Asked first: a signal ignored from the start (`nohup`) is left ignored, with no
            // moment in which our handler would catch it.
            // SAFETY: a null new action only reads the disposition into the live `old`.
            if unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) } != 0
                || old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            // SAFETY: `action` is a live, initialised `sigaction`; the handler only stores to
            // an atomic, which is async-signal-safe.
            if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } == 0 {
                previous.push((signal, old));
            }
        }
        CtrlC { previous }
    }
}

impl Drop for CtrlC {
    fn drop(&mut self) {
        for (signal, previous) in &self.previous {
            // SAFETY: `previous` is the disposition the kernel gave back at install, still valid
            // (a handler of the embedding process, or SIG_DFL/SIG_IGN).
            unsafe { libc::sigaction(*signal, previous, std::ptr::null_mut()) };
        }
    }
}
