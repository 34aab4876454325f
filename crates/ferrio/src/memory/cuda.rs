//! **The place for the real CUDA implementation** of this module's traits. Nothing here yet:
//! the runtime-loaded driver (`crate::cuda`) is written on another branch, and this file is
//! where it plugs in once merged. The pool needs nothing else from CUDA.
//!
//! What goes here, each a thin adapter over `crate::cuda` (no raw FFI in this module):
//!
//! - `CudaStreams: StreamOrder` with
//!   - `Stream` = a handle that carries a [`StreamId`](super::StreamId) assigned with
//!     `StreamId::unique()` when the stream is created or a foreign `CUstream` (CuPy's, say) is
//!     registered; never derive the id from the `CUstream` value, which the driver reuses;
//!   - `Event` = an event made with `CU_EVENT_DISABLE_TIMING` (cheaper to record and query),
//!     destroyed in its `Drop`, ignoring `CUDA_ERROR_DEINITIALIZED` (a pool dropped while the
//!     process exits). The pool never drops events from thread-local or static destructors;
//!     a pool kept in a `static` is never dropped, so its events are leaked on purpose;
//!   - `record` = `cuEventRecord`, `is_complete` = `cuEventQuery` (`CUDA_SUCCESS` → true,
//!     `CUDA_ERROR_NOT_READY` → false, anything else → `Error::Cuda`), `wait` =
//!     `cuStreamWaitEvent(stream, event, 0)`. All three return without waiting for the GPU;
//!     the pool calls them while holding one stream's list lock.
//! - `DeviceUpstream: Upstream` = `cuMemAlloc` / `cuMemFree` in the pool's context
//!   (`MemoryKind::Device`); `cuMemAlloc` aligns to at least 256 bytes, so for a larger
//!   `align` it must over-allocate and keep the original pointer for `cuMemFree`.
//! - `PinnedUpstream: Upstream` = `cuMemHostAlloc(.., CU_MEMHOSTALLOC_PORTABLE)` /
//!   `cuMemFreeHost` (`MemoryKind::Pinned`).
//!
//! Every driver call needs the pool's context current on the calling thread; the adapters make
//! it current (`cuCtxSetCurrent` is cheap when it already is). Errors become `Error::Cuda`,
//! and `Error::CudaUnavailable` when the driver cannot be loaded.
//!
//! Then: run the pool's conformance tests (`memory::tests`) against `CudaStreams` on a GPU,
//! and `examples/pool_contention.rs` with device memory.
