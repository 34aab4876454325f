//! Buffer validation: turns the object a caller passed into memory a read may fill or a write may
//! read, or a `ValueError`/`TypeError` before any I/O starts.
//!
//! GPU memory comes through `__cuda_array_interface__` (CuPy, PyTorch, Numba; its `stream` is
//! synchronised before any I/O) or DLPack (`__dlpack__` with `__dlpack_device__` of a CUDA
//! device; the producer is asked to make the legacy default stream wait for its work, which is
//! then synchronised). The array object (or the DLPack capsule) is kept alive until the I/O is
//! done.
//!
//! Host memory comes through the buffer protocol at byte level, so an array of any dtype and
//! shape works. The export ([`Export`]) is kept alive by whoever issued the I/O until the I/O is
//! done: while it is held the exporter cannot free or resize its memory (numpy refuses `resize`,
//! bytearray raises `BufferError`), and it is released afterwards.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsuleMethods;

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
    /// GPU memory from `__cuda_array_interface__` or DLPack.
    Device(DeviceBuffer),
}

/// A validated, C-contiguous range of GPU memory, and what keeps it alive.
pub(crate) struct DeviceBuffer {
    /// Device address of the first byte.
    pub(crate) ptr: u64,
    /// Bytes to move.
    pub(crate) len: usize,
    /// The array (or DLPack capsule) owning the memory, held until the I/O is done.
    pub(crate) owner: Py<PyAny>,
}

/// A buffer export taken with `PyObject_GetBuffer`, released (GIL held) when dropped.
///
/// Not pyo3's `PyUntypedBuffer`, which refuses exports without a shape or strides: the protocol
/// allows both for a 0-d array (a numpy scalar) and ctypes gives no strides, yet Python's own
/// `readinto` and `os.preadv` take them. ferrio needs only the start, the length, the format and
/// contiguity, which `PyBuffer_IsContiguous` judges with or without shape and strides.
pub(crate) struct Export(Box<ffi::Py_buffer>);

// SAFETY: the export only describes memory; it is released with the GIL held (see `Drop`), and
// whoever moves it across threads keeps the memory's use in line with the I/O's contract.
unsafe impl Send for Export {}
// SAFETY: as above; `&Export` only reads the description.
unsafe impl Sync for Export {}

impl Export {
    /// Exports `obj`'s buffer with `flags` (`PyBUF_*`).
    fn get(obj: &Bound<'_, PyAny>, flags: std::ffi::c_int) -> PyResult<Export> {
        let mut raw = Box::<ffi::Py_buffer>::new_uninit();
        // SAFETY: `obj` is a live object and `raw` room for one `Py_buffer`, which the call
        // fills on success (and leaves unowned on failure).
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), raw.as_mut_ptr(), flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: `PyObject_GetBuffer` succeeded, so it initialised the struct.
        Ok(Export(unsafe { raw.assume_init() }))
    }

    fn readonly(&self) -> bool {
        self.0.readonly != 0
    }

    /// The item format (`struct` syntax), if the exporter gave one.
    fn format(&self) -> Option<&std::ffi::CStr> {
        // SAFETY: a non-null `format` is a NUL-terminated string owned by the live export.
        (!self.0.format.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(self.0.format) })
    }

    fn is_c_contiguous(&self) -> bool {
        // SAFETY: `self.0` is a live export.
        unsafe { ffi::PyBuffer_IsContiguous(&*self.0, b'C' as std::ffi::c_char) != 0 }
    }

    fn len_bytes(&self) -> usize {
        usize::try_from(self.0.len).unwrap_or(0)
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        // After interpreter shutdown there is nothing left to release it to.
        Python::try_attach(|_| {
            // SAFETY: the export is live and released exactly once, here, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.0) }
        });
    }
}

/// A validated, C-contiguous host buffer and the number of bytes to move.
pub(crate) struct HostBuffer {
    view: Export,
    len: usize,
}

impl HostBuffer {
    /// Start of the memory.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.view.0.buf.cast()
    }

    /// Bytes to move (the `size` asked for, or the whole buffer).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The export, to be held until the I/O is done and then dropped (which releases it).
    pub(crate) fn into_view(self) -> Export {
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
    let py = obj.py();
    if let Ok(cai) = obj.getattr(pyo3::intern!(py, "__cuda_array_interface__")) {
        return cuda_array(obj, &cai, direction, size).map(Target::Device);
    }
    if let Some(device_type) = dlpack_device_type(obj) {
        if device_type == DLPACK_CUDA || device_type == DLPACK_CUDA_MANAGED {
            return dlpack_array(obj, direction, size).map(Target::Device);
        }
    }
    let view = host_export(obj)?;
    if direction == Direction::Read && view.readonly() {
        return Err(PyValueError::new_err(format!(
            "cannot read into a read-only buffer ({}): pass writable memory such as a \
             bytearray or numpy.empty(...), not bytes or an array with writeable=False",
            type_name(obj)
        )));
    }
    let format = view.format().map(|f| f.to_bytes()).unwrap_or(b"B");
    if holds_object_pointers(format) {
        // Bytes from a file written over PyObject pointers would crash the interpreter.
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) holds Python object references (format {:?}): ferrio moves raw \
             bytes only, like numpy.fromfile; use a numeric or bytes dtype",
            type_name(obj),
            String::from_utf8_lossy(format)
        )));
    }
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) is not C-contiguous: ferrio moves bytes into and out of one \
             contiguous block; pass numpy.ascontiguousarray(a) or a copy",
            type_name(obj)
        )));
    }
    let len = checked_size(size, view.len_bytes())?;
    Ok(Target::Host(HostBuffer { view, len }))
}

/// Exports `obj`'s host buffer with its format, or without one where the exporter cannot say
/// it: numpy has no buffer format for datetime64 and timedelta64, yet exports their bytes as
/// `readinto` asks. Without a format, a numpy dtype that holds objects is refused as a format
/// with `O` would be.
fn host_export(obj: &Bound<'_, PyAny>) -> PyResult<Export> {
    let first = match Export::get(obj, ffi::PyBUF_FULL_RO) {
        Ok(view) => return Ok(view),
        Err(e) => e,
    };
    let Ok(view) = Export::get(obj, ffi::PyBUF_INDIRECT) else {
        return Err(not_a_buffer(obj, first));
    };
    let holds_objects = obj
        .getattr(pyo3::intern!(obj.py(), "dtype"))
        .and_then(|d| d.getattr(pyo3::intern!(obj.py(), "hasobject")))
        .and_then(|h| h.is_truthy())
        .unwrap_or(false);
    if holds_objects {
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) holds Python object references: ferrio moves raw bytes only, like \
             numpy.fromfile; use a numeric or bytes dtype",
            type_name(obj)
        )));
    }
    Ok(view)
}

/// Whether a buffer-protocol format string (`struct` syntax, with numpy's extensions) has an
/// `O` item, a `PyObject*`: field names between colons are skipped, since they may contain `O`.
fn holds_object_pointers(format: &[u8]) -> bool {
    let mut in_name = false;
    format.iter().any(|&c| {
        if c == b':' {
            in_name = !in_name;
        }
        !in_name && c == b'O'
    })
}

/// The bytes to move: `size`, which must fit in `available`, or all of it.
fn checked_size(size: Option<i64>, available: usize) -> PyResult<usize> {
    match size {
        None => Ok(available),
        Some(s) if s < 0 => Err(PyValueError::new_err(format!(
            "size must be at least 0, not {s}"
        ))),
        Some(s) => match usize::try_from(s) {
            Ok(s) if s <= available => Ok(s),
            _ => Err(PyValueError::new_err(format!(
                "size {s} is larger than the buffer ({available} bytes)"
            ))),
        },
    }
}

/// DLPack device types (`DLDeviceType`).
const DLPACK_CUDA: i64 = 2;
const DLPACK_CUDA_MANAGED: i64 = 13;

fn dlpack_device_type(obj: &Bound<'_, PyAny>) -> Option<i64> {
    obj.call_method0(pyo3::intern!(obj.py(), "__dlpack_device__"))
        .and_then(|d| d.get_item(0))
        .and_then(|t| t.extract::<i64>())
        .ok()
}

/// Bytes of `shape` items of `itemsize` bytes with optional `strides`; error unless C-contiguous.
fn contiguous_bytes(
    obj: &Bound<'_, PyAny>,
    shape: &[i64],
    strides: Option<&[i64]>,
    itemsize: i64,
) -> PyResult<usize> {
    if shape.iter().any(|&d| d < 0) || itemsize <= 0 {
        return Err(PyValueError::new_err(format!(
            "{} reports an invalid shape {shape:?} or item size {itemsize}",
            type_name(obj)
        )));
    }
    let items = shape.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
    let bytes = items.and_then(|n| n.checked_mul(itemsize));
    let Some(bytes) = bytes.and_then(|b| usize::try_from(b).ok()) else {
        return Err(PyValueError::new_err("the array is too large"));
    };
    if let (Some(strides), true) = (strides, bytes > 0) {
        let mut expect = itemsize;
        for (&dim, &stride) in shape.iter().zip(strides).rev() {
            if dim > 1 && stride != expect {
                return Err(PyValueError::new_err(format!(
                    "the GPU array ({}) is not C-contiguous: ferrio moves bytes into and out of \
                     one contiguous block; pass cupy.ascontiguousarray(a) or a.contiguous()",
                    type_name(obj)
                )));
            }
            expect *= dim;
        }
    }
    Ok(bytes)
}

fn read_only_error(obj: &Bound<'_, PyAny>) -> PyErr {
    PyValueError::new_err(format!(
        "cannot read into a read-only GPU array ({})",
        type_name(obj)
    ))
}

/// A device array described by `__cuda_array_interface__` (versions 2 and 3).
fn cuda_array(
    obj: &Bound<'_, PyAny>,
    cai: &Bound<'_, PyAny>,
    direction: Direction,
    size: Option<i64>,
) -> PyResult<DeviceBuffer> {
    let bad = |what: &str| {
        PyValueError::new_err(format!(
            "{}.__cuda_array_interface__ has no valid {what}",
            type_name(obj)
        ))
    };
    let (ptr, readonly): (u64, bool) = cai
        .get_item("data")
        .and_then(|d| d.extract())
        .map_err(|_| bad("'data'"))?;
    if direction == Direction::Read && readonly {
        return Err(read_only_error(obj));
    }
    let shape: Vec<i64> = cai
        .get_item("shape")
        .and_then(|d| d.extract())
        .map_err(|_| bad("'shape'"))?;
    let typestr: String = cai
        .get_item("typestr")
        .and_then(|d| d.extract())
        .map_err(|_| bad("'typestr'"))?;
    let itemsize: i64 = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| bad("'typestr'"))?;
    let strides: Option<Vec<i64>> = match cai.get_item("strides") {
        Ok(s) if !s.is_none() => Some(s.extract().map_err(|_| bad("'strides'"))?),
        _ => None,
    };
    let available = contiguous_bytes(obj, &shape, strides.as_deref(), itemsize)?;
    let len = checked_size(size, available)?;
    // Version 3: work on `stream` that produces the data must finish before anyone reads it.
    let stream: Option<usize> = cai.get_item("stream").ok().and_then(|s| s.extract().ok());
    if let (Some(stream), true) = (stream, ptr != 0) {
        sync_producer(ptr, stream)?;
    }
    Ok(DeviceBuffer {
        ptr,
        len,
        owner: obj.clone().unbind(),
    })
}

/// Makes the host wait for `stream`, in the context of the memory at `ptr`.
fn sync_producer(ptr: u64, stream: usize) -> PyResult<()> {
    use ferrio::cuda::{self, Memory};
    let Memory::Device { context, .. } =
        cuda::try_classify(ptr as usize).map_err(crate::errors::to_pyerr)?
    else {
        return Ok(()); // not device memory: the engine refuses it with a clear error
    };
    // SAFETY: the producer named this stream as the one its work on the array runs on; it is a
    // live stream of the array's context (or 1/2, the default streams).
    unsafe { cuda::synchronize_stream(context, stream) }.map_err(crate::errors::to_pyerr)
}

/// The C structs of DLPack (v0.x, unversioned), as far as ferrio reads them.
#[repr(C)]
struct DlTensor {
    data: *mut std::ffi::c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// A device array exported through DLPack. The capsule stays unconsumed (named `dltensor`) and
/// is held until the I/O is done; its destructor then frees the export.
fn dlpack_array(
    obj: &Bound<'_, PyAny>,
    direction: Direction,
    size: Option<i64>,
) -> PyResult<DeviceBuffer> {
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("stream", 1)?;
    // Ask the producer to order its work before the legacy default stream, then wait for that.
    let (capsule, synced) =
        match obj.call_method(pyo3::intern!(py, "__dlpack__"), (), Some(&kwargs)) {
            Ok(c) => (c, true),
            Err(_) => (obj.call_method0(pyo3::intern!(py, "__dlpack__"))?, false),
        };
    let capsule = capsule.cast_into::<pyo3::types::PyCapsule>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{}.__dlpack__() did not return a capsule",
            type_name(obj)
        ))
    })?;
    let raw = capsule.pointer_checked(Some(c"dltensor")).map_err(|_| {
        PyValueError::new_err("the DLPack capsule is not an unconsumed \"dltensor\"")
    })?;
    // SAFETY: a capsule named "dltensor" holds a `DLManagedTensor*`, whose first member is the
    // `DLTensor`; the producer keeps it valid while the capsule lives, and we hold the capsule.
    let t = unsafe { &*(raw.as_ptr() as *const DlTensor) };
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err("bad DLPack ndim"))?;
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: `shape` points to `ndim` int64s in a live DLTensor.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    let strides: Option<Vec<i64>> = if t.strides.is_null() || ndim == 0 {
        None
    } else {
        // SAFETY: non-null `strides` points to `ndim` int64s (in items) in a live DLTensor.
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec())
    };
    let itemsize = (i64::from(t.dtype_bits) + 7) / 8 * i64::from(t.dtype_lanes.max(1));
    let strides_bytes: Option<Vec<i64>> = strides.map(|s| s.iter().map(|x| x * itemsize).collect());
    let available = contiguous_bytes(obj, &shape, strides_bytes.as_deref(), itemsize)?;
    let len = checked_size(size, available)?;
    let ptr = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| PyValueError::new_err("bad DLPack data pointer"))?;
    let _ = direction; // unversioned DLPack has no read-only flag: exports are writable
    if synced && ptr != 0 {
        sync_producer(ptr, 1)?;
    }
    Ok(DeviceBuffer {
        ptr,
        len,
        owner: capsule.into_any().unbind(),
    })
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
    } else if cause.is_instance_of::<PyTypeError>(py) {
        PyTypeError::new_err(format!(
            "expected an object with the buffer protocol (numpy array, bytearray, memoryview, \
             mmap, ...), not {}",
            type_name(obj)
        ))
    } else {
        // A buffer type that refused this time (a closed mmap, a released memoryview): say why.
        PyValueError::new_err(format!(
            "cannot use the buffer of this {}: {}",
            type_name(obj),
            cause.value(py)
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
