//! The safetensors format for `ferrio.safetensors`: reading and validating a header (GIL
//! released) of a local file or of a remote object (`s3://`, `gs://`, `az://`, `http(s)://`:
//! ranged GETs of the header alone), parsing one from bytes, and building the header of a new
//! file. Tensor bytes move through `File`/`RemoteFile` in the Python layer; nothing here reads
//! or writes them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ferrio::safetensors::{header_bytes, Dtype, Header, TensorSpec};
use ferrio::{Error, RemoteFile};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{to_pyerr, SafetensorError};
use crate::gil::without_gil;

/// One tensor of a header as Python sees it: `(name, dtype, shape, begin, end)`, offsets
/// relative to the data section.
type PyTensor = (String, &'static str, Vec<u64>, u64, u64);

/// `(data_start, metadata or None, tensors in data-offset order)`.
type PyHeader = (u64, Option<BTreeMap<String, String>>, Vec<PyTensor>);

fn to_py(h: Header) -> PyHeader {
    let start = h.data_start();
    let tensors = h
        .tensors
        .into_iter()
        .map(|t| (t.name, t.dtype.name(), t.shape, t.begin, t.end))
        .collect();
    (start, h.metadata, tensors)
}

/// Bytes of a remote object's first GET: the whole header of most checkpoints (a header is
/// about 100 bytes per tensor), so one round trip usually suffices.
const FIRST_GET: usize = 256 << 10;

/// Reads and validates the header of the safetensors object `object` (opened from `url`) with
/// ranged GETs: the first [`FIRST_GET`] bytes, then the rest of the header if it is longer.
fn read_remote_header(object: &RemoteFile, url: &str) -> ferrio::Result<Header> {
    let at_url = |e: Error| match e {
        Error::Safetensors { tensor, rule, .. } => Error::Safetensors {
            path: PathBuf::from(url),
            tensor,
            rule,
        },
        other => other,
    };
    let first = usize::try_from(object.len()).map_or(FIRST_GET, |n| n.min(FIRST_GET));
    let mut prefix = vec![0u8; first];
    let got = object.read_at(&mut prefix, 0)?;
    prefix.truncate(got);
    let n = Header::json_len(&prefix, object.len()).map_err(at_url)?;
    // `json_len` checked `8 + n` against the object's size and the header limit.
    let total = (8 + n) as usize;
    if total > prefix.len() {
        let have = prefix.len();
        prefix.resize(total, 0);
        let got = object.read_at(&mut prefix[have..], have as u64)?;
        prefix.truncate(have + got);
    }
    Header::parse(&prefix, object.len()).map_err(at_url)
}

/// Reads and validates the header of a safetensors file: an open `ferrio.File` or
/// `ferrio.RemoteFile` (whose later reads then see the same file or object version), the file
/// at a path, or the object at a remote URL (a `str` that `ferrio.is_remote_url` accepts).
#[pyfunction]
pub(crate) fn safetensors_read_header(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
) -> PyResult<PyHeader> {
    if let Ok(open) = path.cast::<crate::file::File>() {
        let file = open.get().handle()?;
        let h = without_gil(py, || Header::read(&file))?;
        return Ok(to_py(h.map_err(to_pyerr)?));
    }
    if let Ok(open) = path.cast::<crate::remote::RemoteFile>() {
        let object = open.get().handle()?;
        let url = object.url().to_string();
        let h = without_gil(py, || read_remote_header(&object, &url))?;
        return Ok(to_py(h.map_err(to_pyerr)?));
    }
    let url = path
        .extract::<String>()
        .ok()
        .filter(|p| ferrio::remote::is_remote_url(p));
    let h = match url {
        Some(url) => without_gil(py, || {
            RemoteFile::open(&url).and_then(|object| read_remote_header(&object, &url))
        })?,
        None => {
            let path = crate::paths::fs_path(path)?;
            without_gil(py, || Header::read_path(&path))?
        }
    };
    Ok(to_py(h.map_err(to_pyerr)?))
}

/// Validates the header at the start of `data`, the whole content of a safetensors file.
#[pyfunction]
pub(crate) fn safetensors_parse_header(data: &[u8]) -> PyResult<PyHeader> {
    let h = Header::parse(data, data.len() as u64).map_err(to_pyerr)?;
    Ok(to_py(h))
}

/// Where one tensor goes in a new file: `(name, begin, end)` in the data section.
type Placed = (String, u64, u64);

/// The header of a new file for `tensors` (`(name, dtype, shape)` each) and `metadata`:
/// `(header bytes, [(name, begin, end)] in write order)`, as `safetensors` writes it.
#[pyfunction]
#[pyo3(signature = (tensors, metadata=None))]
pub(crate) fn safetensors_header_bytes<'py>(
    py: Python<'py>,
    tensors: Vec<(String, String, Vec<u64>)>,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<(Bound<'py, PyBytes>, Vec<Placed>)> {
    let specs = tensors
        .into_iter()
        .map(|(name, dtype, shape)| {
            let dtype = dtype
                .parse::<Dtype>()
                .map_err(|e| SafetensorError::new_err(format!("tensor {name:?}: {e}")))?;
            Ok(TensorSpec { name, dtype, shape })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let (bytes, places) = header_bytes(&specs, metadata.as_ref()).map_err(to_pyerr)?;
    let places = places
        .into_iter()
        .map(|p| (p.name, p.begin, p.end))
        .collect();
    Ok((PyBytes::new(py, &bytes), places))
}

/// Every dtype the format knows, `(name, bits)`, in the format's enum order.
#[pyfunction]
pub(crate) fn safetensors_dtypes() -> Vec<(&'static str, u64)> {
    Dtype::ALL.iter().map(|d| (d.name(), d.bits())).collect()
}
