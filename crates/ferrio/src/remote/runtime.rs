//! The one tokio runtime that drives every remote store of a process (object_store is async;
//! ferrio's API is blocking or future-based, so the runtime stays inside the library).
//!
//! Created on first use and per process: a child forked after the parent built one finds the
//! parent's entry (its threads do not exist in the child), leaves it alone and builds its own.
//! This file owns nothing else: stores, ranges and buffers are the other files' concern.

use std::sync::{Arc, Mutex};

use tokio::runtime::{Builder, Handle, Runtime};

use crate::error::{Error, Result};

/// The runtime of the process that built it.
static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// Most threads the runtime gets: they wait on sockets and copy bodies into buffers; a few keep
/// up with a fast network, and more would take cores from the caller.
const MAX_THREADS: usize = 8;

/// Descriptors the process's table holds before the runtime's threads start: a read's GETs
/// open up to `remote_concurrency` sockets at once (64 by default), and a table that grows
/// under them stalls every one of them for an RCU grace period ([`reserve_sockets`]). 1024
/// slots cost the kernel 8 KiB and cover several reads at the default concurrency.
const SOCKET_SLOTS: u32 = 1024;

/// Grows the process's descriptor table now to room for the sockets of remote reads (1024
/// descriptors, as far as `RLIMIT_NOFILE` allows), so that the first read's connections need
/// not wait for it to grow.
///
/// In a process of several threads each growth of the table waits for an RCU grace period
/// (9-25 ms measured), and every thread opening a descriptor waits with it: when 64 GETs open
/// their sockets at once in a process whose GPU library already holds dozens of descriptors,
/// half of them started 5-40 ms late. With one thread a growth costs nothing, so call this
/// early, before other libraries start threads ([`reserve_sockets_soon`] does it then, and in
/// the background otherwise); ferrio calls it anyway before its remote runtime's threads
/// start. Cheap once the table is large.
pub fn reserve_sockets() {
    crate::sys::reserve_descriptors(SOCKET_SLOTS);
}

/// [`reserve_sockets`] now if this process has one thread, when it costs nothing; with more
/// (a library imported earlier may have started a pool: numpy's BLAS does), on a short-lived
/// thread of its own that waits out the grace period in the background, so the caller never
/// waits and a remote read made later finds the table grown. Only a thread opening a
/// descriptor beyond the table's old size meanwhile waits for it. The Python package calls
/// this on import.
pub fn reserve_sockets_soon() {
    if crate::sys::thread_count() == Some(1) {
        reserve_sockets();
    } else {
        // Best effort, as the reservation itself: without a thread the first read does it.
        let _ = std::thread::Builder::new()
            .name("ferrio-reserve".into())
            .spawn(reserve_sockets);
    }
}

/// A handle to this process's runtime, built on first use.
///
/// # Errors
/// [`Error::InvalidArgument`] if the runtime's threads cannot be started.
pub(crate) fn handle() -> Result<Handle> {
    let pid = crate::sys::process_id();
    // Only ever replaced whole, so a poisoned lock still holds a valid value.
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(rt.handle().clone());
        }
    }
    if let Some((_, inherited)) = slot.take() {
        // The parent's runtime: dropping it would join threads this process does not have.
        std::mem::forget(inherited);
    }
    // Before the runtime's threads exist: a process of one thread grows its table for free.
    reserve_sockets();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, MAX_THREADS);
    let rt = Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("ferrio-remote")
        .enable_all()
        .build()
        .map_err(|e| {
            Error::InvalidArgument(format!("cannot start the remote-storage runtime: {e}"))
        })?;
    let rt = Arc::new(rt);
    let handle = rt.handle().clone();
    *slot = Some((pid, rt));
    Ok(handle)
}

/// How often a request in flight looks at its cancel flag: well under what a person notices
/// after Ctrl-C.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// A spawned task that is aborted when this handle is dropped (a plain `JoinHandle` detaches it,
/// so a cancelled read would leave its GETs running); awaiting it gives the task's output, or
/// [`Error::Cancelled`] if it was aborted or panicked.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<Result<T>>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = Result<T>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|joined| joined.unwrap_or_else(|_| Err(Error::Cancelled)))
    }
}

/// Runs `work` until it ends or `cancelled()` turns true; `None` when cancelled. Dropping
/// `work` drops its HTTP request, so a cancel stops a GET or a part upload in flight instead of
/// waiting for it to finish or time out.
pub(crate) async fn unless_cancelled<F: std::future::Future>(
    work: F,
    cancelled: impl Fn() -> bool,
) -> Option<F::Output> {
    if cancelled() {
        return None;
    }
    let watch = async {
        while !cancelled() {
            tokio::time::sleep(CANCEL_POLL).await;
        }
    };
    futures::pin_mut!(work);
    futures::pin_mut!(watch);
    match futures::future::select(work, watch).await {
        futures::future::Either::Left((out, _)) => Some(out),
        futures::future::Either::Right(((), _)) => None,
    }
}
