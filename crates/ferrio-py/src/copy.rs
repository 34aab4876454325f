//! `ferrio.copy(src, dst, ...)`: the engine's parallel copy, with the GIL released and Ctrl-C
//! honoured (it cancels the copy; no partial file is left).

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_pyerr;
use crate::gil::{release_gil, Blocking};

/// A copy running on its own thread, waited on in slices.
struct Running {
    done: mpsc::Receiver<ferrio::Result<ferrio::CopyReport>>,
    progress: Arc<ferrio::CopyProgress>,
    finished: Option<ferrio::Result<ferrio::CopyReport>>,
}

impl Blocking for Running {
    type Output = ferrio::Result<ferrio::CopyReport>;

    fn wait_slice(&mut self, slice: Duration) -> Option<Self::Output> {
        if let Some(out) = self.finished.take() {
            return Some(out);
        }
        match self.done.recv_timeout(slice) {
            Ok(out) => Some(out),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Err(ferrio::Error::InvalidArgument(
                "the copy thread stopped".into(),
            ))),
        }
    }

    fn abort(&mut self) {
        // Cancelled files are removed before the copy returns; wait for that.
        self.progress.cancel();
        self.finished = self.done.recv().ok();
    }
}

/// Copies files or directory trees like `cp`: in parallel across files and within large files,
/// each file written under a temporary name and renamed when complete. A source or `dst` may be
/// a URL of remote storage (see `ferrio::copy`): uploads complete only when whole, downloads are
/// renamed into place when complete. Returns a dict with
/// `files`, `bytes`, `seconds`, ...; raises the first error (an `OSError` subclass) if any entry
/// failed, with a note naming the others. As `shutil.copy`: a directory without `recursive`
/// raises `IsADirectoryError`, a file onto itself `shutil.SameFileError`.
#[pyfunction]
#[pyo3(signature = (src, dst, *, recursive=false, preserve=false, verify=false, follow_symlinks=false, sync=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::paths::fs_path)] dst: PathBuf,
    recursive: bool,
    preserve: bool,
    verify: bool,
    follow_symlinks: bool,
    sync: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let sources: Vec<PathBuf> = match crate::paths::fs_path(src) {
        Ok(one) => vec![one],
        Err(_) => src
            .try_iter()?
            .map(|item| crate::paths::fs_path(&item?))
            .collect::<PyResult<_>>()?,
    };
    let progress = ferrio::CopyProgress::new();
    let options = ferrio::CopyOptions::new()
        .recursive(recursive)
        .preserve(preserve)
        .verify(verify)
        .follow_symlinks(follow_symlinks)
        .sync(sync)
        .progress(Arc::clone(&progress));
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("ferrio-copy".into())
        .spawn(move || {
            let _ = tx.send(ferrio::copy(sources, dst, &options));
        })
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("cannot start a thread: {e}")))?;
    let running = Running {
        done: rx,
        progress,
        finished: None,
    };
    // Without a timeout, `release_gil` returns only with the copy's outcome.
    let report = release_gil(py, running, None)?
        .ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("the copy ended without a result")
        })?
        .map_err(to_pyerr)?;
    if let Err(first) = report.check() {
        let err = to_pyerr(first);
        // The others are named in a note (PEP 678), as `ferrio cp` names each on stderr: a
        // caller shown only the first would not know the rest were skipped too.
        let others: Vec<String> = report
            .errors
            .iter()
            .skip(1)
            .map(|e| format!("  {e}"))
            .collect();
        if !others.is_empty() {
            let note = format!(
                "{} more could not be copied:\n{}",
                others.len(),
                others.join("\n")
            );
            err.value(py).call_method1("add_note", (note,))?;
        }
        return Err(err);
    }
    let d = PyDict::new(py);
    d.set_item("files", report.files)?;
    d.set_item("dirs", report.dirs)?;
    d.set_item("symlinks", report.symlinks)?;
    d.set_item("bytes", report.bytes)?;
    d.set_item("verified", report.verified)?;
    d.set_item("seconds", report.seconds)?;
    Ok(d)
}
