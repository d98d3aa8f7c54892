//! An entry of the catalog: one stored stream ([`Entry`]), full or
//! incremental ([`Kind`]).
//!
//! Plain data, as the catalog's JSON holds it and as progress reports name
//! it ([`crate::progress::Progress::stored`]); it depends on nothing else
//! of the backup room, so the core's progress interface can name it
//! without importing the repository.

use serde::{Deserialize, Serialize};

/// Full or incremental.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A full stream (SUBVOL first).
    Full,
    /// An incremental stream (SNAPSHOT first) against its parent.
    Incremental,
}

impl Kind {
    /// `full` or `incremental`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Full => "full",
            Kind::Incremental => "incremental",
        }
    }
}

/// One stored stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unique in the repository, never reused.
    pub id: u64,
    /// The snapshot's path from the top level of its filesystem (for
    /// `run`), or the stream's subvolume name (for `import`).
    pub path: String,
    /// The snapshot's UUID as its stream carries it (its received UUID if
    /// it has one, else its UUID).
    pub uuid: String,
    /// Its ctransid.
    pub ctransid: u64,
    /// The parent's UUID for an incremental stream.
    pub parent_uuid: Option<String>,
    /// The parent's ctransid.
    pub parent_ctransid: Option<u64>,
    /// The parent's entry.
    pub parent_id: Option<u64>,
    /// Full or incremental.
    pub kind: Kind,
    /// RFC 3339: the snapshot's creation time (its root item's otime), or
    /// the time given to `import`.
    pub time: String,
    /// The origin the entry belongs to (for retention): the UUID of the
    /// subvolume the snapshot was taken of (its own UUID if none), or the
    /// `--origin` of an import.
    pub origin: String,
    /// The stream file's key.
    pub file: String,
    /// Length of the raw stream.
    pub stream_bytes: u64,
    /// Length of the stream file.
    pub stored_bytes: u64,
    /// BLAKE3 of the raw stream, hex.
    pub stream_blake3: String,
    /// Commands in the stream.
    pub commands: u64,
    /// Protocol version.
    pub proto: u32,
    /// When it was stored (RFC 3339).
    pub stored_at: String,
    /// A synthetic full stream ([`Kind::Full`]): the ids of the entries
    /// whose streams it was made from (its old chain, full stream first),
    /// when `forget` or `backup synthesize` replaced this entry's
    /// incremental stream by a full one made from the repository alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthesized_from: Option<Vec<u64>>,
}

impl Entry {
    /// [`Entry::time`] parsed.
    pub fn timestamp(&self) -> Option<jiff::Timestamp> {
        self.time.parse().ok()
    }
}
