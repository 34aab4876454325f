//! `RemoteFile`: an object in remote storage (`s3://`, `gs://`, `az://`, `http(s)://`) read in
//! parallel ranged GETs into host or GPU memory, with the read API of `File`; `RemoteWriter`: a
//! new object written by multipart upload (`ferrio.open(url, "w")`).
//!
//! Arguments are validated before any I/O; blocking happens only through [`crate::gil`]. The
//! object's size and version are fixed at open (see `ferrio::remote`).

use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyResourceWarning, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use ferrio::Settings;

use crate::buffer::{self, Direction, Target};
use crate::config::SettingText;
use crate::errors::{closed_file, to_pyerr};
use crate::future::{IOFuture, Keep, Pending};
use crate::gil::{release_gil, without_gil, Blocking};

/// An object in remote storage, open for reading. Reads are split into ranged GETs that run in
/// parallel; the GIL is released while they run.
///
/// Open with `ferrio.open(url)` or `ferrio.open_url(url)`. Usable from many threads at once, and
/// as a context manager. Reads past the end of the object return a short count; a read of an
/// object replaced since it was opened raises `OSError` naming the URL.
#[pyclass(frozen, module = "ferrio", name = "RemoteFile")]
pub struct RemoteFile {
    inner: Mutex<Option<ferrio::RemoteFile>>,
    url: String,
}

impl RemoteFile {
    fn lock(&self) -> MutexGuard<'_, Option<ferrio::RemoteFile>> {
        // Only ever replaced whole (on close), so a poisoned lock still holds a valid value.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle to the open object (cheap: shared), or the closed-file error.
    pub(crate) fn handle(&self) -> PyResult<ferrio::RemoteFile> {
        self.lock().clone().ok_or_else(closed_file)
    }

    /// Validates everything and issues the read; the export travels with it.
    fn start(
        &self,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
    ) -> PyResult<(Pending, String)> {
        let file = self.handle()?;
        let offset = u64::try_from(offset).map_err(|_| {
            PyValueError::new_err(format!("offset must be at least 0, not {offset}"))
        })?;
        let target = buffer::target(buf, Direction::Read, size)?;
        let len = match &target {
            Target::Host(host) => host.len(),
            Target::Device(dev) => dev.len,
        };
        let what = format!("read of {len} bytes at offset {offset} of {:?}", self.url);
        let pending = match target {
            Target::Host(host) => {
                // SAFETY: `ptr..ptr+len` lies in the writable, C-contiguous export checked by
                // `buffer::target`; `Pending` keeps the export alive and waits for the future
                // before releasing it, and the future is never leaked.
                let fut = unsafe { file.pread_raw(host.ptr(), len, offset) };
                Pending::new(fut, Keep::View(host.into_view()))
            }
            Target::Device(dev) => {
                let ptr = ferrio::cuda::DevicePtr(dev.ptr);
                // SAFETY: `ptr..ptr+len` lies in a writable, C-contiguous GPU array checked by
                // `buffer::target`; `Pending` holds its owner until the future is done.
                let fut = unsafe { file.pread_device(ptr, len, offset) };
                Pending::new(fut, Keep::Object(dev.owner))
            }
        };
        Ok((pending, what))
    }
}

/// Opens the object at `url` for reading (mode `r`: a `RemoteFile`) or as a new object (mode
/// `w`: a `RemoteWriter`) with the settings in force and the per-object options given.
pub(crate) fn open_remote(
    py: Python<'_>,
    url: &str,
    mode: &str,
    options: ObjectOptions,
) -> PyResult<Py<PyAny>> {
    let writing = match mode {
        "r" | "rb" => false,
        "w" | "wb" => true,
        _ => {
            return Err(PyValueError::new_err(format!(
                "remote objects open for reading (mode \"r\") or as a new object (mode \"w\"), \
                 not {mode:?}: {url}"
            )))
        }
    };
    let settings = options.settings()?;
    if writing {
        let writer = ferrio::RemoteWriter::create_with(url, settings).map_err(to_pyerr)?;
        let writer = RemoteWriter {
            inner: Mutex::new(Some(writer)),
            url: url.to_string(),
        };
        return Ok(Py::new(py, writer)?.into_any());
    }
    Ok(Py::new(py, open_reader(py, url, settings)?)?.into_any())
}

/// What one object is opened with besides the settings in force: `range_size=` and
/// `concurrency=` of `ferrio.open_url` (`task_size=` of `ferrio.open`).
pub(crate) struct ObjectOptions {
    /// Bytes of each GET (and of each part of an upload).
    pub(crate) range_size: Option<SettingText>,
    /// GETs (or parts) in flight.
    pub(crate) concurrency: Option<SettingText>,
}

impl ObjectOptions {
    /// The settings in force with these options. A range size given for one object is the size
    /// of each of its GETs, as its name says: the shortest and the longest of the even ranges.
    fn settings(&self) -> PyResult<Settings> {
        let mut settings = Settings::current();
        let given = [
            ("remote_range_size", &self.range_size),
            ("remote_max_range_size", &self.range_size),
            ("remote_concurrency", &self.concurrency),
        ];
        for (name, value) in given {
            if let Some(SettingText(text)) = value {
                settings.set(name, text).map_err(to_pyerr)?;
            }
        }
        Ok(settings)
    }
}

fn open_reader(py: Python<'_>, url: &str, settings: Settings) -> PyResult<RemoteFile> {
    let file =
        without_gil(py, || ferrio::RemoteFile::open_with(url, settings))?.map_err(to_pyerr)?;
    Ok(RemoteFile {
        inner: Mutex::new(Some(file)),
        url: url.to_string(),
    })
}

/// Opens an object in remote storage for parallel reads (mode `r`: a `RemoteFile`) or writes a
/// new one by multipart upload (mode `w`: a `RemoteWriter`).
///
/// `url` is `s3://bucket/key`, `gs://bucket/key`, `az://container/key` (or `abfs://`) or
/// `http(s)://host/path`. Credentials and endpoints come from the environment as each store's
/// tools read them (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `GOOGLE_*`,
/// `AZURE_STORAGE_*`); without credentials requests are unsigned. `range_size` (bytes per GET:
/// every GET that long, where the settings' ranges start longer on a large object) and
/// `concurrency` (GETs in flight) override `remote_range_size` and `remote_concurrency`.
/// Raises `FileNotFoundError` or `PermissionError` naming the URL, `ValueError` for a malformed
/// URL, a mode other than `r` or `w`, or `w` on an `http(s)://` URL (read-only).
#[pyfunction]
#[pyo3(signature = (url, mode="r", *, range_size=None, concurrency=None))]
pub(crate) fn open_url(
    py: Python<'_>,
    url: &str,
    mode: &str,
    range_size: Option<SettingText>,
    concurrency: Option<SettingText>,
) -> PyResult<Py<PyAny>> {
    let options = ObjectOptions {
        range_size,
        concurrency,
    };
    open_remote(py, url, mode, options)
}

/// The local path a `file://` URL names (as a `str`); any other path is returned as given.
/// A `file:` URL of another host raises `ValueError`.
#[pyfunction]
pub(crate) fn local_path<'py>(path: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let Ok(text) = path.extract::<&str>() else {
        return Ok(path.clone());
    };
    match ferrio::remote::file_url_path(text) {
        Some(local) => {
            let local = local.map_err(to_pyerr)?;
            Ok(local.into_os_string().into_pyobject(path.py())?.into_any())
        }
        None => Ok(path.clone()),
    }
}

/// Whether `path` is a URL that `open` reads from remote storage.
#[pyfunction]
pub(crate) fn is_remote_url(path: &Bound<'_, PyAny>) -> bool {
    path.extract::<&str>()
        .is_ok_and(ferrio::remote::is_remote_url)
}

#[pymethods]
impl RemoteFile {
    /// Same as `ferrio.open_url(url, mode, ...)`.
    #[new]
    #[pyo3(signature = (url, mode="r", *, range_size=None, concurrency=None))]
    fn new(
        py: Python<'_>,
        url: &str,
        mode: &str,
        range_size: Option<SettingText>,
        concurrency: Option<SettingText>,
    ) -> PyResult<RemoteFile> {
        if !matches!(mode, "r" | "rb") {
            return Err(PyValueError::new_err(format!(
                "RemoteFile reads (mode \"r\"); write a new object with ferrio.open(url, \"w\"), \
                 not {mode:?}: {url}"
            )));
        }
        let settings = ObjectOptions {
            range_size,
            concurrency,
        }
        .settings()?;
        open_reader(py, url, settings)
    }

    /// Reads `size` bytes (default: the buffer's size) at `offset` into the start of `buf`, in
    /// parallel ranged GETs, and returns the number read: fewer only past the object's end.
    ///
    /// `buf` is any writable, C-contiguous buffer, or a GPU array
    /// (`__cuda_array_interface__` or DLPack).
    #[pyo3(signature = (buf, size=None, offset=0))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
    ) -> PyResult<usize> {
        self.start(buf, size, offset)?.0.wait(py)
    }

    /// Starts a read like `read()` and returns at once with an `IOFuture`.
    #[pyo3(signature = (buf, size=None, offset=0))]
    fn pread(&self, buf: &Bound<'_, PyAny>, size: Option<i64>, offset: i64) -> PyResult<IOFuture> {
        let (pending, what) = self.start(buf, size, offset)?;
        Ok(IOFuture::new(pending, what))
    }

    /// Closes the object; later calls raise `ValueError`. Reads still running finish first.
    fn close(&self) {
        self.lock().take();
    }

    /// Whether the object is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// The URL the object was opened with.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// The URL, under the name `File` uses.
    #[getter]
    fn path(&self) -> &str {
        &self.url
    }

    /// Always `r`.
    #[getter]
    fn mode(&self) -> &'static str {
        "r"
    }

    /// The object's size in bytes, as it was at open.
    #[getter]
    fn size(&self) -> PyResult<u64> {
        Ok(self.handle()?.len())
    }

    /// The object's ETag at open, if the store gave one.
    #[getter]
    fn etag(&self) -> PyResult<Option<String>> {
        Ok(self.handle()?.e_tag().map(str::to_string))
    }

    /// Returns the object itself; a closed one is refused, as Python's own files refuse it.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().closed() {
            return Err(closed_file());
        }
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferrio.RemoteFile url={:?}{}>",
            self.url,
            if self.closed() { " closed" } else { "" }
        )
    }
}

/// A new object in remote storage, written by multipart upload: `ferrio.open(url, "w")`.
///
/// `write(buf)` appends; parts of `remote_range_size` (at least 5 MiB) are uploaded in parallel
/// (up to `remote_concurrency`) while writing goes on, with the GIL released. `close()` waits for
/// them and completes the upload: only then does the object exist. `abort()`, an exception or
/// `KeyboardInterrupt` inside a `with` block, a failed part, or a writer garbage-collected
/// without `close()` (with a `ResourceWarning`) abort the upload: no object is created and no
/// parts are left behind.
#[pyclass(frozen, module = "ferrio", name = "RemoteWriter")]
pub struct RemoteWriter {
    inner: Mutex<Option<ferrio::RemoteWriter>>,
    url: String,
}

impl RemoteWriter {
    fn lock(&self) -> MutexGuard<'_, Option<ferrio::RemoteWriter>> {
        // Only its writer's own calls change it; a poisoned lock holds a writer that aborted or
        // is still consistent (each call leaves it whole).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`RemoteWriter::lock`] from a thread that holds the GIL: where another thread's call
    /// holds the writer (waiting on the store, with the GIL released), this one waits without
    /// the GIL. Waiting with it would stop every Python thread, and a store served from this
    /// process (a test's moto) could never answer the call being waited for.
    fn lock_py(&self, py: Python<'_>) -> MutexGuard<'_, Option<ferrio::RemoteWriter>> {
        loop {
            match self.inner.try_lock() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(TryLockError::WouldBlock) => py.detach(|| drop(self.lock())),
            }
        }
    }

    /// Runs `f` on the writer with the GIL released; `ValueError` once closed. The call runs on
    /// a helper thread while this one keeps looking at Python's signals: a Ctrl-C while a
    /// `write()` waits for parts in flight (or `close()` for the last ones) cancels the upload,
    /// which is aborted before `KeyboardInterrupt` is raised, so no object is created.
    fn with_writer<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut ferrio::RemoteWriter) -> ferrio::Result<T> + Send,
    ) -> PyResult<T> {
        self.run_writer(py, true, f)
    }

    /// As [`RemoteWriter::with_writer`]; a call that cannot wait on the store (`may_block`
    /// false: a write that fills no part only copies bytes) runs on this thread instead, so
    /// small writes pay for no helper thread.
    fn run_writer<T: Send>(
        &self,
        py: Python<'_>,
        may_block: bool,
        f: impl FnOnce(&mut ferrio::RemoteWriter) -> ferrio::Result<T> + Send,
    ) -> PyResult<T> {
        if !may_block {
            return without_gil(py, || {
                let mut slot = self.lock();
                match slot.as_mut() {
                    Some(w) => Ok(f(w)),
                    None => Err(closed_file()),
                }
            })??
            .map_err(to_pyerr);
        }
        let canceller = self
            .lock_py(py)
            .as_ref()
            .map(|w| w.canceller())
            .ok_or_else(closed_file)?;
        let joined = std::thread::scope(|scope| -> PyResult<_> {
            let call = scope.spawn(|| {
                let mut slot = self.lock();
                match slot.as_mut() {
                    Some(w) => Ok(f(w)),
                    None => Err(closed_file()),
                }
            });
            let waited = WriterCall {
                call: Some(call),
                canceller,
            };
            release_gil(py, waited, None)?
                .ok_or_else(|| PyRuntimeError::new_err("writer call did not finish"))
        })?;
        let done = joined.map_err(|_| PyRuntimeError::new_err("writer call panicked"))??;
        done.map_err(to_pyerr)
    }
}

impl Drop for RemoteWriter {
    fn drop(&mut self) {
        // A writer garbage-collected while open aborts its upload, a request to the store that
        // may take up to `remote_timeout` per try: made with the GIL held it would stop every
        // other thread (and a server in this process could never answer it). While Python
        // shuts down the writer is dropped in place.
        let slot = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(writer) = slot.take() {
            let url = &self.url;
            Python::try_attach(|py| {
                py.detach(move || drop(writer));
                warn_unclosed(py, url);
            });
        }
    }
}

/// A `ResourceWarning`, as Python gives for a file left unclosed, for a writer let go of while
/// open: unlike a file's, its bytes are gone (the upload was aborted), which a bare
/// `ferrio.open(url, "w").write(data)` would otherwise lose in silence. An exception being
/// raised meanwhile is kept; a warning turned into an error is reported as unraisable.
fn warn_unclosed(py: Python<'_>, url: &str) {
    let pending = PyErr::take(py);
    let text = format!(
        "unclosed writer for {url}: its upload was aborted and no object was written (call \
         close(), or write inside a with block)"
    );
    if let Ok(text) = std::ffi::CString::new(text) {
        let category = py.get_type::<PyResourceWarning>();
        if let Err(e) = PyErr::warn(py, &category, &text, 1) {
            e.write_unraisable(py, None);
        }
    }
    if let Some(e) = pending {
        e.restore(py);
    }
}

/// A writer call running on a scoped helper thread, waited on in slices by [`release_gil`].
struct WriterCall<'scope, T> {
    call: Option<std::thread::ScopedJoinHandle<'scope, T>>,
    canceller: ferrio::remote::WriteCanceller,
}

impl<T: Send> Blocking for WriterCall<'_, T> {
    type Output = std::thread::Result<T>;

    fn wait_slice(&mut self, slice: Duration) -> Option<Self::Output> {
        let until = Instant::now() + slice;
        while self.call.as_ref().is_some_and(|c| !c.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        match &self.call {
            Some(c) if c.is_finished() => self.call.take().map(|c| c.join()),
            _ => None,
        }
    }

    fn abort(&mut self) {
        // The upload aborts: parts in flight are dropped and the call returns promptly.
        self.canceller.cancel();
        if let Some(c) = self.call.take() {
            let _ = c.join();
        }
    }
}

#[pymethods]
impl RemoteWriter {
    /// Appends the bytes of `buf` (any C-contiguous host buffer, or a GPU array:
    /// `__cuda_array_interface__` or DLPack) to the object and returns how many were taken (all
    /// of them). Blocks while `remote_concurrency` parts are in flight. A GPU array is copied to
    /// the host a bounce buffer at a time, straight into the parts being filled.
    fn write(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        let host = match buffer::target(buf, Direction::Write, None)? {
            Target::Host(host) => host,
            Target::Device(dev) => {
                let (ptr, len) = (ferrio::cuda::DevicePtr(dev.ptr), dev.len);
                // Device copies and uploads both wait: always off the calling thread.
                let n = self.run_writer(py, true, move |w| {
                    // SAFETY: `ptr..ptr+len` lies in a C-contiguous GPU array checked by
                    // `buffer::target`, whose owner (`dev.owner`) is held until this call has
                    // returned; the writer copies the bytes out before returning.
                    unsafe { w.write_device(ptr, len) }
                });
                drop(dev.owner);
                return n;
            }
        };
        let (ptr, len) = (SendConst(host.ptr()), host.len());
        let view = host.into_view();
        // Only a write that fills a part waits on the store (for room among the parts in flight).
        let may_block = self.lock_py(py).as_ref().is_none_or(|w| w.fills_part(len));
        let n = self.run_writer(py, may_block, move |w| {
            let ptr = ptr;
            // SAFETY: `ptr..ptr+len` lies in the C-contiguous export checked by
            // `buffer::target`, held by `view` until after this call returns; the writer copies
            // the bytes out before returning.
            let bytes = unsafe { std::slice::from_raw_parts(ptr.0.cast_const(), len) };
            w.write(bytes)
        });
        drop(view);
        n
    }

    /// Completes the object (waits for every part); the object exists once this returns.
    /// Closing twice does nothing. On an error the upload is aborted and the error raised.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.lock_py(py).as_ref().is_none_or(|w| w.is_closed()) {
            return Ok(());
        }
        let done = self.with_writer(py, |w| w.close().map(|_| ()));
        self.lock_py(py).take();
        done
    }

    /// Abandons the object: parts in flight are dropped and the upload is aborted, so nothing is
    /// created. Does nothing after `close()`.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        if self.lock_py(py).is_none() {
            return Ok(());
        }
        let done = self.with_writer(py, |w| w.abort());
        self.lock_py(py).take();
        done
    }

    /// Bytes written so far.
    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.lock_py(py)
            .as_ref()
            .map(|w| w.written())
            .ok_or_else(closed_file)
    }

    /// Whether the writer was closed or aborted.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.lock_py(py).is_none()
    }

    /// The URL written to.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// The URL, under the name `File` uses.
    #[getter]
    fn path(&self) -> &str {
        &self.url
    }

    /// Always `w`.
    #[getter]
    fn mode(&self) -> &'static str {
        "w"
    }

    /// Returns the writer itself; a closed one is refused, as Python's own files refuse it.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().closed(slf.py()) {
            return Err(closed_file());
        }
        Ok(slf)
    }

    /// Completes the object on a normal exit; aborts it when the block raised (including
    /// `KeyboardInterrupt`).
    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            self.abort(py)?;
        } else {
            self.close(py)?;
        }
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<ferrio.RemoteWriter url={:?}{}>",
            self.url,
            if self.closed(py) { " closed" } else { "" }
        )
    }
}

/// A pointer to the caller's bytes, carried to the thread that runs without the GIL.
struct SendConst(*mut u8);

// SAFETY: the pointer is only read, during one call that the export backing it outlives.
unsafe impl Send for SendConst {}
