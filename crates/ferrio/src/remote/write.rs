//! Writing a new object: [`RemoteWriter`], a multipart upload whose parts go up in parallel
//! while the caller keeps appending, completed only by [`RemoteWriter::close`]. Until then the
//! object does not exist for anyone: an error, a cancel or a writer dropped without `close`
//! aborts the upload (the store deletes the parts), so no partial object ever becomes visible.
//! An object that fits in one part is sent with one plain `PUT` at close instead.
//!
//! GPU memory is appended through a pinned bounce ring of the writer's own
//! ([`RemoteWriter::write_device`]): each device-to-host copy lands in a ring buffer and is
//! appended to the part being filled, so the host memory held is the ring and the parts, never a
//! host copy of the whole array.
//!
//! Also the server-side copy of an object within one store ([`copy_in_store`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::{MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreScheme, PutPayload};
use tokio::runtime::Handle;
use tokio::task::JoinSet;

use crate::bounce::{BounceRing, CopyEngine, CudaEngine, PinnedBudget};
use crate::config::Settings;
use crate::cuda::{self, DevicePtr};
use crate::error::{Error, Op, Result};

use super::{runtime, store};

/// Smallest part a multipart upload may have (but the last): S3's and GCS's limit.
pub const MIN_PART_SIZE: usize = 5 << 20;

/// Most parts one upload may have: S3's and GCS's limit (Azure takes 50,000 blocks).
pub const MAX_PARTS: usize = 10_000;

/// Largest part: Azure's largest block (4000 MiB; S3 and GCS take 5 GiB).
const MAX_PART_SIZE: usize = 4000 << 20;

/// Parts of each size before the part size doubles ([`part_size_after`]).
const PARTS_PER_SIZE: usize = 1_000;

/// The size of the part after `sent` parts of an upload whose first parts are `first` bytes:
/// `first` for the first 1,000 parts, doubling every 1,000 after, up to 4000 MiB. From the
/// default 8 MiB the 10,000 parts reach 7.8 TiB, beyond the stores' 5 TiB objects (4.9 TiB from
/// the smallest first parts, 5 MiB); an object of under 1,000 first parts is cut as before.
fn part_size_after(first: usize, sent: usize) -> usize {
    let doublings = u32::try_from(sent / PARTS_PER_SIZE)
        .unwrap_or(u32::MAX)
        .min(16);
    first.saturating_mul(1 << doublings).min(MAX_PART_SIZE)
}

/// Where the writer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Taking writes.
    Open,
    /// Completed: the object exists.
    Closed,
    /// Failed or aborted: the upload is gone and the object was not created.
    Aborted,
}

/// A new object in remote storage, written from start to end in successive appends.
///
/// Create one with [`RemoteWriter::create`] (`s3://`, `gs://`, `az://` URLs; `http(s)://` is
/// read-only). Bytes are cut into parts of [`Settings::remote_range_size`] (at least
/// [`MIN_PART_SIZE`], at most 4000 MiB, Azure's largest block) and up to [`Settings::remote_concurrency`] parts are uploaded at once while
/// [`RemoteWriter::write`] returns; a write blocks only while that many are in flight, so the
/// memory held is about `concurrency × part size`. After 1,000 parts the part size doubles, and
/// again every 1,000 parts (up to 4000 MiB), with proportionally fewer parts in flight: an
/// object of any size the stores take fits in their 10,000 parts ([`MAX_PARTS`]) with the same
/// memory held.
///
/// [`RemoteWriter::close`] waits for the parts and completes the upload: only then does the
/// object appear (replacing any object of that name whole). On any error, on
/// [`RemoteWriter::abort`], on a cancel, or when the writer is dropped without `close`, the upload
/// is aborted and no object is created.
///
/// The blocking calls must not be made from inside an async task of another tokio runtime.
pub struct RemoteWriter {
    url: Arc<str>,
    store: Arc<dyn ObjectStore>,
    path: Path,
    handle: Handle,
    /// Bytes of each of the first parts ([`part_size_after`]).
    first_part_size: usize,
    /// Parts handed to the upload so far.
    parts_sent: usize,
    concurrency: usize,
    /// Bytes not yet handed to a part.
    pending: Vec<u8>,
    /// Buffers of parts that have gone, for the next parts ([`PartBuffers`]).
    buffers: Arc<PartBuffers>,
    /// The multipart upload, started when the first part is full.
    upload: Option<Box<dyn MultipartUpload>>,
    /// What the destination held when the upload started (a `HEAD` sent alongside), to tell
    /// the object this upload completes from an older one ([`RemoteWriter::completed_anyway`]).
    found: Option<tokio::task::JoinHandle<object_store::Result<ObjectMeta>>>,
    /// Parts in flight.
    parts: JoinSet<object_store::Result<()>>,
    /// The sizes of the parts in flight, in the order sent.
    part_sizes: VecDeque<u64>,
    /// Bytes the store has acknowledged (see [`RemoteWriter::stored`]).
    stored: u64,
    written: u64,
    state: State,
    cancelled: Arc<AtomicBool>,
    external_cancel: Option<Box<dyn Fn() -> bool + Send + Sync>>,
    /// The process that started the upload: its runtime's threads, connections and parts
    /// exist only there, so a forked child may neither continue nor abort it.
    owner: u32,
    /// The bounce ring's sizes and pinning, for writes from GPU memory.
    bounce_buffer_size: usize,
    bounce_buffers: usize,
    pinned_memory: crate::config::PinnedMemory,
    /// The ring that GPU memory is staged through, made by the first such write and freed when
    /// the writer closes or aborts.
    device_ring: Option<DeviceRing>,
}

/// A bounce ring owned by one writer.
struct DeviceRing(BounceRing<CudaEngine>);

// SAFETY: the ring's pinned buffers, stream and events are driver objects that any thread may
// use; the ring is reached only through `&mut RemoteWriter`, so one thread uses it at a time,
// and each call binds the ring's context on the calling thread first.
unsafe impl Send for DeviceRing {}

impl std::fmt::Debug for RemoteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWriter")
            .field("url", &self.url)
            .field("written", &self.written)
            .field("state", &self.state)
            .finish()
    }
}

/// Stops a [`RemoteWriter`] from another thread: its blocked or next call aborts the upload.
#[derive(Debug, Clone)]
pub struct WriteCanceller(Arc<AtomicBool>);

impl WriteCanceller {
    /// Asks the writer to abort; parts in flight are dropped at once.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl RemoteWriter {
    /// Starts a new object at `url` with the settings in force ([`Settings::current`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed URL or a store that cannot be written
    /// (`http(s)://`). Nothing is sent yet: a missing bucket or a refused write shows at the
    /// first part or at close.
    pub fn create(url: &str) -> Result<RemoteWriter> {
        RemoteWriter::create_with(url, Settings::current())
    }

    /// Starts a new object at `url` with `settings` (see [`RemoteWriter::create`]).
    ///
    /// # Errors
    /// As for [`RemoteWriter::create`].
    pub fn create_with(url: &str, settings: Settings) -> Result<RemoteWriter> {
        let location = store::parse(url)?;
        refuse_read_only(url, &location)?;
        let store = store::build_with(&location, &settings)?;
        let first_part_size = usize::try_from(settings.remote_range_size)
            .unwrap_or(usize::MAX)
            .clamp(MIN_PART_SIZE, MAX_PART_SIZE);
        Ok(RemoteWriter {
            url: url.into(),
            store,
            path: location.path,
            handle: runtime::handle()?,
            first_part_size,
            parts_sent: 0,
            concurrency: settings.remote_concurrency.max(1),
            pending: Vec::new(),
            buffers: Arc::default(),
            upload: None,
            found: None,
            parts: JoinSet::new(),
            part_sizes: VecDeque::new(),
            stored: 0,
            written: 0,
            state: State::Open,
            cancelled: Arc::new(AtomicBool::new(false)),
            external_cancel: None,
            owner: crate::sys::process_id(),
            bounce_buffer_size: usize::try_from(settings.bounce_buffer_bytes())
                .unwrap_or(usize::MAX),
            bounce_buffers: settings.bounce_buffers,
            pinned_memory: settings.pinned_memory,
            device_ring: None,
        })
    }

    /// The URL the object is written to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Bytes written so far (the object's size once closed).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes the store has acknowledged so far, for progress: the parts whose uploads were
    /// seen to finish (counted in the order sent, as parts of one size finish in any order),
    /// and every byte once closed. Bytes buffered or in flight are in [`RemoteWriter::written`]
    /// only.
    pub fn stored(&self) -> u64 {
        self.stored
    }

    /// Bytes of the part being filled: [`Settings::remote_range_size`] for the first 1,000
    /// parts, then doubling every 1,000 (see [`RemoteWriter`]).
    pub fn part_size(&self) -> usize {
        part_size_after(self.first_part_size, self.parts_sent)
    }

    /// Whether appending `len` bytes fills the part being filled, so that the write may wait
    /// for room among the parts in flight (a smaller one only copies the bytes).
    pub fn fills_part(&self, len: usize) -> bool {
        self.pending.len().saturating_add(len) >= self.part_size()
    }

    /// Parts in flight at most: `concurrency` parts of the first size' worth of memory.
    fn parts_in_flight(&self) -> usize {
        let budget = self.concurrency.saturating_mul(self.first_part_size);
        (budget / self.part_size()).max(1)
    }

    /// Whether [`RemoteWriter::close`] completed the object.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// A handle that aborts this writer from another thread.
    pub fn canceller(&self) -> WriteCanceller {
        WriteCanceller(self.cancelled.clone())
    }

    /// Also treats the upload as cancelled whenever `cancelled()` is true (looked at while a
    /// call waits on the store, every few milliseconds).
    pub fn cancel_when(&mut self, cancelled: impl Fn() -> bool + Send + Sync + 'static) {
        self.external_cancel = Some(Box::new(cancelled));
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) || self.external_cancel.as_ref().is_some_and(|f| f())
    }

    fn error(&self, offset: u64, len: u64, source: std::io::Error) -> Error {
        // A write needs no object to exist: before any part was taken, what a store did not
        // find is the bucket (or the container) to put it in. (Later, the upload itself.)
        let nothing_taken = self.parts_sent == 0;
        let source = if source.kind() == std::io::ErrorKind::NotFound && nothing_taken {
            std::io::Error::new(source.kind(), "no such bucket or container to write into")
        } else {
            source
        };
        Error::Io {
            op: Op::Write,
            path: self.url.as_ref().into(),
            offset,
            len,
            source,
        }
    }

    /// Whether this is the process that started the upload (not a forked child).
    fn in_owner(&self) -> bool {
        crate::sys::process_id() == self.owner
    }

    /// Lets go of the upload without touching it: in a forked child the parts in flight and the
    /// upload belong to the parent (which still completes or aborts it), and its runtime has no
    /// threads here, so even dropping them could wait forever.
    fn forget(&mut self) {
        self.state = State::Aborted;
        // The ring's pinned memory and stream belong to the parent's CUDA context.
        std::mem::forget(self.device_ring.take());
        self.pending = Vec::new();
        std::mem::forget(std::mem::take(&mut self.parts));
        std::mem::forget(self.upload.take());
        std::mem::forget(self.found.take());
    }

    fn check_open(&self) -> Result<()> {
        if !self.in_owner() {
            return Err(Error::InvalidArgument(format!(
                "{}: this upload belongs to process {}; a forked child cannot write to it \
                 (open a new writer in the child)",
                self.url, self.owner
            )));
        }
        match self.state {
            State::Open => Ok(()),
            State::Closed => Err(Error::InvalidArgument(format!(
                "{}: the object is already complete",
                self.url
            ))),
            State::Aborted => Err(Error::InvalidArgument(format!(
                "{}: the upload was aborted after an error or a cancel; nothing was written",
                self.url
            ))),
        }
    }

    /// Appends `buf` to the object; returns `buf.len()`. Blocks while
    /// [`Settings::remote_concurrency`] parts are being uploaded.
    ///
    /// # Errors
    /// [`Error::Io`] naming the URL when a part failed (after the store's retries);
    /// [`Error::Cancelled`] after a cancel; [`Error::InvalidArgument`] after close or abort. Any
    /// error aborts the upload.
    pub fn write(&mut self, buf: &[u8]) -> Result<usize> {
        self.check_open()?;
        let mut rest = buf;
        while !rest.is_empty() {
            let part_size = self.part_size();
            if self.pending.capacity() == 0 {
                self.pending = self.buffers.take(part_size);
            }
            let take = (part_size - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            self.written += take as u64;
            if self.pending.len() == part_size {
                let part = std::mem::take(&mut self.pending);
                let sent = self.send_part(part);
                self.or_abort(sent)?;
            }
        }
        Ok(buf.len())
    }

    /// Appends `len` bytes of GPU memory at `src` to the object; returns `len`. The bytes are
    /// copied to the host through the writer's pinned bounce ring ([`Settings::bounce_buffers`]
    /// buffers of [`Settings::bounce_buffer_bytes`], made by the first such write) one buffer at
    /// a time, each appended to the part being filled, so no host copy of the whole range is
    /// made; parts go up as in [`RemoteWriter::write`]. Copies run on the ring's own stream:
    /// work on other streams that writes the memory must have finished.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without a driver; [`Error::InvalidArgument`] when `src` is not
    /// device memory; otherwise as [`RemoteWriter::write`]. Any error aborts the upload.
    ///
    /// # Safety
    /// `src..src+len` must be device (or managed) memory that stays allocated, and that nothing
    /// writes, until this call returns.
    pub unsafe fn write_device(&mut self, src: DevicePtr, len: usize) -> Result<usize> {
        self.check_open()?;
        if len == 0 {
            return Ok(0);
        }
        let context = cuda::device_context(src, "use write for host memory")?;
        if src.checked_add(len).is_none() {
            return Err(Error::InvalidArgument("device range wraps around".into()));
        }
        let mut ring = match self.device_ring.take() {
            Some(ring) if ring.0.engine().context() == context && !ring.0.is_poisoned() => ring,
            _ => DeviceRing(BounceRing::new(
                CudaEngine::new(context)?.pinning(self.pinned_memory),
                self.bounce_buffer_size,
                self.bounce_buffers,
                PinnedBudget::global().clone(),
            )?),
        };
        let appended = self.append_through(&mut ring.0, src, len);
        self.device_ring = Some(ring);
        appended
    }

    /// Appends device memory copied out through `ring`, buffer by buffer, to the parts.
    fn append_through<E: CopyEngine>(
        &mut self,
        ring: &mut BounceRing<E>,
        src: DevicePtr,
        len: usize,
    ) -> Result<usize> {
        let offset = self.written;
        let copied = ring.write_from_device(src, len, offset, &mut |chunk, at| {
            if self.pending.capacity() == 0 {
                // One allocation per part, of the size it will have: appends a bounce buffer at
                // a time neither reallocate nor leave slack in the part.
                let left = (len as u64 - (at - offset)) as usize;
                self.pending.reserve_exact(self.part_size().min(left));
            }
            self.write(chunk).map(|_| ())
        });
        self.or_abort(copied)
    }

    /// Writes `buf` at `offset`, which must be where the object ends so far
    /// ([`RemoteWriter::written`]): object storage takes appends only.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other offset (the upload stays open); else as
    /// [`RemoteWriter::write`].
    pub fn pwrite(&mut self, buf: &[u8], offset: u64) -> Result<usize> {
        self.check_open()?;
        if offset != self.written {
            return Err(Error::InvalidArgument(format!(
                "{}: an object is written from start to end; offset {offset} is not its end \
                 so far ({})",
                self.url, self.written
            )));
        }
        self.write(buf)
    }

    /// Runs `work` on the runtime, cut short by a cancel.
    fn block_on<T>(
        &self,
        work: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<T> {
        let cancelled = || self.is_cancelled();
        let offset = self.written;
        match self
            .handle
            .block_on(runtime::unless_cancelled(work, cancelled))
        {
            None => Err(Error::Cancelled),
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(self.error(offset, 0, store::io_error(e))),
        }
    }

    /// Hands a full part to the upload (starting it if this is the first), after waiting for
    /// room among the parts in flight.
    fn send_part(&mut self, part: Vec<u8>) -> Result<()> {
        if self.parts_sent >= MAX_PARTS {
            return Err(Error::InvalidArgument(format!(
                "{}: an upload may have at most {MAX_PARTS} parts; this object needs more \
                 (raise remote_range_size)",
                self.url
            )));
        }
        if self.upload.is_none() {
            let store = self.store.clone();
            let path = self.path.clone();
            let upload = self.block_on(async move { store.put_multipart(&path).await })?;
            self.upload = Some(upload);
            let (store, path) = (self.store.clone(), self.path.clone());
            self.found = Some(self.handle.spawn(async move { store.head(&path).await }));
        }
        self.wait_for_parts(self.parts_in_flight() - 1)?;
        let part = bytes::Bytes::from_owner(Recycled {
            buf: part,
            home: self.buffers.clone(),
            most: self.parts_in_flight() + 1,
        });
        if let Some(upload) = self.upload.as_mut() {
            self.part_sizes.push_back(part.len() as u64);
            let put = upload.put_part(PutPayload::from(part));
            self.parts.spawn_on(put, &self.handle);
        }
        self.parts_sent += 1;
        Ok(())
    }

    /// Waits until at most `left` parts are in flight; the first failed part is the error.
    fn wait_for_parts(&mut self, left: usize) -> Result<()> {
        while self.parts.len() > left {
            let mut parts = std::mem::take(&mut self.parts);
            let joined = self.block_on(async {
                match parts.join_next().await {
                    Some(Ok(put)) => put,
                    Some(Err(e)) => Err(object_store::Error::Generic {
                        store: "ferrio",
                        source: Box::new(e),
                    }),
                    None => Ok(()),
                }
            });
            self.parts = parts;
            joined?;
            self.stored += self.part_sizes.pop_front().unwrap_or(0);
        }
        Ok(())
    }

    /// Completes the object: the last part is sent, every part awaited and the upload completed
    /// (or, for an object of less than one part, the whole of it sent in one `PUT`). Returns
    /// the object's size.
    ///
    /// A completion whose answers were all lost (the store may have completed the object) is
    /// checked with a `HEAD`: an object of the size written that was not there when the upload
    /// started (another ETag) is this upload's, and the close succeeds.
    ///
    /// # Errors
    /// As [`RemoteWriter::write`]; the upload is aborted and no object is created. Where the
    /// completion got no answer and the store could not be asked again, the error says that
    /// whether the object exists is unknown.
    pub fn close(&mut self) -> Result<u64> {
        self.check_open()?;
        let done = self.complete();
        self.or_abort(done)?;
        self.stored = self.written;
        self.state = State::Closed;
        self.device_ring = None;
        Ok(self.written)
    }

    fn complete(&mut self) -> Result<()> {
        let last = std::mem::take(&mut self.pending);
        if self.upload.is_none() {
            let (store, path) = (self.store.clone(), self.path.clone());
            let put = async move { store.put(&path, PutPayload::from(last)).await };
            let cancelled = || self.is_cancelled();
            return match self
                .handle
                .block_on(runtime::unless_cancelled(put, cancelled))
            {
                None => Err(Error::Cancelled),
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => self.outcome_of_failed(e),
            };
        }
        if !last.is_empty() {
            self.send_part(last)?;
        }
        self.wait_for_parts(0)?;
        let mut upload = self.upload.take();
        let result = match upload.as_mut() {
            Some(u) => self.finish(u),
            None => Ok(()),
        };
        if result.is_err() {
            // Completion failed: the upload still exists, for `abort` to remove.
            self.upload = upload;
        }
        result
    }

    /// Completes the multipart upload; a failure is told apart as
    /// [`RemoteWriter::outcome_of_failed`] says.
    fn finish(&mut self, upload: &mut Box<dyn MultipartUpload>) -> Result<()> {
        let cancelled = || self.is_cancelled();
        match self
            .handle
            .block_on(runtime::unless_cancelled(upload.complete(), cancelled))
        {
            None => Err(Error::Cancelled),
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => self.outcome_of_failed(e),
        }
    }

    /// The outcome of the request that should have made the object (a completion, or the one
    /// `PUT` of a small object) when it failed with `error`: a refusal (denied, a failed
    /// precondition) is that error; an outcome left open (no answer, a 5xx to the last retry,
    /// the upload not found when asked again: the store may have made the object and lost every
    /// answer) is checked with a `HEAD` ([`RemoteWriter::completed_anyway`]).
    fn outcome_of_failed(&mut self, error: object_store::Error) -> Result<()> {
        use object_store::Error as E;
        let refused = matches!(
            error,
            E::PermissionDenied { .. }
                | E::Unauthenticated { .. }
                | E::Precondition { .. }
                | E::AlreadyExists { .. }
                | E::NotModified { .. }
        );
        let source = store::io_error(error);
        if refused {
            return Err(self.error(self.written, 0, source));
        }
        match self.completed_anyway() {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.error(self.written, 0, source)),
            Err(why) => Err(self.error(
                self.written,
                0,
                std::io::Error::new(
                    source.kind(),
                    format!(
                        "{source}; the store did not confirm the completion and {why}, so \
                         whether this upload's object now exists is unknown"
                    ),
                ),
            )),
        }
    }

    /// After a completion whose outcome is open: whether the object now under the name is this
    /// upload's, by a `HEAD`: of exactly the bytes written, with an ETag, another than the one
    /// the destination had when the upload started (or with none there then), and, for an S3
    /// multipart ETag (`"…-N"`), of as many parts as were sent. An error says why that cannot
    /// be told: the `HEAD` failed, or the object has no ETag, or what the destination held at
    /// the start is unknown (its `HEAD` failed or is still unanswered) while an object of the
    /// size written is there.
    fn completed_anyway(&mut self) -> std::result::Result<bool, &'static str> {
        use object_store::Error as E;
        // Some(None): nothing was there; Some(Some(tag)): an object with that ETag.
        let before = match self.found.take() {
            Some(found) if found.is_finished() => match self.handle.block_on(found) {
                Ok(Ok(meta)) => meta.e_tag.map(Some),
                Ok(Err(E::NotFound { .. })) => Some(None),
                _ => None,
            },
            Some(found) => {
                found.abort();
                None
            }
            None => None,
        };
        let (store, path) = (self.store.clone(), self.path.clone());
        let cancelled = || self.is_cancelled();
        let head = async move { store.head(&path).await };
        let meta = match self
            .handle
            .block_on(runtime::unless_cancelled(head, cancelled))
        {
            Some(Ok(meta)) => meta,
            Some(Err(E::NotFound { .. })) => return Ok(false),
            None | Some(Err(_)) => return Err("could not be asked whether the object exists"),
        };
        if meta.size != self.written {
            return Ok(false);
        }
        let Some(tag) = meta.e_tag.as_deref() else {
            return Err("gives the object of the size written no ETag to tell it by");
        };
        match before {
            Some(Some(old)) if old == tag => Ok(false),
            Some(_) => Ok(parts_agree(tag, self.parts_sent)),
            None => Err("an object of the size written is there, but perhaps from before"),
        }
    }

    /// On an error, aborts the upload and passes the error on.
    fn or_abort<T>(&mut self, result: Result<T>) -> Result<T> {
        let Err(mut error) = result else {
            return result;
        };
        // The error that stopped the write comes first; a failed clean-up is added to it, since
        // the parts already uploaded then stay stored (and billed).
        if let (Err(Error::Io { source: failed, .. }), Error::Io { source, .. }) =
            (self.abort(), &mut error)
        {
            *source = std::io::Error::new(
                source.kind(),
                format!(
                    "{source}; aborting the upload failed too ({failed}): its parts stay stored \
                     until removed (the store's list of multipart uploads, or a lifecycle rule)"
                ),
            );
        }
        Err(error)
    }

    /// Abandons the object: parts in flight are dropped and the upload aborted, so nothing is
    /// created. Harmless after close or a previous abort.
    ///
    /// # Errors
    /// [`Error::Io`] if the store refused the abort (its parts may then linger until the
    /// bucket's lifecycle rules remove them; the object was still not created).
    pub fn abort(&mut self) -> Result<()> {
        if self.state != State::Open {
            return Ok(());
        }
        if !self.in_owner() {
            self.forget();
            return Ok(());
        }
        self.state = State::Aborted;
        self.pending = Vec::new();
        self.device_ring = None;
        let mut parts = std::mem::take(&mut self.parts);
        let Some(mut upload) = self.upload.take() else {
            return Ok(());
        };
        // Not cut short by the cancel flag: the abort is what a cancel asks for.
        let aborted = self.handle.block_on(async move {
            parts.shutdown().await;
            upload.abort().await
        });
        aborted.map_err(|e| self.error(self.written, 0, store::io_error(e)))
    }
}

/// An `http(s)://` URL names no store ferrio can write to.
fn refuse_read_only(url: &str, location: &store::Location) -> Result<()> {
    if location.scheme == ObjectStoreScheme::Http {
        return Err(Error::InvalidArgument(format!(
            "{url}: http(s) URLs are read-only; write to s3://, gs:// or az://"
        )));
    }
    Ok(())
}

/// Whether objects can be written at or under `url` (an object's URL, or a prefix ending in
/// `/`): a URL that parses, of a store that takes writes, built from the environment as a
/// writer's would be. A copy checks its destination once so, before it walks its sources.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the URL (or the store variable) and what is wrong.
pub(crate) fn check_writable(url: &str, settings: &Settings) -> Result<()> {
    let location = store::parse_prefix(url)?;
    refuse_read_only(url, &location)?;
    store::build_with(&location, settings).map(drop)
}

impl Drop for RemoteWriter {
    fn drop(&mut self) {
        if self.state != State::Open {
            return;
        }
        if !self.in_owner() {
            // A forked child's copy: waiting on the parent's runtime here would hang.
            self.forget();
            return;
        }
        if Handle::try_current().is_ok() {
            // Inside an async context a blocking wait would panic: abort in the background.
            self.state = State::Aborted;
            let mut parts = std::mem::take(&mut self.parts);
            if let Some(mut upload) = self.upload.take() {
                self.handle.spawn(async move {
                    parts.shutdown().await;
                    let _ = upload.abort().await;
                });
            }
        } else {
            // Nobody is told about a failed clean-up on drop; the object was not created.
            let _ = self.abort();
        }
    }
}

/// Whether an ETag agrees with an object of `parts` parts: an S3 multipart ETag (`"md5-N"`)
/// must say `N`; any other form says nothing of parts, and agrees.
fn parts_agree(tag: &str, parts: usize) -> bool {
    match tag.trim_matches('"').rsplit_once('-') {
        Some((_, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            n.parse() == Ok(parts)
        }
        _ => true,
    }
}

/// Largest object S3 copies in one request (`CopyObject`); a larger one must be copied in
/// parts, which object_store does not do, so ferrio streams it.
const S3_MAX_COPY: u64 = 5 << 30;

/// Copies the object at `from`, of `len` bytes, to `to` inside the store (no bytes pass through
/// this process) when both URLs name the same bucket or container and the store copies an
/// object that large in one request; `Ok(false)` otherwise, so the caller streams the bytes
/// instead (S3 copies at most 5 GiB at once: a larger `CopyObject` fails).
///
/// Azure may answer a copy `pending` and finish it later: then the destination's properties
/// are read again, at growing intervals, until the copy is done, so that `Ok(true)` always means
/// the destination is complete. A copy that ends `failed` or `aborted`, or that makes no
/// progress for [`Settings::remote_timeout`], is an error and its destination is deleted.
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed URL; [`Error::Io`] naming `from` (not found,
/// denied) or `to` for another failure, a failed Azure copy included.
pub fn copy_in_store(from: &str, to: &str, len: u64) -> Result<bool> {
    let (src, dst) = (store::parse(from)?, store::parse(to)?);
    let same = src.scheme == dst.scheme
        && src.scheme != ObjectStoreScheme::Http
        && src.url.host_str() == dst.url.host_str()
        && src.url.port() == dst.url.port();
    let too_large = src.scheme == ObjectStoreScheme::AmazonS3 && len > S3_MAX_COPY;
    if !same || too_large {
        return Ok(false);
    }
    let settings = Settings::current();
    let store = store::build_with(&src, &settings)?;
    let handle = runtime::handle()?;
    let copy = async {
        store.copy(&src.path, &dst.path).await.map_err(|e| {
            let not_found = matches!(e, object_store::Error::NotFound { .. });
            Error::Io {
                op: Op::Write,
                path: if not_found { from } else { to }.into(),
                offset: 0,
                len: 0,
                source: store::io_error(e),
            }
        })
    };
    if src.scheme != ObjectStoreScheme::MicrosoftAzure {
        handle.block_on(copy)?;
        return Ok(true);
    }
    let pending = PendingCopy {
        store: store.as_ref(),
        path: &dst.path,
        from,
        to,
        stall: settings.remote_timeout,
    };
    handle.block_on(store::watching_azure_copies(async {
        copy.await?;
        pending.wait().await
    }))?;
    Ok(true)
}

/// First wait between two reads of a pending Azure copy's properties; it doubles each time.
const COPY_POLL_FIRST: Duration = Duration::from_millis(50);

/// Longest wait between two reads of a pending Azure copy's properties.
const COPY_POLL_MAX: Duration = Duration::from_secs(2);

/// An Azure copy just made inside [`store::watching_azure_copies`], to be waited for.
struct PendingCopy<'a> {
    store: &'a dyn ObjectStore,
    path: &'a Path,
    from: &'a str,
    to: &'a str,
    /// Longest time the copy may go without progress.
    stall: Duration,
}

impl PendingCopy<'_> {
    /// Waits until the copy's status is `success`: reads the destination's properties while it
    /// is `pending`, for as long as its progress moves within `stall`. An answer without a
    /// status (a service that copies at once and says nothing) is a finished copy.
    async fn wait(&self) -> Result<()> {
        let Some(started) = store::take_azure_copy().filter(|c| c.status.is_some()) else {
            return Ok(());
        };
        let mut now = started.clone();
        let mut moved = Instant::now();
        let mut pause = COPY_POLL_FIRST;
        loop {
            match now.status.as_deref() {
                Some("success") => return Ok(()),
                Some("pending") => {}
                None => {
                    return Err(self.error(
                        std::io::ErrorKind::Other,
                        "the destination was replaced while the copy was pending",
                        None,
                    ))
                }
                Some(status) => {
                    let why = now.description.as_deref().unwrap_or("no reason given");
                    let removed = self.remove().await;
                    return Err(self.error(
                        std::io::ErrorKind::Other,
                        &format!("the copy ended {status} ({why})"),
                        Some(removed),
                    ));
                }
            }
            if now.id != started.id {
                return Err(self.error(
                    std::io::ErrorKind::Other,
                    "another copy to the destination started while this one was pending",
                    None,
                ));
            }
            if moved.elapsed() >= self.stall {
                let removed = self.remove().await;
                return Err(self.error(
                    std::io::ErrorKind::TimedOut,
                    &format!(
                        "the copy made no progress in {:?} (see remote_timeout); the store may \
                         still finish it",
                        self.stall
                    ),
                    Some(removed),
                ));
            }
            tokio::time::sleep(pause.min(self.stall.saturating_sub(moved.elapsed()))).await;
            pause = (pause * 2).min(COPY_POLL_MAX);
            self.store.head(self.path).await.map_err(|e| {
                let source = store::io_error(e);
                self.error(
                    source.kind(),
                    &format!("reading the pending copy's destination: {source}"),
                    None,
                )
            })?;
            let next = store::take_azure_copy().unwrap_or_default();
            if next.progress != now.progress {
                moved = Instant::now();
            }
            now = next;
        }
    }

    /// Deletes the destination of a copy that did not finish; whether it is gone.
    async fn remove(&self) -> bool {
        match self.store.delete(self.path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => true,
            Err(_) => false,
        }
    }

    /// The error of a copy that did not finish, naming both URLs, and saying whether its
    /// destination was deleted (`removed`, where that was tried).
    fn error(&self, kind: std::io::ErrorKind, what: &str, removed: Option<bool>) -> Error {
        let (from, to) = (self.from, self.to);
        let left = match removed {
            Some(true) => "; the destination was deleted",
            Some(false) => "; deleting the destination failed: it may be left incomplete",
            None => "",
        };
        Error::Io {
            op: Op::Write,
            path: to.into(),
            offset: 0,
            len: 0,
            source: std::io::Error::new(kind, format!("copy from {from} to {to}: {what}{left}")),
        }
    }
}

/// Part buffers that have come back: a part's buffer returns once the store's client has
/// dropped the last copy of its payload (the part went up, or its retries ended), and the next
/// part fills it. A fresh 8 MiB allocation is a fresh mapping, whose pages are faulted in again
/// for every part.
#[derive(Default)]
struct PartBuffers(Mutex<Vec<Vec<u8>>>);

impl PartBuffers {
    /// An empty buffer that holds `len` bytes without growing: one that came back, or a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match kept.iter().position(|b| b.capacity() >= len) {
            Some(i) => {
                let mut buf = kept.swap_remove(i);
                buf.clear();
                buf
            }
            None => Vec::with_capacity(len),
        }
    }
}

/// A part's bytes, handed to the store; its buffer goes back to `home` when dropped, unless
/// `home` already keeps `most`.
struct Recycled {
    buf: Vec<u8>,
    home: Arc<PartBuffers>,
    most: usize,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let mut kept = self.home.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < self.most {
            kept.push(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn writer(store: Arc<dyn ObjectStore>, part: usize, concurrency: usize) -> RemoteWriter {
        RemoteWriter {
            url: "memory:///obj".into(),
            store,
            path: Path::from("obj"),
            handle: runtime::handle().unwrap(),
            first_part_size: part,
            parts_sent: 0,
            concurrency,
            pending: Vec::new(),
            buffers: Arc::default(),
            upload: None,
            found: None,
            parts: JoinSet::new(),
            part_sizes: VecDeque::new(),
            stored: 0,
            written: 0,
            state: State::Open,
            cancelled: Arc::new(AtomicBool::new(false)),
            external_cancel: None,
            owner: crate::sys::process_id(),
            bounce_buffer_size: 4096,
            bounce_buffers: 2,
            pinned_memory: crate::config::PinnedMemory::Mapped,
            device_ring: None,
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 % 251) as u8).collect()
    }

    fn read(store: &Arc<dyn ObjectStore>) -> Option<Vec<u8>> {
        let h = runtime::handle().unwrap();
        h.block_on(async {
            match store.get(&Path::from("obj")).await {
                Ok(got) => Some(got.bytes().await.unwrap().to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        })
    }

    #[test]
    fn round_trips_every_size_in_ragged_writes() {
        const PART: usize = 1000;
        for n in [0, 1, PART - 1, PART, PART + 1, 7 * PART + 13] {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let mut w = writer(store.clone(), PART, 3);
            let want = data(n);
            for piece in want.chunks(333) {
                assert_eq!(w.write(piece).unwrap(), piece.len());
            }
            assert_eq!(read(&store), None, "visible before close ({n} bytes)");
            assert_eq!(w.close().unwrap(), n as u64);
            assert_eq!(read(&store).as_deref(), Some(&want[..]), "{n} bytes");
        }
    }

    #[test]
    fn stored_counts_the_parts_the_store_took_then_everything_once_closed() {
        const PART: usize = 1000;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), PART, 2);
        let want = data(10 * PART + 7);
        let mut seen = Vec::new();
        for piece in want.chunks(PART) {
            w.write(piece).unwrap();
            seen.push(w.stored());
        }
        // Never more than was written, never backwards, and parts still in flight (at most 2)
        // or being filled are not counted.
        assert!(seen.windows(2).all(|p| p[0] <= p[1]), "{seen:?}");
        assert!(seen.iter().all(|&s| s as usize % PART == 0), "{seen:?}");
        let last = *seen.last().unwrap();
        assert!(last < w.written() && last >= (8 * PART) as u64, "{seen:?}");
        assert_eq!(seen[0], 0, "the first part is not in yet");
        assert_eq!(w.close().unwrap(), want.len() as u64);
        assert_eq!(w.stored(), want.len() as u64);
    }

    #[test]
    fn part_buffers_come_back_when_the_store_drops_them_and_serve_later_parts() {
        const PART: usize = 1000;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), PART, 3);
        let want = data(10 * PART);
        w.write(&want).unwrap();
        w.close().unwrap();
        assert_eq!(read(&store).as_deref(), Some(&want[..]));
        // The store dropped the parts when it joined them: their buffers came back, no more
        // than the parts in flight and the one being filled.
        let kept = || w.buffers.0.lock().unwrap().len();
        let back = kept();
        assert!((1..=w.parts_in_flight() + 1).contains(&back), "{back} kept");
        // One that came back is handed out again, empty; a longer part gets a new one.
        let again = w.buffers.take(PART);
        assert!(again.is_empty() && again.capacity() >= PART);
        assert_eq!(kept(), back - 1);
        assert_eq!(w.buffers.take(100 * PART).capacity(), 100 * PART);
        assert_eq!(kept(), back - 1);
    }

    #[test]
    fn parts_grow_every_thousand_so_ten_thousand_reach_the_stores_largest_objects() {
        const MIB: usize = 1 << 20;
        assert_eq!(part_size_after(8 * MIB, 0), 8 * MIB);
        assert_eq!(part_size_after(8 * MIB, 999), 8 * MIB);
        assert_eq!(part_size_after(8 * MIB, 1000), 16 * MIB);
        assert_eq!(part_size_after(8 * MIB, 9999), MAX_PART_SIZE);
        assert_eq!(part_size_after(8 * MIB, usize::MAX), MAX_PART_SIZE);
        let total = |first: usize| -> u64 {
            (0..MAX_PARTS)
                .map(|i| part_size_after(first, i) as u64)
                .sum()
        };
        assert!(
            total(8 * MIB) > 5 << 40,
            "the default reaches S3's 5 TiB objects"
        );
        assert!(total(MIN_PART_SIZE) > 4 << 40);
    }

    #[test]
    fn growing_parts_round_trip_with_the_same_memory_in_flight() {
        const PART: usize = 100;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), PART, 8);
        assert_eq!(w.parts_in_flight(), 8);
        // 1,000 parts of 100 bytes, 1,000 of 200, and 3 and a bit of 400.
        let want = data(1000 * PART + 1000 * 2 * PART + 3 * 4 * PART + 17);
        for piece in want.chunks(977) {
            w.write(piece).unwrap();
        }
        assert_eq!(w.part_size(), 4 * PART);
        assert_eq!(
            w.parts_in_flight(),
            2,
            "8 parts of 100 bytes' worth of 400-byte parts"
        );
        assert_eq!(w.close().unwrap(), want.len() as u64);
        assert_eq!(read(&store).as_deref(), Some(&want[..]));
    }

    #[test]
    fn a_part_past_the_stores_limit_is_refused_and_nothing_is_created() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), 100, 2);
        w.write(&data(250)).unwrap();
        w.parts_sent = MAX_PARTS;
        match w.write(&data(w.part_size())) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("10000 parts"), "{msg}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(w.close(), Err(Error::InvalidArgument(_))));
        assert_eq!(read(&store), None);
    }

    #[test]
    fn s3_objects_over_5_gib_are_not_copied_in_the_store() {
        // Answered before any store is built or asked: the caller streams the bytes instead.
        assert!(!copy_in_store("s3://b/big", "s3://b/copy", S3_MAX_COPY + 1).unwrap());
        // Other buckets are never copied in the store, whatever the size.
        assert!(!copy_in_store("s3://b/small", "s3://other/copy", 1).unwrap());
    }

    #[test]
    fn a_multipart_etag_must_name_the_parts_sent() {
        assert!(parts_agree("\"9b2cf535f27731c974343645a3985328-3\"", 3));
        assert!(!parts_agree("\"9b2cf535f27731c974343645a3985328-2\"", 3));
        // Other forms (one PUT's MD5, Azure's, GCS's) say nothing of parts.
        assert!(parts_agree("\"9b2cf535f27731c974343645a3985328\"", 3));
        assert!(parts_agree("\"0x8DC1234567890AB\"", 3));
        assert!(parts_agree("CJjs2/3MhPQCEAE=", 3));
        assert!(parts_agree("a-b-", 3));
    }

    #[test]
    fn dropped_or_aborted_writer_creates_nothing() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), 100, 2);
        w.write(&data(450)).unwrap();
        drop(w);
        assert_eq!(read(&store), None);

        let mut w = writer(store.clone(), 100, 2);
        w.write(&data(450)).unwrap();
        w.canceller().cancel();
        w.write(&data(100)).unwrap_err();
        assert!(matches!(w.close(), Err(Error::InvalidArgument(_))));
        assert_eq!(read(&store), None);
    }

    #[test]
    fn pwrite_only_at_the_end() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), 100, 2);
        w.pwrite(b"abc", 0).unwrap();
        match w.pwrite(b"x", 1) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("offset 1"), "{msg}"),
            other => panic!("{other:?}"),
        }
        w.pwrite(b"def", 3).unwrap();
        w.close().unwrap();
        assert_eq!(read(&store).as_deref(), Some(&b"abcdef"[..]));
    }

    #[test]
    fn device_memory_goes_up_through_the_ring_buffer_by_buffer() {
        use crate::bounce::emulated::EmulatedDevice;
        const PART: usize = 10_000;
        let dev = EmulatedDevice::new(std::time::Duration::ZERO);
        let want = data(7 * PART + 123);
        let src = dev.alloc_device(want.len()).unwrap();
        dev.write_device(src, &want).unwrap();
        let budget = Arc::new(PinnedBudget::new(1 << 20));
        let mut ring = BounceRing::new(dev.clone(), 4096, 3, budget).unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), PART, 2);
        // Host and device writes mix, and a device write starts in the middle of a part.
        w.write(b"head").unwrap();
        assert_eq!(
            w.append_through(&mut ring, src, want.len()).unwrap(),
            want.len()
        );
        assert_eq!(
            dev.copies_issued(),
            want.len().div_ceil(4096) as u64,
            "one device-to-host copy per ring buffer"
        );
        assert_eq!(read(&store), None, "visible before close");
        w.close().unwrap();
        let mut expected = b"head".to_vec();
        expected.extend_from_slice(&want);
        assert_eq!(read(&store), Some(expected));
        assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    }

    #[test]
    fn device_copy_failing_mid_way_aborts_the_upload() {
        use crate::bounce::emulated::EmulatedDevice;
        let dev = EmulatedDevice::new(std::time::Duration::ZERO);
        let src = dev.alloc_device(50_000).unwrap();
        dev.write_device(src, &data(50_000)).unwrap();
        let budget = Arc::new(PinnedBudget::new(1 << 20));
        let mut ring = BounceRing::new(dev.clone(), 4096, 2, budget).unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut w = writer(store.clone(), 5000, 2);
        dev.fail_copy_run(6);
        w.append_through(&mut ring, src, 50_000).unwrap_err();
        assert!(matches!(w.close(), Err(Error::InvalidArgument(_))));
        assert_eq!(read(&store), None);
    }

    #[test]
    fn http_urls_are_read_only() {
        match RemoteWriter::create("https://example.com/x") {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("read-only"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}
