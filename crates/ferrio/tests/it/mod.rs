mod common;
mod direct;
mod engine;
mod errors;
mod gpu;
mod pagecache;
