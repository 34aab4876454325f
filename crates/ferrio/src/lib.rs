//! ferrio moves file bytes into and out of host and GPU memory as fast as the hardware allows.
#![deny(rustdoc::broken_intra_doc_links)]

pub mod config;
pub mod error;
pub mod memory;

pub use config::{DirectMode, Settings};
pub use error::{Error, Op, Result};
