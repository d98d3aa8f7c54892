//! The core library's integration tests: one binary, one module per area.

mod fs_model;
mod list;
mod reader;
mod receive;
