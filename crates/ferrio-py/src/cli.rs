//! The `ferrio` console script: the command line's Rust logic, run from the Python package.

use std::ffi::OsString;

use pyo3::prelude::*;

use crate::gil::without_gil;

/// Runs the `ferrio` command line with `argv` (program name first) and returns its exit code.
///
/// The GIL is released while it runs. The command line installs its own Ctrl-C and `SIGTERM`
/// handler while it runs (it stops cleanly and returns 130, or 143 for `SIGTERM`) and puts
/// Python's back when it returns, so Ctrl-C raises `KeyboardInterrupt` again afterwards.
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> PyResult<i32> {
    without_gil(py, || ferrio_cli::run(argv))
}
