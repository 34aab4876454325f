//! ferrio's integration tests: one binary, one module per topic.
//!
//! Tests that need something this machine may lack (a CUDA driver and GPU) print
//! `skipped: <what is missing>: <why>` and return; they run for real on the GPU machine.

mod bounce;
mod cuda;
mod support;
