//! Path arguments: whatever Python's own `open()` takes (`str`, `bytes`, `os.PathLike` of
//! either) becomes a [`PathBuf`], with the bytes of a `bytes` path kept exactly as given, and a
//! `file://` URL the local path it names.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// `os.fspath(obj)` as a [`PathBuf`]: a `str` is encoded with the file-system encoding (as
/// Python does), a `bytes` path is used byte for byte. Anything else raises `TypeError`.
pub(crate) fn fs_path(obj: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let fspath = obj.py().import("os")?.getattr("fspath")?.call1((obj,))?;
    if let Ok(bytes) = fspath.cast::<PyBytes>() {
        return Ok(OsString::from_vec(bytes.as_bytes().to_vec()).into());
    }
    let path = fspath.extract::<PathBuf>()?;
    // A `file://` URL names a local path, opened as that path is.
    match ferrio::local_path(&path).map_err(crate::errors::to_pyerr)? {
        std::borrow::Cow::Owned(local) => Ok(local),
        std::borrow::Cow::Borrowed(_) => Ok(path),
    }
}
