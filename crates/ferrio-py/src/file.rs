//! `File`: an open file whose reads and writes run in parallel on ferrio's worker pools.
//!
//! Every method validates its arguments (open, mode, buffer, size, offset) before any I/O and
//! blocks only through [`crate::gil`]. Closing drops this handle's share of the descriptors;
//! operations still running keep them open until they finish.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use ferrio::{Mode, OpenOptions, Settings};

use crate::buffer::{self, Direction, Target};
use crate::config::SettingText;
use crate::errors::{closed_file, to_pyerr, UnsupportedOperation};
use crate::future::{IOFuture, Keep, Pending};
use crate::gil::without_gil;

/// An open file. Reads and writes are split into tasks that run in parallel on the worker pool
/// of the file's block device; the GIL is released while they run.
///
/// Open with `ferrio.open(path, mode)`. Usable from many threads at once, and as a context
/// manager (closed on exit). Reads at or past the end of the file return a short count.
#[pyclass(frozen, module = "ferrio", name = "File")]
pub struct File {
    inner: Mutex<Option<ferrio::File>>,
    path: PathBuf,
    mode: Mode,
}

impl File {
    fn lock(&self) -> MutexGuard<'_, Option<ferrio::File>> {
        // Only ever replaced whole (on close), so a poisoned lock still holds a valid value.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle to the open file (cheap: descriptors are shared), or the closed-file error.
    pub(crate) fn handle(&self) -> PyResult<ferrio::File> {
        self.lock().clone().ok_or_else(closed_file)
    }

    /// The handle, checked for `direction`, as Python's own files check (`io.UnsupportedOperation`).
    fn handle_for(&self, direction: Direction) -> PyResult<ferrio::File> {
        let file = self.handle()?;
        let (ok, what) = match direction {
            Direction::Read => (self.mode.readable(), "reading"),
            Direction::Write => (self.mode.writable(), "writing"),
        };
        if ok {
            Ok(file)
        } else {
            Err(UnsupportedOperation::new_err(format!(
                "File not open for {what} ({} was opened with mode {:?})",
                self.path.display(),
                self.mode.as_str()
            )))
        }
    }

    /// Validates everything and issues the operation; the export travels with it.
    fn start(
        &self,
        direction: Direction,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
    ) -> PyResult<(Pending, String)> {
        let file = self.handle_for(direction)?;
        let offset = u64::try_from(offset).map_err(|_| {
            PyValueError::new_err(format!("offset must be at least 0, not {offset}"))
        })?;
        let target = buffer::target(buf, direction, size)?;
        let len = match &target {
            Target::Host(host) => host.len(),
            Target::Device(dev) => dev.len,
        };
        let what = format!(
            "{} of {len} bytes at offset {offset} of {:?}",
            match direction {
                Direction::Read => "read",
                Direction::Write => "write",
            },
            self.path.display().to_string()
        );
        let pending = match target {
            Target::Host(host) => {
                let ptr = host.ptr();
                let fut = match direction {
                    // SAFETY: `ptr..ptr+len` lies in the writable, C-contiguous export checked by
                    // `buffer::target`; `Pending` keeps the export (so the memory) alive and
                    // waits for the future before releasing it, and the future is never leaked.
                    Direction::Read => unsafe { file.pread_raw(ptr, len, offset) },
                    // SAFETY: as above, for reading `ptr..ptr+len`; Python code that mutates the
                    // buffer during the write races with it, as with any write from a buffer.
                    Direction::Write => unsafe { file.pwrite_raw(ptr, len, offset) },
                };
                Pending::new(fut, Keep::View(host.into_view()))
            }
            Target::Device(dev) => {
                let ptr = ferrio::cuda::DevicePtr(dev.ptr);
                let fut = match direction {
                    // SAFETY: `ptr..ptr+len` lies in a writable, C-contiguous GPU array checked
                    // by `buffer::target`; `Pending` holds its owner until the future is done.
                    Direction::Read => unsafe { file.pread_device(ptr, len, offset) },
                    // SAFETY: as above, for reading the array's memory.
                    Direction::Write => unsafe { file.pwrite_device(ptr, len, offset) },
                };
                Pending::new(fut, Keep::Object(dev.owner))
            }
        };
        Ok((pending, what))
    }
}

/// Opens `path` with the settings in force and the per-file options given.
fn open_file(
    py: Python<'_>,
    path: PathBuf,
    mode: &str,
    options: [(&str, Option<SettingText>); 5],
) -> PyResult<File> {
    let parsed: Mode = mode.parse().map_err(to_pyerr)?;
    let mut settings = Settings::current();
    for (name, value) in options {
        if let Some(SettingText(text)) = value {
            settings.set(name, &text).map_err(to_pyerr)?;
        }
    }
    let opener = OpenOptions::new().settings(settings);
    let file = without_gil(py, || opener.open(&path, mode))?.map_err(to_pyerr)?;
    Ok(File {
        inner: Mutex::new(Some(file)),
        path,
        mode: parsed,
    })
}

/// Opens a file for parallel reads and writes and returns a `File`.
///
/// `mode` is one of `r`, `r+`, `w`, `w+`, `a`, `a+`, `x`, `x+`, spelled as Python's `open`
/// takes them (a `b` is allowed and ignored: ferrio only moves bytes; text mode is refused). Options override the process-wide settings (`ferrio.config`) for this
/// file: `task_size` (bytes per parallel task: `4194304` or `"4MiB"`), `cache` (`"auto"`,
/// `"keep"` or `"bypass"`: whether what is read or written stays in the page cache; under `auto`
/// reads keep a file of at most half the available memory, and writes keep where the device
/// measured buffered writes faster, up to the smaller of that and the dirty limit), `direct_read` and
/// `direct_write` (`"off"`, `"on"` or `"auto"`: bypass the page cache with O_DIRECT) and
/// `direct_overread` (bool). Raises the matching `OSError` subclass (`FileNotFoundError`,
/// `PermissionError`, `IsADirectoryError`, ...) with `filename` set, or `ValueError` for a
/// bad mode or option. Only regular files and block devices open: a FIFO, socket or character
/// device raises `OSError` (`EINVAL`, "is a FIFO", ...) at once, without waiting on it.
///
/// A `str` that is a URL (`s3://`, `gs://`, `az://`, `abfs://`, `http(s)://`) opens the object
/// for reading and returns a `RemoteFile` (as `open_url(path)`): mode `r` only, `task_size`
/// sets the bytes per ranged GET, and the page-cache options do not apply.
#[pyfunction]
#[pyo3(signature = (path, mode="r", *, task_size=None, cache=None, direct_read=None, direct_write=None, direct_overread=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn open(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    mode: &str,
    task_size: Option<SettingText>,
    cache: Option<SettingText>,
    direct_read: Option<SettingText>,
    direct_write: Option<SettingText>,
    direct_overread: Option<SettingText>,
) -> PyResult<Py<PyAny>> {
    if let Some(url) = path
        .extract::<&str>()
        .ok()
        .filter(|p| ferrio::remote::is_remote_url(p))
    {
        let local_only = [
            ("cache", &cache),
            ("direct_read", &direct_read),
            ("direct_write", &direct_write),
            ("direct_overread", &direct_overread),
        ];
        if let Some((name, _)) = local_only.iter().find(|(_, v)| v.is_some()) {
            return Err(PyValueError::new_err(format!(
                "{name} applies to local files, not to the remote object {url}"
            )));
        }
        // A remote read's tasks are its ranged GETs.
        let options = crate::remote::ObjectOptions {
            range_size: task_size,
            concurrency: None,
        };
        let remote = crate::remote::open_remote(py, url, mode, options)?;
        return Ok(remote);
    }
    let path = crate::paths::fs_path(path)?;
    let file = open_file(
        py,
        path,
        mode,
        [
            ("task_size", task_size),
            ("cache", cache),
            ("direct_read", direct_read),
            ("direct_write", direct_write),
            ("direct_overread", direct_overread),
        ],
    )?;
    Ok(Py::new(py, file)?.into_any())
}

#[pymethods]
impl File {
    /// Same as `ferrio.open(path, mode, ...)`.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (path, mode="r", *, task_size=None, cache=None, direct_read=None, direct_write=None, direct_overread=None))]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::paths::fs_path)] path: PathBuf,
        mode: &str,
        task_size: Option<SettingText>,
        cache: Option<SettingText>,
        direct_read: Option<SettingText>,
        direct_write: Option<SettingText>,
        direct_overread: Option<SettingText>,
    ) -> PyResult<File> {
        open_file(
            py,
            path,
            mode,
            [
                ("task_size", task_size),
                ("cache", cache),
                ("direct_read", direct_read),
                ("direct_write", direct_write),
                ("direct_overread", direct_overread),
            ],
        )
    }

    /// Reads `size` bytes (default: the buffer's size) at `offset` into the start of `buf`, in
    /// parallel, and returns the number read: fewer only when the file ends first (0 past it).
    ///
    /// `buf` is any writable, C-contiguous buffer: a numpy array of any dtype and shape (0-d and
    /// datetime64 included), a bytearray, a memoryview, an mmap, a ctypes array. A read-only or
    /// non-contiguous buffer, or a `size` larger than it, raises `ValueError` before any I/O.
    #[pyo3(signature = (buf, size=None, offset=0))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
    ) -> PyResult<usize> {
        self.start(Direction::Read, buf, size, offset)?.0.wait(py)
    }

    /// Writes `size` bytes (default: all) from the start of `buf` at `offset`, in parallel, and
    /// returns the number written. In modes `a`/`a+` the write goes to the end of the file as it
    /// is when the write starts (after this handle's writes still running); unlike `O_APPEND`,
    /// other handles or processes appending at the same time may write over it.
    #[pyo3(signature = (buf, size=None, offset=0))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
    ) -> PyResult<usize> {
        self.start(Direction::Write, buf, size, offset)?.0.wait(py)
    }

    /// Starts a read like `read()` and returns at once with an `IOFuture`; the buffer is held
    /// until the read is done. Argument errors are raised here, I/O errors by the future.
    #[pyo3(signature = (buf, size=None, offset=0))]
    fn pread(&self, buf: &Bound<'_, PyAny>, size: Option<i64>, offset: i64) -> PyResult<IOFuture> {
        let (pending, what) = self.start(Direction::Read, buf, size, offset)?;
        Ok(IOFuture::new(pending, what))
    }

    /// Starts a write like `write()` and returns at once with an `IOFuture`.
    #[pyo3(signature = (buf, size=None, offset=0))]
    fn pwrite(&self, buf: &Bound<'_, PyAny>, size: Option<i64>, offset: i64) -> PyResult<IOFuture> {
        let (pending, what) = self.start(Direction::Write, buf, size, offset)?;
        Ok(IOFuture::new(pending, what))
    }

    /// Flushes written data to the device (`fdatasync`). Under `cache="auto"`, writes that end
    /// within the write keep limit go through the page cache where the device measured that
    /// faster (`ferrio info PATH` says which), and a flush of them then takes longer than direct
    /// writes would have: a writer that will sync should open with `cache="bypass"`.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let file = self.handle()?;
        without_gil(py, || file.sync())?.map_err(to_pyerr)
    }

    /// Closes the file; later calls raise `ValueError`. Operations still running finish first
    /// (they hold the descriptors). Closing twice is allowed. As with Python's files, a file
    /// system that reports only at close that written data did not reach storage (NFS, FUSE:
    /// `EIO`, `ENOSPC`) makes this raise `OSError`; the file is closed all the same.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(file) = self.lock().take() else {
            return Ok(());
        };
        without_gil(py, || file.close())?.map_err(to_pyerr)
    }

    /// Whether the file is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// The file descriptor (of the buffered descriptor; the O_DIRECT one is internal).
    fn fileno(&self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        Ok(self.handle()?.as_raw_fd())
    }

    /// The path the file was opened with, as a string.
    #[getter]
    fn path(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }

    /// The mode the file was opened with (`r`, `r+`, `w`, `w+`, `a`, `a+`, `x` or `x+`).
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode.as_str()
    }

    /// The file's current size in bytes.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        let file = self.handle()?;
        without_gil(py, || file.len())?.map_err(to_pyerr)
    }

    /// Returns the file itself; a closed file is refused, as Python's own files refuse it.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().closed() {
            return Err(closed_file());
        }
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferrio.File path={:?} mode={:?}{}>",
            self.path.display().to_string(),
            self.mode.as_str(),
            if self.closed() { " closed" } else { "" }
        )
    }
}
