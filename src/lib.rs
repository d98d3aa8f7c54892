//! btrsend core library: reads btrfs straight from its devices and plans send
//! streams; receives streams into directories.
//!
//! Data flows left to right: device I/O → chunk map → tree walking → the
//! filesystem model → the send planner / the receiver. The wire format lives
//! in the `stream-format` crate.

pub use stream_format;

pub mod manifest;
pub mod receive;
pub mod ondisk;
pub mod csum;
pub mod device;
pub mod error;
pub mod superblock;
pub mod tree;
pub mod types;
pub use error::{Error, Result};
pub mod chunk_map;
