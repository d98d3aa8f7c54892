//! What a send wrote so far ([`Trail`]), kept across the attempts of one
//! mounted send so that a send planned again after a relocation continues
//! the same stream. This module records and replays data commands; it
//! never writes to the stream itself.

use crate::fs::{ExtentData, FileExtent};

use super::IdentChain;

/// What a send wrote so far, kept across the attempts of one mounted send
/// (see [`crate::send::mounted`]) so that a send planned again after a balance
/// moved blocks can continue the same stream: where it stopped, an
/// identity chain of the commands written, and the data commands made for
/// each extent with data on disk.
///
/// The stream btrfs and btrsend make depends on the layout: which of the
/// references to a shared extent a CLONE names follows the order of its
/// back references, which a relocation changes (it rewrites them as shared
/// references keyed by the new tree blocks' addresses); whether a source
/// shares an extent is decided by extent addresses, which a relocation in
/// progress may give to one tree before another; a relocation may also
/// split extents. So a send planned again after a balance may make other
/// commands before the point where the first one stopped. The data
/// commands of an extent before that point are therefore made again as
/// they were (when the extent still has the same shape; inline extents
/// and holes need no record, see [`layout_dependent`]), and the commands
/// dropped must be the very ones written (identity chain: each command as
/// encoded, without its file data, whose bytes its path, offset and length
/// fix), else the continuation is refused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trail {
    /// Stream offset after the last command written (a command boundary).
    pub(crate) pos: u64,
    /// Index of the next command.
    pub(crate) index: u64,
    /// Identity chain of the commands written from stream offset `from` on.
    pub(crate) ident: IdentChain,
    /// Where the first attempt started writing commands, and the index of
    /// the command there.
    pub(crate) from: u64,
    pub(super) from_index: u64,
    /// A command was written cut: the trail cannot be continued.
    pub(crate) broken: bool,
    /// The data commands made for each extent whose commands depend on
    /// the layout (see [`layout_dependent`]), sorted by (inode, file
    /// offset) of the extent, at most [`TRAIL_EXTENTS_MAX`].
    pub(super) extents: Vec<TrailExtent>,
}

/// One extent's data commands in a [`Trail`], in 48 bytes: most extents
/// have one WRITE, kept inline; the others a boxed list.
#[derive(Debug, Clone)]
pub(super) struct TrailExtent {
    pub(super) ino: u64,
    pub(super) file_offset: u64,
    /// A digest of the extent's shape (see [`shape_digest`]).
    pub(super) shape: u64,
    pub(super) ops: TrailOps,
}

/// The data commands of a [`TrailExtent`].
#[derive(Debug, Clone)]
pub(super) enum TrailOps {
    /// One [`DataOp::Write`].
    Write { offset: u64, len: u64 },
    /// Any other list.
    List(Box<[DataOp]>),
}

impl TrailOps {
    pub(super) fn new(ops: Vec<DataOp>) -> TrailOps {
        match ops.as_slice() {
            &[DataOp::Write { offset, len }] => TrailOps::Write { offset, len },
            _ => TrailOps::List(ops.into_boxed_slice()),
        }
    }

    pub(super) fn to_vec(&self) -> Vec<DataOp> {
        match self {
            TrailOps::Write { offset, len } => vec![DataOp::Write {
                offset: *offset,
                len: *len,
            }],
            TrailOps::List(ops) => ops.to_vec(),
        }
    }
}

/// A digest of what identifies an extent item's data beside its key: its
/// kind, encoding and the range of the disk extent it covers (a
/// relocation may split an extent: then the recorded commands are not
/// reused). A collision (odds 2^-64) can only reuse commands that then
/// fail the identity chain: the continuation is refused, never wrong.
pub(super) fn shape_digest(ext: &FileExtent) -> u64 {
    use std::hash::{Hash, Hasher};
    let shape = match &ext.data {
        ExtentData::Inline(b) => (
            0u8,
            ext.compression,
            ext.ram_bytes,
            u64::try_from(b.len()).unwrap_or(u64::MAX),
            0,
            0,
        ),
        ExtentData::Regular(d) | ExtentData::Prealloc(d) => (
            if matches!(ext.data, ExtentData::Regular(_)) {
                1
            } else {
                2
            },
            ext.compression,
            ext.ram_bytes,
            d.disk_num_bytes,
            d.offset,
            d.num_bytes,
        ),
    };
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    shape.hash(&mut h);
    h.finish()
}

/// Whether the data commands of `ext` may differ after a relocation:
/// only an extent with data on disk has back references, whose order
/// picks a clone source, and an address, by which sources share it. The
/// commands of an inline extent or a hole follow from the item and the
/// inode alone, which a relocation leaves as they are: planned again,
/// they are the very commands written, so a [`Trail`] need not keep them
/// (in a tree of small files, nearly every extent).
pub(crate) fn layout_dependent(ext: &FileExtent) -> bool {
    ext.disk().is_some_and(|d| d.disk_bytenr.get() != 0)
}

/// One command made for an extent's data (see [`Trail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataOp {
    /// Its bytes `[offset, offset + len)` (WRITE, ENCODED_WRITE or
    /// UPDATE_EXTENT commands).
    Write { offset: u64, len: u64 },
    /// CLONE of `[offset, offset + len)` from `src` (inode, offset, clone
    /// root index).
    Clone {
        offset: u64,
        len: u64,
        src: (u64, u64, usize),
    },
    /// TRUNCATE to `size`.
    Truncate { size: u64 },
}

/// Extents whose commands a [`Trail`] keeps at most: 48 bytes each, 6 MiB
/// (plus the lists of extents with more than one command). Past it, an
/// extent's commands are planned afresh when a send is continued: the
/// continuation is refused ([`SendError::Replanned`](crate::send::error::SendError::Replanned)) if a relocation
/// changed them.
pub(crate) const TRAIL_EXTENTS_MAX: usize = 1 << 17;

impl Trail {
    /// A trail of a stream whose commands start at stream offset `from`
    /// with command `index`.
    pub(crate) fn new(from: u64, index: u64) -> Trail {
        Trail {
            pos: from,
            index,
            from,
            from_index: index,
            ..Trail::default()
        }
    }

    /// Record a command without file data, written as `encoded`: its
    /// stream length and its identity are that encoding (see [`ident`](super::skip::ident)).
    pub(super) fn record_plain(&mut self, encoded: &[u8]) {
        self.pos = self
            .pos
            .saturating_add(u64::try_from(encoded.len()).unwrap_or(u64::MAX));
        self.index += 1;
        self.ident.push(encoded);
        self.ident.push(&0u64.to_le_bytes());
    }

    /// Keep `ops`, the data commands made for `ext` of `ino`, unless
    /// the trail is full or has the extent's commands already.
    pub(super) fn keep(&mut self, ino: u64, ext: &FileExtent, ops: Vec<DataOp>) {
        if self.extents.len() >= TRAIL_EXTENTS_MAX {
            return;
        }
        let key = (ino, ext.file_offset);
        // A send plans extents in key order: appended, as a rule.
        let at = match self.extents.last() {
            Some(e) if (e.ino, e.file_offset) >= key => {
                match self
                    .extents
                    .binary_search_by_key(&key, |e| (e.ino, e.file_offset))
                {
                    Ok(_) => return,
                    Err(at) => at,
                }
            }
            _ => self.extents.len(),
        };
        self.extents.insert(
            at,
            TrailExtent {
                ino,
                file_offset: ext.file_offset,
                shape: shape_digest(ext),
                ops: TrailOps::new(ops),
            },
        );
    }

    /// The data commands kept for `ext` of `ino`, if its shape is the same.
    pub(super) fn kept(&self, ino: u64, ext: &FileExtent) -> Option<Vec<DataOp>> {
        let i = self
            .extents
            .binary_search_by_key(&(ino, ext.file_offset), |e| (e.ino, e.file_offset))
            .ok()?;
        let e = self.extents.get(i)?;
        (e.shape == shape_digest(ext)).then(|| e.ops.to_vec())
    }

    /// Back to the start, nothing written (the clone choices are kept).
    pub(crate) fn rewind(&mut self) {
        self.pos = self.from;
        self.index = self.from_index;
        self.ident = IdentChain::default();
        self.broken = false;
    }
}
