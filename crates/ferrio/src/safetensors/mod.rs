//! The safetensors checkpoint format: dtypes, reading and validating a header, and building the
//! header of a new file. Only the format lives here; moving tensor bytes is [`crate::File`]'s
//! job (the Python package `ferrio.safetensors` combines the two), and nothing here does I/O
//! except [`Header::read`], which reads exactly the header's bytes.
//!
//! A file is an 8-byte little-endian length `N`, `N` bytes of JSON (an object mapping each
//! tensor name to `{"dtype", "shape", "data_offsets"}`, plus an optional `__metadata__` object
//! of strings), then the data section, which the tensors tile exactly.
//!
//! ```no_run
//! # fn main() -> ferrio::Result<()> {
//! let header = ferrio::safetensors::Header::read_path("model.safetensors")?;
//! for t in &header.tensors {
//!     println!("{} {} {:?} at {}", t.name, t.dtype, t.shape, header.data_start() + t.begin);
//! }
//! # Ok(()) }
//! ```

mod dtype;
mod header;
mod write;

pub use dtype::{Dtype, UnknownDtype};
pub use header::{Header, TensorInfo, MAX_HEADER_BYTES};
pub use write::{header_bytes, Placement, TensorSpec};

#[cfg(test)]
mod tests;
