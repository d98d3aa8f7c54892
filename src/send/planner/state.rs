//! The planner's state types: the inode being processed, recorded
//! references, delayed directory moves and orphan directories (the
//! kernel's `send_ctx` fields and the structures hanging off it), the
//! clone roots, and the statistics of a finished send.

use crate::fs::subvol::Subvolume;
use crate::fs::{FileType, Filesystem};
use crate::send::error::SendError;
use crate::send::extent_tree::ExtentTreeStats;
use crate::send::view::TreeView;

/// The inode being processed (`sctx->cur_*`).
#[derive(Debug, Default)]
pub(super) struct Cur {
    pub(super) ino: u64,
    pub(super) generation: u64,
    pub(super) size: u64,
    pub(super) mode: u32,
    pub(super) ignore: bool,
    /// Did not exist in the parent (or full send).
    pub(super) new: bool,
    /// Same number as an inode of the parent, another generation.
    pub(super) new_gen: bool,
    /// Only in the parent.
    pub(super) deleted: bool,
    /// End of the last extent seen (hole detection); `None`: unknown.
    pub(super) last_extent: Option<u64>,
    pub(super) next_write_offset: u64,
    /// Its path on the receiver now, when known (`cur_inode_path`).
    pub(super) path: Option<Vec<u8>>,
}

impl Cur {
    /// The file type of the inode.
    pub(super) fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode)
    }
}

/// A recorded reference (`struct recorded_ref`).
#[derive(Debug, Clone)]
pub(super) struct NewRef {
    pub(super) dir: u64,
    pub(super) dir_gen: u64,
    pub(super) name: Vec<u8>,
    pub(super) full_path: Vec<u8>,
}

/// A root data may be cloned from (`struct clone_root`): the send root,
/// the parent and the `-c` roots.
#[derive(Debug, Clone)]
pub(super) struct CloneRoot<'a> {
    pub(super) id: u64,
    pub(super) view: TreeView<'a>,
    /// Its UUID (received_uuid preferred) and ctransid, for CLONE.
    pub(super) uuid: [u8; 16],
    pub(super) ctransid: u64,
}

impl<'a> CloneRoot<'a> {
    pub(super) fn new(fs: &'a Filesystem, subvol: &Subvolume) -> Result<CloneRoot<'a>, SendError> {
        let r = &subvol.root;
        let uuid = if r.received_uuid.is_nil() {
            r.uuid.0
        } else {
            r.received_uuid.0
        };
        Ok(CloneRoot {
            id: subvol.id().get(),
            view: TreeView::new(fs, subvol.id())?,
            uuid,
            ctransid: r.ctransid.get(),
        })
    }
}

/// The chosen clone source (`struct clone_root`'s found reference).
#[derive(Debug, Clone, Copy)]
pub(super) struct CloneSrc {
    pub(super) ino: u64,
    pub(super) offset: u64,
    /// Index into the clone roots.
    pub(super) root: usize,
}

/// A directory rename delayed until another directory has moved
/// (`struct pending_dir_move`).
#[derive(Debug, Clone)]
pub(super) struct PendingMove {
    pub(super) ino: u64,
    pub(super) generation: u64,
    /// The parent directories of its new and deleted refs (for utimes).
    pub(super) dirs: Vec<(u64, u64)>,
}

/// A directory whose rename is delayed (`struct waiting_dir_move`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct WaitingMove {
    /// It sits at its orphan name.
    pub(super) orphanized: bool,
    /// A deleted directory (ino, generation) whose rmdir is retried after
    /// this move.
    pub(super) rmdir: Option<(u64, u64)>,
}

/// A deleted directory not removed yet (`struct orphan_dir_info`): where
/// `can_rmdir` resumes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OrphanDir {
    /// Dir index offset of the last entry checked.
    pub(super) last_index: u64,
    /// Highest inode seen among its entries: no retry before it.
    pub(super) high_ino: u64,
}

/// Statistics of a finished send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Bytes of the stream.
    pub stream_bytes: u64,
    /// Inodes processed.
    pub inodes: u64,
    /// File data bytes sent in WRITE commands (plain data).
    pub data_bytes: u64,
    /// Bytes of ENCODED_WRITE data.
    pub encoded_bytes: u64,
    /// Bytes covered by CLONE commands.
    pub cloned_bytes: u64,
    /// The extent tree lookups of clone detection.
    pub extent_tree: ExtentTreeStats,
    /// The stream's commands by command number (END included); see
    /// [`SendStats::count`].
    pub commands: crate::send::pipeline::CommandCounts,
    /// Times a send from a mounted filesystem continued its stream after a
    /// balance moved blocks it was reading.
    pub continued: u32,
    /// The stream offset where it last continued.
    pub continued_at: u64,
}

impl SendStats {
    /// How many commands of `kind` the stream has.
    pub fn count(&self, kind: stream_format::CommandKind) -> u64 {
        self.commands
            .get(usize::from(kind.number()))
            .copied()
            .unwrap_or(0)
    }

    /// How many commands the stream has, END included.
    pub fn total_commands(&self) -> u64 {
        self.commands.iter().sum()
    }
}
