//! btrsend core library: reads btrfs straight from its devices and writes
//! send streams of its snapshots; receives streams into btrfs subvolumes or
//! plain directories; keeps backup repositories of stream files.
//!
//! Data flows left to right: device I/O → chunk map → tree walking → the
//! filesystem model → [`send`]. [`receive`] applies a stream to a directory;
//! [`backup`] stores, checks, restores and prunes streams in a repository and
//! uses both. The wire format lives in the `stream-format` crate; the one
//! module with `unsafe` code is `sys` (the btrfs ioctls), which receive and
//! backup's snapshots share.

pub use stream_format;

pub mod backup;
pub mod manifest;
pub(crate) mod memo;
pub mod mount;
pub mod progress;
pub mod rate;
pub mod receive;
pub mod resume;
pub mod send;
pub(crate) mod sys;

#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;

// The device reader, in data-flow order: device -> superblock -> chunk_map
// -> tree -> volume -> fs.
pub mod chunk_map;
pub mod csum;
pub mod device;
pub mod error;
pub mod fs;
pub mod key;
pub mod ondisk;
pub mod superblock;
pub mod tree;
pub mod types;
pub mod volume;

pub use error::{Error, Result};
