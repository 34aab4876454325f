//! ferrio's integration tests: one binary, modules by topic.

mod it;
