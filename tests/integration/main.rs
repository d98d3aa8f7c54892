//! The core library's integration tests: one binary, one module per area.

mod list;
mod reader;
mod receive;
