//! `ferrio._native.PoolResource` and `Allocation`: the stream-ordered pool memory resource over
//! CUDA device memory, for Python (`ferrio.memory.PoolResource` makes it CuPy's allocator).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use ferrio::memory::{CudaStreams, DeviceUpstream, PoolOptions, StreamHandle};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_pyerr;

type DevicePool = ferrio::memory::PoolResource<DeviceUpstream, CudaStreams>;

/// A pool of device memory on one GPU, with a free list per CUDA stream.
#[pyclass(frozen, module = "ferrio._native")]
pub(crate) struct PoolResource {
    pool: Arc<DevicePool>,
    /// Raw stream handle -> the pool's handle for it and the Python object that owns the stream
    /// (held, so the handle cannot be destroyed and reused while the pool knows it).
    streams: Mutex<HashMap<usize, (StreamHandle, Py<PyAny>)>>,
    device: usize,
}

impl PoolResource {
    fn stream(&self, raw: usize, owner: Option<Py<PyAny>>, py: Python<'_>) -> StreamHandle {
        let mut map = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(raw).or_insert_with(|| {
            // SAFETY: `raw` is a live stream of this pool's device (or 0, the legacy default
            // stream), kept alive by `owner`, which the map holds until `detach_stream`.
            let handle = unsafe { self.pool.order().register_stream(raw as *mut c_void) };
            (handle, owner.unwrap_or_else(|| py.None()))
        });
        entry.0.clone()
    }
}

#[pymethods]
impl PoolResource {
    #[new]
    #[pyo3(signature = (device=0, initial_bytes=0, grow_bytes=33_554_432, max_bytes=None))]
    fn new(
        device: usize,
        initial_bytes: usize,
        grow_bytes: usize,
        max_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let order = CudaStreams::for_device(device).map_err(to_pyerr)?;
        let upstream = DeviceUpstream::new(order.context()).map_err(to_pyerr)?;
        let options = PoolOptions::default()
            .initial_bytes(initial_bytes)
            .grow_bytes(grow_bytes.max(1))
            .max_bytes(max_bytes);
        let pool = DevicePool::new(upstream, order, options).map_err(to_pyerr)?;
        Ok(PoolResource {
            pool: Arc::new(pool),
            streams: Mutex::new(HashMap::new()),
            device,
        })
    }

    /// The GPU this pool allocates on.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// Allocates `nbytes` for use on the raw CUDA stream `stream` (0: the legacy default
    /// stream); `owner` (e.g. the CuPy `Stream`) is kept alive while the pool knows the stream.
    #[pyo3(signature = (nbytes, stream=0, owner=None))]
    fn allocate(
        &self,
        py: Python<'_>,
        nbytes: usize,
        stream: usize,
        owner: Option<Py<PyAny>>,
    ) -> PyResult<Allocation> {
        let handle = self.stream(stream, owner, py);
        let pool = Arc::clone(&self.pool);
        let block = py
            .detach(|| pool.allocate(nbytes.max(1), &handle))
            .map_err(to_pyerr)?;
        Ok(Allocation {
            pool,
            stream: handle,
            ptr: block.addr(),
            size: block.size(),
        })
    }

    /// Forgets the raw stream `stream` (call before destroying it): its blocks become free for
    /// other streams once its pending work is done, and its owner is released.
    fn detach_stream(&self, stream: usize) -> PyResult<()> {
        let removed = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stream);
        if let Some((handle, _owner)) = removed {
            self.pool.detach_stream(&handle).map_err(to_pyerr)?;
        }
        Ok(())
    }

    /// Bytes held from the GPU, in use, the peak in use, free, and of the free bytes those held
    /// in threads' caches (reused only by the thread that freed them, on the same stream).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.pool.stats();
        let d = PyDict::new(py);
        d.set_item("pool_bytes", s.pool_bytes)?;
        d.set_item("in_use_bytes", s.in_use_bytes)?;
        d.set_item("peak_in_use_bytes", s.peak_in_use_bytes)?;
        d.set_item("free_bytes", s.free_bytes)?;
        d.set_item("cached_bytes", s.cached_bytes)?;
        d.set_item("streams", s.streams.len())?;
        Ok(d)
    }
}

/// One allocation from a `PoolResource`; freed (on its stream, in stream order) when the last
/// reference to it goes.
#[pyclass(frozen, module = "ferrio._native")]
pub(crate) struct Allocation {
    pool: Arc<DevicePool>,
    stream: StreamHandle,
    ptr: usize,
    size: usize,
}

#[pymethods]
impl Allocation {
    /// Device address of the first byte.
    #[getter]
    fn ptr(&self) -> usize {
        self.ptr
    }

    /// Bytes allocated (the request rounded up to the pool's alignment).
    #[getter]
    fn size(&self) -> usize {
        self.size
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // The default event policy makes no driver call here; a failure (a pointer the pool does
        // not know) cannot happen for a block it handed out, and a destructor cannot raise.
        let _ = self.pool.deallocate(self.ptr, self.size, &self.stream);
    }
}
