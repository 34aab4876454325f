//! Buffer validation: turns the object a caller passed into memory a read may fill or a write may
//! read, or a `ValueError`/`TypeError` before any I/O starts.
//!
//! Host memory comes through the buffer protocol at byte level, so an array of any dtype and
//! shape works. The export ([`PyUntypedBuffer`]) is kept alive by whoever issued the I/O until
//! the I/O is done: while it is held the exporter cannot free or resize its memory (numpy
//! refuses `resize`, bytearray raises `BufferError`), and it is released afterwards.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::errors::CudaUnavailableError;

/// Which way the bytes go, seen from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// File to memory: the memory must be writable.
    Read,
    /// Memory to file: any readable memory.
    Write,
}

/// Memory an operation moves bytes into or out of.
pub(crate) enum Target {
    /// Host memory exported through the buffer protocol.
    Host(HostBuffer),
    // `Device(..)` goes here with the GPU issue: arrays exposing `__cuda_array_interface__` or
    // DLPack (`__dlpack__`/`__dlpack_device__`), kept alive the same way as `HostBuffer` keeps
    // its export, and moved through the engine's bounce-buffer ring.
}

/// A validated, C-contiguous host buffer and the number of bytes to move.
pub(crate) struct HostBuffer {
    view: PyUntypedBuffer,
    len: usize,
}

impl HostBuffer {
    /// Start of the memory.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.view.buf_ptr().cast()
    }

    /// Bytes to move (the `size` asked for, or the whole buffer).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The export, to be held until the I/O is done and then dropped (which releases it).
    pub(crate) fn into_view(self) -> PyUntypedBuffer {
        self.view
    }
}

/// Validates `obj` for `direction` and `size` (`None`: the whole buffer).
///
/// Raises `TypeError` for an object that is not a buffer, `ValueError` for a read-only buffer
/// given to a read, a non-contiguous buffer, or a `size` that is negative or larger than the
/// buffer.
pub(crate) fn target(
    obj: &Bound<'_, PyAny>,
    direction: Direction,
    size: Option<i64>,
) -> PyResult<Target> {
    let view = match PyUntypedBuffer::get(obj) {
        Ok(view) => view,
        Err(e) => return Err(not_a_buffer(obj, e)),
    };
    if direction == Direction::Read && view.readonly() {
        return Err(PyValueError::new_err(format!(
            "cannot read into a read-only buffer ({}): pass writable memory such as a \
             bytearray or numpy.empty(...), not bytes or an array with writeable=False",
            type_name(obj)
        )));
    }
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) is not C-contiguous: ferrio moves bytes into and out of one \
             contiguous block; pass numpy.ascontiguousarray(a) or a copy",
            type_name(obj)
        )));
    }
    let available = view.len_bytes();
    let len = match size {
        None => available,
        Some(s) if s < 0 => {
            return Err(PyValueError::new_err(format!(
                "size must be at least 0, not {s}"
            )))
        }
        Some(s) => match usize::try_from(s) {
            Ok(s) if s <= available => s,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "size {s} is larger than the buffer ({available} bytes)"
                )))
            }
        },
    };
    Ok(Target::Host(HostBuffer { view, len }))
}

/// The error for an object without the buffer protocol; GPU arrays get their own.
fn not_a_buffer(obj: &Bound<'_, PyAny>, cause: PyErr) -> PyErr {
    let py = obj.py();
    // DLPack device type 1 is the CPU; anything else (2 = CUDA, ...) is device memory.
    let dlpack_device = obj
        .call_method0(pyo3::intern!(py, "__dlpack_device__"))
        .and_then(|d| d.get_item(0))
        .and_then(|t| t.extract::<i64>());
    let gpu = obj
        .hasattr(pyo3::intern!(py, "__cuda_array_interface__"))
        .unwrap_or(false)
        || dlpack_device.is_ok_and(|t| t != 1);
    let err = if gpu {
        CudaUnavailableError::new_err(format!(
            "{} looks like a GPU array; GPU memory is not supported by this build of ferrio yet",
            type_name(obj)
        ))
    } else {
        PyTypeError::new_err(format!(
            "expected an object with the buffer protocol (numpy array, bytearray, memoryview, \
             mmap, ...), not {}",
            type_name(obj)
        ))
    };
    err.set_cause(py, Some(cause));
    err
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}
