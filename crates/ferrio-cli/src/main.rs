//! The `ferrio` command line.
fn main() {}
