//! Python exceptions: the `FerrioError` root and its subclasses, and the one mapping from
//! [`ferrio::Error`] to a Python exception.
//!
//! OS errors become `OSError` built from `(errno, strerror, filename)`, which Python itself turns
//! into the matching subclass (`FileNotFoundError`, `PermissionError`, ...). Everything that is
//! not an OS error, a bad argument or a bad mode derives from `FerrioError`; a broken
//! safetensors file raises `SafetensorError`, a `ValueError` as in `safetensors`; a copy onto
//! its own source `shutil.SameFileError`.

use pyo3::exceptions::{PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    ferrio,
    FerrioError,
    pyo3::exceptions::PyException,
    "Root of every ferrio error that is not an OSError or a ValueError."
);
pyo3::create_exception!(
    ferrio,
    CancelledError,
    FerrioError,
    "The operation was cancelled (IOFuture.cancel(), or Ctrl-C while waiting) before it finished."
);
pyo3::create_exception!(
    ferrio,
    CudaUnavailableError,
    FerrioError,
    "A GPU array was given but CUDA cannot be used in this process; the message says why."
);
pyo3::create_exception!(ferrio, CudaError, FerrioError, "A CUDA driver call failed.");
pyo3::create_exception!(
    ferrio.safetensors,
    SafetensorError,
    PyValueError,
    "A safetensors file breaks a rule of the format; the message names the tensor and the rule."
);
pyo3::import_exception!(io, UnsupportedOperation);
pyo3::import_exception!(shutil, SameFileError);

/// The `ValueError` every method of a closed file raises, worded as Python's own files do.
pub(crate) fn closed_file() -> PyErr {
    PyValueError::new_err("I/O operation on closed file")
}

/// `strerror`-style text of an OS error: Rust's message without its ` (os error N)` suffix.
fn strerror(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Turns a library error into the Python exception a user of `open()` would expect.
pub(crate) fn to_pyerr(e: ferrio::Error) -> PyErr {
    use ferrio::Error as E;
    match &e {
        E::Io {
            op,
            path,
            offset,
            len,
            source,
        } => os_error(
            source,
            if *len == 0 {
                format!("{} ({op})", strerror(source))
            } else {
                format!(
                    "{} ({op} at offset {offset}, {len} bytes)",
                    strerror(source)
                )
            },
            path,
        ),
        E::Open { path, source, .. } => os_error(source, strerror(source), path),
        E::Fs {
            action,
            path,
            source,
        } => os_error(
            source,
            format!("{} ({})", strerror(source), action_of_path(action)),
            path,
        ),
        E::InvalidArgument(_) | E::InvalidSetting { .. } => PyValueError::new_err(e.to_string()),
        E::BadMode { .. } => UnsupportedOperation::new_err(e.to_string()),
        E::Cancelled => CancelledError::new_err(e.to_string()),
        E::TimedOut => PyTimeoutError::new_err(e.to_string()),
        E::CudaUnavailable { .. } => CudaUnavailableError::new_err(e.to_string()),
        E::Cuda { .. } => CudaError::new_err(e.to_string()),
        E::Safetensors { .. } => SafetensorError::new_err(e.to_string()),
        // As `shutil.copy` raises it: an `OSError` that `except shutil.SameFileError` catches.
        E::SameFile { .. } => SameFileError::new_err(e.to_string()),
        _ => FerrioError::new_err(e.to_string()),
    }
}

/// What was being done to the error's file, for the text before its name: an action phrased
/// to have the path after it ("create a temporary file for") ends in "it".
fn action_of_path(action: &str) -> String {
    let action = action.trim_end_matches(':');
    match action.rsplit(' ').next() {
        Some("for" | "of" | "at") => format!("{action} it"),
        _ => action.to_string(),
    }
}

/// `OSError(errno, strerror, filename)`: Python picks the subclass from `errno`. An error that
/// did not come with an OS code (a short write, say) gets the code closest to its kind.
fn os_error(source: &std::io::Error, text: String, path: &std::path::Path) -> PyErr {
    use std::io::ErrorKind as K;
    let errno = source.raw_os_error().unwrap_or(match source.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::InvalidInput => libc::EINVAL,
        K::Interrupted => libc::EINTR,
        K::OutOfMemory => libc::ENOMEM,
        K::WriteZero => libc::ENOSPC,
        K::TimedOut => libc::ETIMEDOUT,
        _ => libc::EIO,
    });
    PyOSError::new_err((errno, text, path.as_os_str().to_os_string()))
}
