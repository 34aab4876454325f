//! Objects in remote storage (S3, Google Cloud Storage, Azure Blob, plain HTTP(S)) read in
//! parallel into host or GPU memory: [`RemoteFile`]; new objects written by multipart upload:
//! [`RemoteWriter`] (`write.rs`).
//!
//! A remote object is another *source* for the same destinations as a [`crate::File`]: a read
//! is planned into even ranges (an equal share per GET in flight, between
//! [`Settings::remote_range_size`] and [`Settings::remote_max_range_size`]), shared by as many
//! GETs as the store lets run (`share.rs`: each takes range after range, and at the end free
//! GETs take over the second halves of slow ones), which run on one tokio runtime inside the
//! library (`runtime.rs`), at most [`Settings::remote_concurrency`] at once per store (all
//! objects of one bucket, container or server share the cap: `store::in_flight_cap`); each
//! body lands directly at its place in the caller's memory, and the same [`IoFuture`] reports
//! the outcome. For GPU memory each body fills pinned pieces of the context's `PiecePool`
//! (`bounce/pieces.rs`) instead, one after another, and one thread copies each piece to its
//! place in device memory as soon as it is full, in any order, then gives it back once that
//! copy has completed: the bytes are copied on the host once, from the body into pinned memory,
//! as for a host read (the pool and its copies live in `bounce/`, which knows no source). A
//! streamed read ([`RemoteFile::read_to`]) hands each piece of each body to a sink instead: how
//! a body lands is `fetch.rs`'s `Landing`. The object's size and version
//! (ETag, version id, or where a server gives no ETag its Last-Modified time) are fixed at open
//! and every range is conditional on them (`fetch.rs`).
//!
//! This module touches no file descriptor and no worker pool; `store.rs` is the only file that
//! knows store kinds and their configuration.

mod fetch;
mod list;
mod runtime;
mod share;
mod store;
mod write;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use tokio::sync::Semaphore;

use crate::bounce::{self, trace, CopyEngine, Piece, PieceCopies, PiecePool};
use crate::buffer::IoBufMut;
use crate::config::Settings;
use crate::cuda::{self, DevicePtr};
use crate::error::{Error, Result};
use crate::plan::{self, Task};
use crate::pool::{Completion, IoFuture};

use fetch::Landing;
use share::{Next, Share, Shares};

pub(crate) use list::{
    as_prefix, can_list, encode_key_part, holds_objects, is_plain_name, list_prefix_until,
    names_a_store_only,
};
pub use list::{list_prefix, ListedObject};
pub use runtime::{reserve_sockets, reserve_sockets_soon};
pub use store::{file_url_path, is_remote_url, redacted, unsupported_url_scheme};
pub(crate) use write::check_writable;
pub use write::{copy_in_store, RemoteWriter, WriteCanceller, MAX_PARTS, MIN_PART_SIZE};

/// How long a GET with nothing to take waits before it looks again for a range in flight worth
/// splitting (`share.rs`): short against any range worth splitting, which has more than twice
/// a reply's wait left to run.
const STEAL_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Bytes every remote read of this process has received so far.
static BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Bytes received by the remote reads of this process so far, all objects together: progress for
/// a caller that reads remote objects (worker pools' statistics do not include them).
pub fn bytes_read() -> u64 {
    BYTES_READ.load(Ordering::Relaxed)
}

fn count_read(n: u64) {
    BYTES_READ.fetch_add(n, Ordering::Relaxed);
}

/// An object in remote storage, open for reading.
///
/// Open with [`RemoteFile::open`] from a URL: `s3://bucket/key`, `gs://bucket/key`,
/// `az://container/key` (or `abfs://`), `http(s)://host/path`. Credentials and endpoints come
/// from the environment as each store's own tools read them (`AWS_ACCESS_KEY_ID`,
/// `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`,
/// ...); without credentials the requests are unsigned (public objects).
///
/// The size and version are read once, at open: a read of an object replaced since fails with
/// an error naming the URL, and never returns a mix of versions. (A plain HTTP server that gives
/// neither an ETag nor a Last-Modified time leaves only the size to check.) Reads past the end
/// are short, as with `pread`. Cheap to clone (clones share the store connection and the
/// concurrency cap).
///
/// The blocking calls ([`RemoteFile::read_at`], [`IoFuture::wait`]) must not be made from
/// inside an async task of another tokio runtime's worker thread.
#[derive(Clone)]
pub struct RemoteFile {
    inner: Arc<Inner>,
}

struct Inner {
    url: Arc<str>,
    location: store::Location,
    len: u64,
    /// What every read is conditional on: the ETag and version id at open, and where the store
    /// gave no ETag, the Last-Modified time (`fetch::conditions`).
    conditions: GetOptions,
    settings: Settings,
    /// Whether the server ignores `Range` (found at open where that asks with a GET, else by
    /// the first read's GETs), so that one GET of a read streams the whole object and a read
    /// is planned as one range ([`fetch::Pinned::whole`]).
    whole: Arc<AtomicBool>,
    /// The process that built them, the store, and the cap on ranges in flight this object
    /// shares with the other objects of its store: a forked child builds its own, since the
    /// parent's connections belong to the parent's runtime and its permits to its tasks.
    store: Mutex<Connection>,
}

/// What a process needs to talk to an object's store.
struct Connection {
    pid: u32,
    store: Arc<dyn ObjectStore>,
    in_flight: Arc<Semaphore>,
}

impl fmt::Debug for RemoteFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteFile")
            .field("url", &self.inner.url)
            .field("len", &self.inner.len)
            .field("e_tag", &self.inner.conditions.if_match)
            .field("version", &self.inner.conditions.version)
            .field(
                "unmodified_since",
                &self.inner.conditions.if_unmodified_since,
            )
            .finish()
    }
}

impl RemoteFile {
    /// Opens the object at `url` with the settings in force ([`Settings::current`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed or unsupported URL; [`Error::Open`] when the
    /// object cannot be found (kind `NotFound`), may not be read (`PermissionDenied`) or the
    /// store cannot be reached.
    pub fn open(url: &str) -> Result<RemoteFile> {
        RemoteFile::open_with(url, Settings::current())
    }

    /// Opens the object at `url` with `settings` (see [`RemoteFile::open`]).
    ///
    /// # Errors
    /// As for [`RemoteFile::open`].
    pub fn open_with(url: &str, settings: Settings) -> Result<RemoteFile> {
        RemoteFile::open_until(url, settings, &|| false)
    }

    /// [`RemoteFile::open_with`], given up as soon as `cancelled()` turns true
    /// ([`Error::Cancelled`]): a store slow to answer must not hold up a Ctrl-C.
    pub(crate) fn open_until(
        url: &str,
        settings: Settings,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<RemoteFile> {
        let location = store::parse(url)?;
        let store = store::build_with(&location, &settings)?;
        let handle = runtime::handle()?;
        let open_err = |source| Error::Open {
            path: url.into(),
            mode: "r".into(),
            source,
        };
        let (meta, whole) = handle
            .block_on(runtime::unless_cancelled(
                async {
                    if location.signed {
                        return head_by_get(store.as_ref(), &location.path).await;
                    }
                    match store.head(&location.path).await {
                        Ok(meta) => Ok((meta, false)),
                        // A web server that refuses HEAD or answers it without a Content-Length
                        // is asked with a GET instead. object_store reads a 405 as a missing
                        // object (as WebDAV directories answer), so a missing one is asked too.
                        // One that did not answer at all is not asked again.
                        Err(e)
                            if location.scheme == object_store::ObjectStoreScheme::Http
                                && (matches!(e, object_store::Error::NotFound { .. })
                                    || !(is_refusal(&e) || store::no_answer(&e))) =>
                        {
                            head_by_get(store.as_ref(), &location.path).await.or(Err(e))
                        }
                        Err(e) => Err(e),
                    }
                },
                cancelled,
            ))
            .ok_or(Error::Cancelled)?
            .map_err(|e| open_err(store::io_error(e)))?;
        Ok(RemoteFile::with_meta(
            url,
            location,
            store,
            (meta.size, whole),
            fetch::conditions(&meta),
            settings,
        ))
    }

    /// Opens an object found by [`list_prefix`] from what the listing said (size, ETag,
    /// version), without asking the store again: a copy of many small objects saves a request
    /// per object. Reads are conditional on the listed ETag and version as on a HEAD's, so an
    /// object replaced since the listing is an error, never a mix. Azure lists ETags in another
    /// form than its headers give them (unquoted), so its objects are opened as by
    /// [`RemoteFile::open_with`].
    ///
    /// # Errors
    /// As for [`RemoteFile::open`], except that a missing object is found by the first read.
    pub(crate) fn open_listed(object: &ListedObject, settings: Settings) -> Result<RemoteFile> {
        let location = store::parse(&object.url)?;
        if location.scheme == object_store::ObjectStoreScheme::MicrosoftAzure {
            return RemoteFile::open_with(&object.url, settings);
        }
        let store = store::build_with(&location, &settings)?;
        let conditions = GetOptions {
            if_match: object.e_tag.clone(),
            version: object.version.clone(),
            ..GetOptions::default()
        };
        Ok(RemoteFile::with_meta(
            &object.url,
            location,
            store,
            (object.size, false),
            conditions,
            settings,
        ))
    }

    /// A remote file of `location` in `store`, of `len` bytes, whose reads are conditional on
    /// `conditions`; `whole`: its server ignores `Range`.
    fn with_meta(
        url: &str,
        location: store::Location,
        store: Arc<dyn ObjectStore>,
        (len, whole): (u64, bool),
        conditions: GetOptions,
        settings: Settings,
    ) -> RemoteFile {
        let in_flight = store::in_flight_cap(&location, &settings);
        RemoteFile {
            inner: Arc::new(Inner {
                url: url.into(),
                location,
                len,
                conditions,
                settings,
                whole: Arc::new(AtomicBool::new(whole)),
                store: Mutex::new(Connection {
                    pid: crate::sys::process_id(),
                    store,
                    in_flight,
                }),
            }),
        }
    }

    /// The URL the object was opened with.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The object's size in bytes, as it was at open.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the object was empty at open.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The object's ETag at open, if the store gave one; every read is conditional on it.
    pub fn e_tag(&self) -> Option<&str> {
        self.inner.conditions.if_match.as_deref()
    }

    /// The object's version id at open, if the store keeps versions.
    pub fn version(&self) -> Option<&str> {
        self.inner.conditions.version.as_deref()
    }

    /// The store and in-flight cap for this process: those of the open, or new ones in a
    /// forked child.
    fn pinned(&self) -> Result<(fetch::Pinned, Arc<Semaphore>)> {
        let pid = crate::sys::process_id();
        let (location, settings) = (&self.inner.location, &self.inner.settings);
        // Only ever replaced whole, so a poisoned lock still holds a valid value.
        let mut slot = self.inner.store.lock().unwrap_or_else(|p| p.into_inner());
        if slot.pid != pid {
            *slot = Connection {
                pid,
                store: store::build_with(location, settings)?,
                in_flight: store::in_flight_cap(location, settings),
            };
        }
        let pinned = fetch::Pinned {
            store: slot.store.clone(),
            path: location.path.clone(),
            url: self.inner.url.clone(),
            len: self.inner.len,
            conditions: self.inner.conditions.clone(),
            retries: settings.remote_retries,
            retry_timeout: settings.remote_retry_timeout,
            whole: self.inner.whole.clone(),
        };
        Ok((pinned, slot.in_flight.clone()))
    }

    /// Bytes of `[offset, offset+len)` that lie inside the object.
    fn available(&self, offset: u64, len: usize) -> usize {
        self.inner.len.saturating_sub(offset).min(len as u64) as usize
    }

    /// The ranged GETs of a read of `len` bytes at `offset`: even shares of the read among the
    /// GETs in flight, each between [`Settings::remote_range_size`] and
    /// [`Settings::remote_max_range_size`] long (the last takes what is left). Each GET waits
    /// once for its first byte, so long ones waste less of a connection's time; the GETs that
    /// end last are split by free ones (`share.rs`), so the read does not wait for them. From a
    /// server that ignores `Range`, one range: its one GET streams the object from its start.
    fn ranges(&self, offset: u64, len: usize) -> Vec<Task> {
        if self.reads_whole() {
            return vec![Task::at_buffer_start(offset, len)];
        }
        let s = &self.inner.settings;
        let share = (len as u64).div_ceil(s.remote_concurrency.max(1) as u64);
        let size = share.clamp(
            s.remote_range_size.max(1),
            s.remote_max_range_size.max(s.remote_range_size).max(1),
        );
        plan::split_guided(offset, len, size, size, 1, 1)
    }

    /// Reads `buf.io_len()` bytes at `offset` into `buf` with parallel ranged GETs; the future
    /// owns the buffer until it is done ([`IoFuture::into_buffer`] gives it back).
    pub fn pread<B: IoBufMut>(&self, mut buf: B, offset: u64) -> IoFuture<B> {
        let (ptr, len) = (buf.io_ptr_mut(), buf.io_len());
        // SAFETY: `IoBufMut` keeps `ptr..ptr+len` valid and in place while `buf` lives, and the
        // future owns `buf` until every range has landed.
        IoFuture::started(unsafe { self.start_read(ptr, len, offset) }, buf)
    }

    /// Reads `len` bytes at `offset` into memory at `ptr` with parallel ranged GETs.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes, and nothing else may access that memory,
    /// until the returned future has been waited on or dropped. The future must not be leaked.
    pub unsafe fn pread_raw(&self, ptr: *mut u8, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        IoFuture::started(unsafe { self.start_read(ptr, len, offset) }, ())
    }

    /// Reads into `buf` at `offset` with parallel ranged GETs and waits. Returns the bytes read:
    /// fewer than `buf.len()` only past the object's end.
    ///
    /// # Errors
    /// [`Error::Io`] naming the URL: the object changed since open, the store failed after its
    /// retries, or a body broke off too often.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        // SAFETY: `buf` is exclusively borrowed for this call and the future is waited on
        // (or dropped, which waits) before the borrow ends.
        unsafe { self.pread_raw(buf.as_mut_ptr(), buf.len(), offset) }.wait()
    }

    /// Reads the whole object into a new vector.
    ///
    /// # Errors
    /// As for [`RemoteFile::read_at`].
    pub fn read_all(&self) -> Result<Vec<u8>> {
        let len = usize::try_from(self.inner.len)
            .map_err(|_| Error::InvalidArgument(format!("{} is too large", self.inner.url)))?;
        let mut buf = vec![0u8; len];
        let n = self.read_at(&mut buf, 0)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Reads `len` bytes at `offset` with parallel ranged GETs and hands each piece of each body
    /// to `sink` as it arrives, with the object offset of its first byte: in order within a GET,
    /// in any order across GETs, on the threads of ferrio's runtime: `sink` should not wait
    /// long (a write to a local file is fine). Nothing is buffered past the HTTP client's pieces,
    /// so an object of any size streams through, every GET in flight (a download writes each
    /// piece to its place in a file). The future's outcome is the bytes handed over (fewer only
    /// past the object's end), the first error (`sink`'s included; the GETs in flight are then
    /// dropped), or [`Error::Cancelled`]; [`IoFuture::bytes`] counts what was handed over so far.
    pub fn read_to<S>(&self, offset: u64, len: usize, sink: S) -> IoFuture
    where
        S: Fn(u64, &[u8]) -> Result<()> + Send + Sync + 'static,
    {
        let sink = Arc::new(sink);
        let started = self.start_gets(offset, len, move |_| IntoSink(sink.clone()));
        IoFuture::started(started, ())
    }

    /// Whether the server ignores `Range`, so that reads ask for the whole object.
    fn reads_whole(&self) -> bool {
        self.inner.whole.load(Ordering::Relaxed)
    }

    /// The shares of a read of the object's bytes `offset..offset+n` (all inside it): its
    /// ranges ([`RemoteFile::ranges`]), and the halves of slow ones that GETs take over at the
    /// end (`share.rs`).
    fn shares(&self, offset: u64, n: usize) -> Arc<Shares> {
        let ranges = self.ranges(offset, n);
        // Halves of at least an eighth of a range (1 MiB at the defaults): the time a range
        // has left, not its bytes, decides whether splitting it pays (`share.rs`).
        let min_split = self.inner.settings.remote_range_size / 4;
        Shares::new(
            ranges.iter().map(|t| t.offset..t.offset + t.len as u64),
            min_split,
        )
    }

    /// GETs in flight for one read: the store's cap, or fewer for a read of fewer ranges.
    fn gets_for(&self, shares: &Shares) -> usize {
        self.inner
            .settings
            .remote_concurrency
            .max(1)
            .min(shares.planned())
    }

    /// Plans the ranged GETs of a host read and spawns them on the runtime: as many GETs as the
    /// store lets run, each a task that takes range after range (`share.rs`) and lands each
    /// body where the landing `land_for(share)` says.
    fn start_gets<L, F>(&self, offset: u64, len: usize, land_for: F) -> Result<Arc<Completion>>
    where
        L: Landing + 'static,
        F: Fn(&Share) -> L + Send + Sync + 'static,
    {
        offset
            .checked_add(len as u64)
            .ok_or_else(|| Error::InvalidArgument("range wraps around".into()))?;
        let n = self.available(offset, len);
        // One task for the whole read: its GETs report to it, and it reports the read.
        let task = Task {
            offset,
            len,
            buf_offset: 0,
        };
        let completion = Completion::new(offset, len, 1);
        if n == 0 {
            completion.finish_task(&task, Some(Ok(0)));
            return Ok(completion);
        }
        let handle = runtime::handle()?;
        let counted = completion.clone();
        let mut gets = self.spawn_gets(&handle, offset, n, &completion, move |share| Counted {
            inner: land_for(share),
            completion: counted.clone(),
        })?;
        let done = completion.clone();
        handle.spawn(async move {
            // The read reports only once every GET task has ended, so none writes to the
            // caller's memory (or sink) after it: the first error cancels the others.
            let mut failed = None;
            while let Some(got) = gets.next().await {
                match got {
                    Ok(()) => {}
                    Err(Error::Cancelled) if done.is_cancelled() => {}
                    Err(e) => {
                        done.cancel();
                        failed.get_or_insert(e);
                    }
                }
            }
            let outcome = match failed {
                Some(e) => Some(Err(e)),
                None if done.is_cancelled() => None,
                None => Some(Ok(n)),
            };
            done.finish_task(&task, outcome);
        });
        Ok(completion)
    }

    /// Spawns the GET tasks of a read of the object's bytes `offset..offset+n` (all inside it)
    /// on the runtime: as many as the store lets run, each taking range after range
    /// (`share.rs`) and landing each body where `land_for(share)` says. A cancel of
    /// `completion` (the caller's, or one set on the first error) drops the GET in flight
    /// inside its own task, so once a task has ended it lands nothing more: what landed stays
    /// where it is, and the task's outcome is [`Error::Cancelled`].
    fn spawn_gets<L, F>(
        &self,
        handle: &tokio::runtime::Handle,
        offset: u64,
        n: usize,
        completion: &Arc<Completion>,
        land_for: F,
    ) -> Result<futures::stream::FuturesUnordered<runtime::AbortOnDrop<()>>>
    where
        L: Landing + 'static,
        F: Fn(&Share) -> L + Send + Sync + 'static,
    {
        let (pinned, in_flight) = self.pinned()?;
        let shares = self.shares(offset, n);
        let land_for = Arc::new(land_for);
        // Whether one of the GETs reads the whole object from a server that ignores `Range`.
        let streaming = Arc::new(AtomicBool::new(false));
        let gets = (0..self.gets_for(&shares)).map(|_| {
            let (pinned, in_flight) = (pinned.clone(), in_flight.clone());
            let (shares, land_for) = (shares.clone(), land_for.clone());
            let streaming = streaming.clone();
            let cancel = completion.clone();
            // Each GET is a task of its own, so that the runtime's threads share the work of
            // receiving the bodies. The store's permit (GPU and host reads share the cap), then
            // the request.
            let spawned = trace::start();
            let gets = async move {
                // From the spawn to the task's first run.
                trace::record("get-task", spawned, 0);
                let mut body = None;
                let mut streamer = false;
                while let Some((share, _permit)) = next_share(&shares, &in_flight, streamer).await {
                    if !pinned.whole.load(Ordering::Relaxed)
                        && matches!(
                            pinned.fetch(&share, &mut land_for(&share)).await?,
                            fetch::Fetched::Landed
                        )
                    {
                        continue;
                    }
                    // The server ignores `Range`: every GET gives its range back, and one of
                    // them then takes the ranges in order (those of GETs still waiting for a
                    // reply too) and streams the whole object once, landing each from it; the
                    // others stop.
                    if !streamer {
                        share.give_back();
                        if streaming.swap(true, Ordering::Relaxed) {
                            break;
                        }
                        streamer = true;
                        continue;
                    }
                    pinned
                        .fetch_whole(&share, &mut land_for(&share), &mut body)
                        .await?;
                }
                Ok(())
            };
            runtime::AbortOnDrop(handle.spawn(async move {
                runtime::unless_cancelled(gets, || cancel.is_cancelled())
                    .await
                    .unwrap_or(Err(Error::Cancelled))
            }))
        });
        Ok(gets.collect())
    }

    /// Plans the ranged GETs of a read into host memory at `ptr` and spawns them.
    ///
    /// # Safety
    /// As [`RemoteFile::pread_raw`].
    unsafe fn start_read(&self, ptr: *mut u8, len: usize, offset: u64) -> Result<Arc<Completion>> {
        let ptr = SendPtr(ptr);
        self.start_gets(offset, len, move |_| IntoMemory {
            read: SendPtr(ptr.get()),
            offset,
            len,
        })
    }

    /// Reads `len` bytes at `offset` into GPU memory at `dst`: ranged GETs (up to
    /// [`Settings::remote_concurrency`] at once) land in pinned host memory, and each range is
    /// copied to its place in device memory as soon as it has landed, in whatever order the
    /// ranges finish. Fails with [`Error::CudaUnavailable`] without a driver and
    /// [`Error::InvalidArgument`] when `dst` is not device memory.
    ///
    /// # Safety
    /// `dst..dst+len` must be device (or managed) memory that stays allocated, and that nothing
    /// else writes, until the returned future has been waited on or dropped. The future must not
    /// be leaked.
    pub unsafe fn pread_device(&self, dst: DevicePtr, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        IoFuture::started(unsafe { self.start_device(dst, len, offset) }, ())
    }

    #[cfg(any(test, feature = "testing"))]
    /// [`RemoteFile::pread_device`] through the pieces of `pool` and its engine (in tests, the
    /// emulated device), without asking the driver what `dst` is.
    ///
    /// # Safety
    /// As for `pread_device`, with `dst..dst+len` device memory of `pool`'s engine.
    pub unsafe fn pread_device_with<E>(
        &self,
        pool: &Arc<PiecePool<E>>,
        dst: DevicePtr,
        len: usize,
        offset: u64,
    ) -> IoFuture
    where
        E: CopyEngine + Send + Sync + 'static,
        E::Event: Send,
        E::Stream: Send,
    {
        // SAFETY: forwarded from this function's contract.
        let started = unsafe { self.start_pieces(dst, len, offset, || Ok(pool.clone())) };
        IoFuture::started(started, ())
    }

    /// # Safety
    /// As [`RemoteFile::pread_device`].
    unsafe fn start_device(
        &self,
        dst: DevicePtr,
        len: usize,
        offset: u64,
    ) -> Result<Arc<Completion>> {
        let pool = || {
            let context = cuda::device_context(dst, "use the host-memory calls for it")?;
            let settings = &self.inner.settings;
            // Pieces of a bounce buffer's size, whatever the ranges: a GET holds one while its
            // body trickles in and hands it over full, so a short piece holds less pinned
            // memory per GET and the first read pins less before its copies start.
            let piece_len = usize::try_from(settings.bounce_buffer_bytes()).unwrap_or(usize::MAX);
            bounce::cuda_piece_pool(context, piece_len, settings)
        };
        // SAFETY: forwarded from this function's contract; the pool is that of `dst`'s context.
        unsafe { self.start_pieces(dst, len, offset, pool) }
    }

    /// Starts a device read of the object's bytes in `offset..offset+len` (some inside it)
    /// through the pieces of the pool `pool()` gives, asked for only when there is something to
    /// read (a read of nothing needs no driver): ranged GETs, each a task of the runtime, take a
    /// piece once their body comes, fill it and hand it over as soon as it is full (a long range
    /// fills several, one at a time); one blocking thread copies each piece to its place in
    /// device memory and gives it back to the pool once that copy has completed.
    ///
    /// # Safety
    /// As [`RemoteFile::pread_device`], with `dst..dst+len` device memory of the pool's engine.
    unsafe fn start_pieces<E>(
        &self,
        dst: DevicePtr,
        len: usize,
        offset: u64,
        pool: impl FnOnce() -> Result<Arc<PiecePool<E>>>,
    ) -> Result<Arc<Completion>>
    where
        E: CopyEngine + Send + Sync + 'static,
        E::Event: Send,
        E::Stream: Send,
    {
        let n = self.available(offset, len);
        if n == 0 {
            return Ok(Completion::new(offset, 0, 0));
        }
        if dst.checked_add(len).is_none() {
            return Err(Error::InvalidArgument("device range wraps around".into()));
        }
        let pool = pool()?;
        let handle = runtime::handle()?;
        // One task for the whole transfer: the GETs supply the parallelism.
        let task = Task {
            offset,
            len,
            buf_offset: 0,
        };
        let completion = Completion::new(offset, len, 1);
        let ahead = self.inner.settings.remote_concurrency.max(1);
        // Pinned memory stays near `ahead` pieces (GETs filling, pieces handed over, copies
        // running), kept in the pool for the next read; a GET holds at most one piece at a time,
        // and takes one only once its body comes, so that pieces are held while bodies arrive,
        // not while the server thinks (the first read pins its pieces meanwhile: `prefill`). No
        // circle: a GET holding a piece waits for nothing but its body, and a landed piece goes
        // back once copied.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<(Task, Piece<E>)>>(ahead);
        let landing = PieceLanding {
            read_offset: offset,
            pool: pool.clone(),
            most: ahead,
            landed: tx.clone(),
        };
        let mut gets =
            self.spawn_gets(&handle, offset, n, &completion, move |_| landing.for_get())?;
        // Each GET fills one piece at a time: pin that many while the requests go out.
        let prefill = pool.prefill(gets.len().min(n.div_ceil(pool.piece_len())), &handle);
        let cancelled = completion.clone();
        handle.spawn(async move {
            while let Some(got) = gets.next().await {
                match got {
                    Err(Error::Cancelled) if cancelled.is_cancelled() => {}
                    // The first error stops the copies, which report it and so cancel the
                    // other GETs; their pieces go back as they stop.
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                    }
                    Ok(()) => {}
                }
            }
        });
        let done = completion.clone();
        handle.spawn_blocking(move || {
            // SAFETY: `dst..dst+n` is the caller's device memory of the pool's engine, valid and
            // unwritten by others until the future resolves, which is after this reports.
            let outcome = unsafe { copy_landed(&pool, &mut rx, dst, &done) };
            // Ranges still in the channel go back to the pool before the read reports, and this
            // read lets go of the pool before then too, its prefill included (a caller may drop
            // it and count its pinned memory as freed).
            drop(rx);
            drop(prefill);
            drop(pool);
            // A cancelled transfer is skipped, not failed (as a cancelled host read is).
            let outcome = match outcome {
                Err(Error::Cancelled) => None,
                other => Some(other),
            };
            done.finish_task(&task, outcome);
        });
        Ok(completion)
    }
}

/// The next range for one of a read's GETs, with the store's permit to fetch it (held while
/// the GET runs); `None` once nothing is left for this GET. While a range in flight may yet be
/// worth splitting it looks again every [`STEAL_POLL`], holding no permit in between. `for_all`:
/// the ranges in order, whole ([`Shares::take`]).
async fn next_share<'s>(
    shares: &Arc<Shares>,
    in_flight: &'s Semaphore,
    for_all: bool,
) -> Option<(Share, Option<tokio::sync::SemaphorePermit<'s>>)> {
    loop {
        // The cap is never closed; were it, the GETs would run uncapped rather than stop.
        let waited = trace::start();
        let permit = in_flight.acquire().await.ok();
        trace::record("permit", waited, 0);
        match shares.take(for_all) {
            Next::Range(share) => return Some((share, permit)),
            Next::Later => {
                drop(permit);
                tokio::time::sleep(STEAL_POLL).await;
            }
            Next::Done => return None,
        }
    }
}

/// The consumer of a device read ([`RemoteFile::start_pieces`]): copies each range that landed
/// to `dst` plus its place in the read, as ranges arrive, and gives each piece back once its
/// copy has completed. Returns the bytes copied once the GETs have stopped and every copy has
/// completed; the first error (a GET's, a copy's) or a cancel stops it, after the copies already
/// started have completed.
///
/// # Safety
/// `dst` plus the extent of every range handed over must be device memory of `pool`'s engine,
/// valid and written by nothing else until this returns.
unsafe fn copy_landed<E: CopyEngine>(
    pool: &Arc<PiecePool<E>>,
    landed: &mut tokio::sync::mpsc::Receiver<Result<(Task, Piece<E>)>>,
    dst: DevicePtr,
    done: &Completion,
) -> Result<usize> {
    use tokio::sync::mpsc::error::TryRecvError;
    let started = trace::start();
    let copies = PieceCopies::new(pool);
    trace::record("copies", started, 0);
    let mut copies = copies?;
    let mut copied = 0usize;
    let stopped = loop {
        if done.is_cancelled() {
            break Err(Error::Cancelled);
        }
        let next = match landed.try_recv() {
            Ok(next) => Some(next),
            // Nothing new: give back the oldest piece (a GET may be waiting for one), then look
            // again; only with no copy running is there nothing to do but wait.
            Err(TryRecvError::Empty) if copies.in_flight() > 0 => {
                let waited = trace::start();
                let oldest = copies.wait_oldest();
                trace::record("copy-wait", waited, 0);
                match oldest {
                    Ok(()) => continue,
                    Err(e) => break Err(e),
                }
            }
            Err(TryRecvError::Empty) => {
                let waited = trace::start();
                let next = landed.blocking_recv();
                trace::record("copy-idle", waited, 0);
                next
            }
            Err(TryRecvError::Disconnected) => None,
        };
        match next {
            Some(Ok((range, piece))) => {
                // `buf_offset + len <= n <= len` of the read, checked not to wrap around.
                let at = DevicePtr(dst.0 + range.buf_offset as u64);
                let began = trace::start();
                // SAFETY: `at..at+range.len` lies in the caller's device memory (this function's
                // contract).
                let started = unsafe { copies.start_copy(piece, range.len, at) };
                trace::record("copy", began, range.len as u64);
                if let Err(e) = started.and_then(|()| copies.reclaim()) {
                    break Err(e);
                }
                copied += range.len;
            }
            Some(Err(e)) => break Err(e),
            // The GETs stopped: a cancel, or every range has landed.
            None if done.is_cancelled() => break Err(Error::Cancelled),
            None => break Ok(copied),
        }
    };
    // Report the first error, but only once no copy runs any more.
    let finished = copies.finish();
    stopped.and_then(|n| finished.map(|()| n))
}

/// A host read's GET: the body lands at its place in the caller's memory.
struct IntoMemory {
    /// The read's first byte, which holds the object's byte `offset`.
    read: SendPtr,
    offset: u64,
    /// The read's length.
    len: usize,
}

impl Landing for IntoMemory {
    fn land<'a>(
        &'a mut self,
        at: u64,
        bytes: &'a [u8],
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'a {
        // `fetch` hands over only bytes its share has claimed, which lie inside the read.
        let from = (at - self.offset) as usize;
        debug_assert!(from + bytes.len() <= self.len);
        // SAFETY: `from..from+len` lies in the read's memory and was claimed by this GET alone
        // (`Share::claim`: no two GETs claim a byte), and that memory stays valid and unaliased
        // until the request's future resolves, which is after every GET has stopped
        // (`pread_raw`'s contract).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.read.get().add(from), bytes.len());
        }
        std::future::ready(Ok(()))
    }
}

/// A streamed read's GET ([`RemoteFile::read_to`]): each piece of the body goes to the sink.
struct IntoSink<S>(Arc<S>);

impl<S: Fn(u64, &[u8]) -> Result<()> + Send + Sync> Landing for IntoSink<S> {
    fn land<'a>(
        &'a mut self,
        at: u64,
        bytes: &'a [u8],
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'a {
        // Called in place: `block_in_place` around each piece of a body doubled the CPU per GiB
        // and halved the rate (dev VM, `ferrio read URL`). A sink that waits briefly (a write
        // the kernel throttles) holds this thread only; the others take over its waiting GETs.
        std::future::ready((self.0)(at, bytes))
    }
}

/// A host GET's landing, counted for progress as the bytes come.
struct Counted<L> {
    inner: L,
    completion: Arc<Completion>,
}

impl<L: Landing> Landing for Counted<L> {
    fn land<'a>(
        &'a mut self,
        at: u64,
        bytes: &'a [u8],
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'a {
        count_read(bytes.len() as u64);
        self.completion.add_progress(bytes.len() as u64);
        self.inner.land(at, bytes)
    }
}

/// What every GET of a device read lands through ([`IntoPieces`]). Fields drop in order, here
/// and there: the pool (and a piece being filled) before the sender, since the copies end and
/// the read reports once the last sender is gone, and by then the read must hold no piece or
/// reference to the pool (a caller may drop the pool and count its pinned memory as freed).
struct PieceLanding<E: CopyEngine> {
    /// The object offset of the read's first byte (its place in device memory).
    read_offset: u64,
    pool: Arc<PiecePool<E>>,
    /// Most pieces the pool makes for this read ([`PiecePool::take`]).
    most: usize,
    landed: tokio::sync::mpsc::Sender<Result<(Task, Piece<E>)>>,
}

impl<E: CopyEngine> PieceLanding<E> {
    /// The landing of one GET.
    fn for_get(&self) -> IntoPieces<E> {
        IntoPieces {
            filling: None,
            to: PieceLanding {
                read_offset: self.read_offset,
                pool: self.pool.clone(),
                most: self.most,
                landed: self.landed.clone(),
            },
        }
    }
}

/// A device read's GET: the body fills pinned pieces taken as the bytes come, each handed to
/// the copies as soon as it is full or the GET's range has landed. Fields drop in order (see
/// [`PieceLanding`]): the piece being filled before the pool and the sender.
struct IntoPieces<E: CopyEngine> {
    /// The piece being filled, and what of the read it holds so far.
    filling: Option<(Task, Piece<E>)>,
    to: PieceLanding<E>,
}

impl<E: CopyEngine> IntoPieces<E> {
    /// Hands a piece over to the copies.
    async fn hand_over(&mut self, part: Task, piece: Piece<E>) -> Result<()> {
        let waited = trace::start();
        let sent = self.to.landed.send(Ok((part, piece))).await;
        trace::record("hand-over", waited, 0);
        if sent.is_err() {
            // The copies stopped (an error, a cancel).
            return Err(Error::Cancelled);
        }
        Ok(())
    }
}

impl<E> Landing for IntoPieces<E>
where
    E: CopyEngine + Send + Sync + 'static,
    E::Event: Send,
    E::Stream: Send,
{
    async fn land(&mut self, mut at: u64, mut bytes: &[u8]) -> Result<()> {
        count_read(bytes.len() as u64);
        while !bytes.is_empty() {
            let (mut part, mut piece) = match self.filling.take() {
                Some(filling) => filling,
                None => {
                    let waited = trace::start();
                    let piece = self.to.pool.take(self.to.most).await?;
                    trace::record("piece", waited, 0);
                    let part = Task {
                        offset: at,
                        len: 0,
                        buf_offset: (at - self.to.read_offset) as usize,
                    };
                    (part, piece)
                }
            };
            let room = &mut piece.bytes_mut()[part.len..];
            let n = room.len().min(bytes.len());
            room[..n].copy_from_slice(&bytes[..n]);
            part.len += n;
            at += n as u64;
            bytes = &bytes[n..];
            if part.len < piece.bytes_mut().len() {
                self.filling = Some((part, piece));
            } else {
                self.hand_over(part, piece).await?;
            }
        }
        Ok(())
    }

    async fn range_done(&mut self) -> Result<()> {
        match self.filling.take() {
            Some((part, piece)) => self.hand_over(part, piece).await,
            None => Ok(()),
        }
    }
}

/// A pointer into the caller's memory, sent to the runtime task that fills its slice.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);

impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

// SAFETY: each pointer addresses a slice that exactly one task writes, and the caller keeps the
// memory valid and unaliased until the request's future resolves (`pread_raw`'s contract).
unsafe impl Send for SendPtr {}

// SAFETY: shared only to be copied into each task's own `IntoMemory` (see `Send`).
unsafe impl Sync for SendPtr {}

/// What a HEAD would say of the object at `path`, asked with a GET of the first byte (the size
/// comes from the `Content-Range` of the answer), and whether the server ignores `Range`. Where
/// that GET fails otherwise than by a refusal or no answer at all (an empty object answers it
/// with 416), or the server sent the whole object, a GET of the whole object, whose body is dropped unread. For
/// signed URLs, which are signed for GET alone, and web servers whose HEAD does not say the
/// size.
async fn head_by_get(
    store: &dyn ObjectStore,
    path: &Path,
) -> object_store::Result<(ObjectMeta, bool)> {
    let first = GetOptions {
        range: Some(GetRange::Bounded(0..1)),
        ..GetOptions::default()
    };
    match store.get_opts(path, first).await {
        Ok(got) => Ok((got.meta, false)),
        Err(e) if is_refusal(&e) || store::no_answer(&e) => Err(e),
        Err(e) => {
            let whole = store::ignores_range(&e);
            Ok((
                store.get_opts(path, GetOptions::default()).await?.meta,
                whole,
            ))
        }
    }
}

/// Whether the store said no to the object itself (missing, denied): asking another way
/// would get the same answer.
fn is_refusal(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
    )
}
