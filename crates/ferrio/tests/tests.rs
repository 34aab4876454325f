//! ferrio's integration tests: one binary, one module per topic.
//!
//! Tests that need something this machine may lack (a CUDA driver and GPU, root for loop
//! devices) print `skipped: <what is missing>: <why>` and return; the GPU ones run for real on
//! the GPU machine (`make gpu-test`).

mod bounce;
mod cuda;
mod it;
mod support;
