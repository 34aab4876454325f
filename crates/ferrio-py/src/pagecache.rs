//! Page-cache helpers: how much of a file is in memory, dropping a file's pages, dropping the
//! whole system's cache. Thin wrappers of [`ferrio::pagecache`], run with the GIL released.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::to_pyerr;
use crate::gil::without_gil;

/// How much of a file range is in the page cache (`ferrio.residency(path)`).
#[pyclass(frozen, eq, module = "ferrio", name = "Residency", get_all)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Residency {
    /// Bytes of the range that are in the page cache (whole pages, clipped to the range).
    cached_bytes: u64,
    /// Cached bytes that are dirty (written, not yet on the device).
    dirty_bytes: u64,
    /// Bytes in the range, clipped to the file's size.
    range_bytes: u64,
}

#[pymethods]
impl Residency {
    /// Share of the range that is cached, from 0.0 to 1.0 (1.0 for an empty range).
    #[getter]
    fn share(&self) -> f64 {
        ferrio::pagecache::Residency {
            cached_bytes: self.cached_bytes,
            dirty_bytes: self.dirty_bytes,
            range_bytes: self.range_bytes,
        }
        .share()
    }

    fn __repr__(&self) -> String {
        format!(
            "Residency(cached_bytes={}, dirty_bytes={}, range_bytes={})",
            self.cached_bytes, self.dirty_bytes, self.range_bytes
        )
    }
}

/// Page-cache residency of `size` bytes (None: to the end) at `offset` of the file at `path`.
#[pyfunction]
#[pyo3(signature = (path, offset=0, size=None))]
pub(crate) fn residency(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::paths::fs_path)] path: PathBuf,
    offset: i64,
    size: Option<i64>,
) -> PyResult<Residency> {
    let offset = u64::try_from(offset)
        .map_err(|_| PyValueError::new_err(format!("offset must be at least 0, not {offset}")))?;
    let size = size
        .map(|s| {
            u64::try_from(s)
                .map_err(|_| PyValueError::new_err(format!("size must be at least 0, not {s}")))
        })
        .transpose()?;
    let r =
        without_gil(py, || ferrio::pagecache::residency(&path, offset, size))?.map_err(to_pyerr)?;
    Ok(Residency {
        cached_bytes: r.cached_bytes,
        dirty_bytes: r.dirty_bytes,
        range_bytes: r.range_bytes,
    })
}

/// Drops the file's pages from the page cache (dirty pages are written first). Needs no
/// privileges; pages mapped or locked by a process may stay.
#[pyfunction]
pub(crate) fn drop_cache(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::paths::fs_path)] path: PathBuf,
) -> PyResult<()> {
    without_gil(py, || ferrio::pagecache::drop_file(&path))?.map_err(to_pyerr)
}

/// Drops the whole system's clean page cache. Needs root: raises `PermissionError` otherwise.
#[pyfunction]
pub(crate) fn drop_system_cache(py: Python<'_>) -> PyResult<()> {
    without_gil(py, ferrio::pagecache::drop_system_cache)?.map_err(to_pyerr)
}
