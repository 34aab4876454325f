//! `ferrio._native`: the Python bindings of ferrio, re-exported by the `ferrio` package.
//!
//! One file per Python class (`file.rs`: `File`, `remote.rs`: `RemoteFile`, `RemoteWriter`, `future.rs`: `IOFuture`, `pagecache.rs`:
//! `Residency`), plus buffer validation (`buffer.rs`), the exception mapping (`errors.rs`),
//! settings (`config.rs`), pool statistics (`stats.rs`), parallel copy (`copy.rs`), the pool memory resource (`memory.rs`), the console script (`cli.rs`), the safetensors format (`safetensors.rs`) and the one helper that releases the
//! GIL (`gil.rs`).

mod buffer;
mod cli;
mod config;
mod copy;
mod errors;
mod file;
mod future;
mod gil;
mod memory;
mod pagecache;
mod paths;
mod remote;
mod safetensors;
mod stats;

use pyo3::prelude::*;

/// The native module. Its contents are documented in `python/ferrio/_native.pyi`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // On import: growing the descriptor table now is free while the process has one thread,
    // and with threads about it waits out its grace period in the background; later, among a
    // GPU library's threads, the first remote read's sockets would wait for it to grow.
    ferrio::remote::reserve_sockets_soon();
    // On a machine with an NVIDIA driver, the first GPU read's ring memory is faulted in now, in
    // the background, rather than on that read's critical path.
    ferrio::prepare_pinned_soon();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<file::File>()?;
    m.add_class::<remote::RemoteFile>()?;
    m.add_class::<remote::RemoteWriter>()?;
    m.add_class::<future::IOFuture>()?;
    m.add_class::<pagecache::Residency>()?;
    m.add_class::<memory::PoolResource>()?;
    m.add_class::<memory::Allocation>()?;
    m.add("FerrioError", py.get_type::<errors::FerrioError>())?;
    m.add("CancelledError", py.get_type::<errors::CancelledError>())?;
    m.add(
        "CudaUnavailableError",
        py.get_type::<errors::CudaUnavailableError>(),
    )?;
    m.add("CudaError", py.get_type::<errors::CudaError>())?;
    m.add("SafetensorError", py.get_type::<errors::SafetensorError>())?;
    m.add_function(wrap_pyfunction!(file::open, m)?)?;
    m.add_function(wrap_pyfunction!(remote::open_url, m)?)?;
    m.add_function(wrap_pyfunction!(remote::is_remote_url, m)?)?;
    m.add_function(wrap_pyfunction!(remote::local_path, m)?)?;
    m.add_function(wrap_pyfunction!(future::wait, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::residency, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::drop_cache, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::drop_system_cache, m)?)?;
    m.add_function(wrap_pyfunction!(config::config_get, m)?)?;
    m.add_function(wrap_pyfunction!(config::config_set, m)?)?;
    m.add_function(wrap_pyfunction!(config::config_settings, m)?)?;
    m.add_function(wrap_pyfunction!(config::config_describe, m)?)?;
    m.add_function(wrap_pyfunction!(config::env_error, m)?)?;
    m.add_function(wrap_pyfunction!(config::env_warnings, m)?)?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(stats::stats, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_read_header, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_parse_header, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_header_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_dtypes, m)?)?;
    Ok(())
}
