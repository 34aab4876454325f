//! Every raw syscall and FFI wrapper of the crate, each turning a return code into a `Result`.
//!
//! Nothing outside this module calls `libc` functions that need `unsafe`.

pub(crate) mod statfs;
