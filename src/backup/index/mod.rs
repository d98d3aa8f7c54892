//! The browsing index: what each stored snapshot holds, and where each
//! file's data lies in the repository's streams, so one file can be listed
//! or read without receiving a chain.
//!
//! An index is what receiving a stream into it makes: a third kind of
//! receive target beside btrfs subvolumes and plain directories.
//! [`Indexer`] applies a stream's commands, checked as the receiver checks
//! them, to its parent snapshot's index (or to an empty one for a full
//! stream); file data is not copied but recorded as a place in a stream
//! (the stream's number in the index's source list, the byte offset in the
//! raw stream, the length, and for `ENCODED_WRITE` data its encoding).
//! Data a CLONE copies, or that the parent already had, keeps pointing at
//! the stream that wrote it.
//!
//! The index is a copy-on-write B+tree ([`tree`]) of content-addressed
//! pages, so a snapshot's index shares every page its stream did not
//! touch with its parent's, and memory holds only the nodes changed since
//! the last flush. Its keys ([`model`]) mirror the filesystem's own:
//! inodes, directory entries, xattrs and file extents, each keyed by an
//! inode number of the index's own (the stream's are not trusted: a name
//! is all a stream says of an existing file).
//!
//! Reading ([`read`]) walks directories from the root and reads a file's
//! data range by range from its streams: a file costs the pages on its
//! path and the frames that hold its data.

pub mod apply;
pub mod check;
pub mod diff;
mod extract;
pub mod glob;
pub mod inline;
pub mod model;
pub mod proof;
pub mod read;
mod records;
pub mod repo;
pub mod synth;
pub mod tree;

#[cfg(test)]
mod tests;

pub use apply::{IndexRoot, Indexer, RootPlace, Snapshots, index_stream};
pub use check::Sweep;
pub use inline::{IndexTee, InlineIndex};
pub use read::{DataSource, Snapshot};
pub use tree::{PackId, PageId, PageRef, PageStore, Pages, Place, Tree};

/// What went wrong reading or building an index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// A page is damaged (its bytes do not match its name, or do not parse).
    #[error("index page {}: {reason}", hex(id))]
    Page {
        /// The page's name.
        id: PageId,
        /// What is wrong with it.
        reason: String,
    },
    /// A page is missing from the store.
    #[error("index page {} is missing", hex(id))]
    MissingPage {
        /// The page's name.
        id: PageId,
    },
    /// A record in a page does not parse.
    #[error("index record {what} (key {}): {reason}", hex(key))]
    Record {
        /// Which kind of record.
        what: &'static str,
        /// Its key.
        key: Vec<u8>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A stream command cannot be applied to the index.
    #[error("cannot index {command} ({path}): {reason}")]
    Apply {
        /// The command and where it is in the stream.
        command: String,
        /// Its path, escaped.
        path: String,
        /// Why.
        reason: String,
    },
    /// A path asked for is not in the snapshot.
    #[error("{path}: no such file or directory in the snapshot")]
    NotFound {
        /// The path, escaped.
        path: String,
    },
    /// The stream does not decode.
    #[error("stream: {0}")]
    Stream(#[from] stream_format::DecodeError),
    /// The store failed.
    #[error("index store: {0}")]
    Store(String),
    /// Writing what was read from the index failed.
    #[error("writing: {0}")]
    Output(String),
    /// Reading a file's data from its stream failed.
    #[error("reading data of {path}: {reason}")]
    Data {
        /// The file, escaped.
        path: String,
        /// Why.
        reason: String,
    },
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}
