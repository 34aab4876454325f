//! ferrio's integration tests: one binary, one module per topic.
//!
//! Tests that need a CUDA GPU are `#[ignore]`d with that reason, so `cargo test` counts them as
//! ignored, not passed; `make gpu-test` runs them on the GPU machine with `--include-ignored`,
//! where they fail (never skip) if no GPU can be used. Tests that need something else this
//! machine may lack (root for loop devices, `/dev/shm`), or its absence (no CUDA driver), print
//! `skipped: <why>` and return; `make gpu-test` lists those lines.

mod bounce;
mod cuda;
mod it;
mod memory;
mod support;
