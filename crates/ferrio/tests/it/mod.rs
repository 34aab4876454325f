mod common;
mod copy;
mod direct;
mod engine;
mod errors;
mod gpu;
mod pagecache;
mod readme;
