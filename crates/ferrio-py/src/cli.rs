//! The `ferrio` console script: the command line's Rust logic, run from the Python package.

use std::ffi::OsString;

use pyo3::prelude::*;

use crate::gil::without_gil;

/// Runs the `ferrio` command line with `argv` (program name first) and returns its exit code.
///
/// The GIL is released while it runs. The command line installs its own Ctrl-C handler (it
/// stops cleanly and exits with 130), replacing Python's for the rest of the process: meant for
/// the console script, whose process ends with the command.
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> PyResult<i32> {
    without_gil(py, || ferrio_cli::run(argv))
}
