//! Ctrl-C: a `SIGINT` handler that only raises a flag, installed for the length of one
//! [`crate::run`] and taken down afterwards, so that a process embedding the command line (the
//! Python console script, `ferrio._native.cli_main`) gets its own handler back.
//!
//! Long loops poll [`interrupted`] between steps, clean up, and end with [`Interrupted`]
//! (exit status 130). The `ctrlc` crate was not used: it cannot remove its handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a wait looks at the Ctrl-C flag: well under the few tenths of a second a person
/// notices.
pub(crate) const POLL: Duration = Duration::from_millis(25);

/// The user pressed Ctrl-C (exit status 130).
#[derive(Debug)]
pub(crate) struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether Ctrl-C was pressed; long loops check this between steps and clean up.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
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

extern "C" fn on_sigint(_signal: libc::c_int) {
    // An atomic store is async-signal-safe; nothing else happens in the handler.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Our `SIGINT` handler while it lives; the previous disposition comes back when it is dropped.
pub(crate) struct CtrlC {
    previous: Option<libc::sigaction>,
}

impl CtrlC {
    /// Clears the flag and installs the handler. If the handler cannot be installed the command
    /// still runs (Ctrl-C then does what it did before).
    pub(crate) fn install() -> CtrlC {
        INTERRUPTED.store(false, Ordering::Relaxed);
        // SAFETY: an all-zero `sigaction` is a valid value (empty mask, no flags) for the fields
        // set below to complete.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // Interrupted syscalls restart: the flag is polled, so no call needs to see EINTR.
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: `action.sa_mask` is a valid sigset_t owned by this frame.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: as above, zeroed memory is a valid `sigaction` for the kernel to fill.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers refer to live, initialised `sigaction` values; the handler only
        // stores to an atomic, which is async-signal-safe.
        let installed = unsafe { libc::sigaction(libc::SIGINT, &action, &mut previous) } == 0;
        CtrlC {
            previous: installed.then_some(previous),
        }
    }
}

impl Drop for CtrlC {
    fn drop(&mut self) {
        if let Some(previous) = &self.previous {
            // SAFETY: `previous` is the disposition the kernel gave back at install, still valid
            // (a handler of the embedding process, or SIG_DFL/SIG_IGN).
            unsafe { libc::sigaction(libc::SIGINT, previous, std::ptr::null_mut()) };
        }
    }
}
