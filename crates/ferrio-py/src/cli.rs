//! The `ferrio` console script: the command line's Rust logic, run from the Python package.

use std::ffi::OsString;

use pyo3::prelude::*;

use crate::gil::without_gil;

/// Runs the `ferrio` command line with `argv` (program name first) and returns its exit code.
///
/// The GIL is released while it runs. The console script restores the default SIGINT action
/// first, so Ctrl-C ends the command as it ends the native binary.
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> PyResult<i32> {
    without_gil(py, || run_cli(argv))
}

/// Placeholder until the `ferrio-cli` crate exposes `run(args) -> i32` as a library: reports
/// that this build has no command line.
fn run_cli(argv: Vec<OsString>) -> i32 {
    let _ = argv;
    eprintln!("ferrio: this build of the Python package has no command line yet");
    2
}
