//! `ferrio.stats()`: the statistics of every worker pool, as dictionaries.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Statistics of every worker pool started so far, one dict per pool, sorted by key.
#[pyfunction]
pub(crate) fn stats(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    ferrio::stats()
        .into_iter()
        .map(|p| {
            let d = PyDict::new(py);
            d.set_item("key", &p.key)?;
            d.set_item("threads", p.threads)?;
            d.set_item("max_threads", p.max_threads)?;
            d.set_item("bytes_read", p.bytes_read)?;
            d.set_item("bytes_written", p.bytes_written)?;
            d.set_item("tasks", p.tasks)?;
            d.set_item("queued", p.queued)?;
            d.set_item("busy_seconds", p.busy_ns as f64 / 1e9)?;
            d.set_item("bytes_direct", p.bytes_direct)?;
            d.set_item("bytes_buffered", p.bytes_buffered)?;
            Ok(d)
        })
        .collect()
}
