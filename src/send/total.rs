//! The progress total of a send: a metadata-only pre-pass over the
//! snapshot's tree summing the file bytes its extent items reference (what
//! the send will report through [`Progress::data`](super::Progress::data),
//! give or take clones and preallocated ranges). It reads every leaf of the
//! tree once, no file data; the send's own walk then finds those leaves in
//! the block cache when they fit.

use crate::fs::Filesystem;
use crate::fs::subvol::Subvolume;
use crate::ondisk;
use crate::tree::key::Key;
use crate::tree::walk::for_each_in_range;

use super::SendError;

/// Bytes of file data in `subvol`: for each regular extent item with a
/// disk extent its `num_bytes`, for each inline extent its `ram_bytes`
/// (holes and preallocated extents count nothing).
///
/// # Errors
///
/// Tree block read errors.
pub fn data_bytes(fs: &Filesystem, subvol: &Subvolume) -> Result<u64, SendError> {
    let mut total = 0u64;
    let first = Key::new(ondisk::BTRFS_FIRST_FREE_OBJECTID, 0, 0);
    let last = Key::new(u64::MAX, u8::MAX, u64::MAX);
    let le = |d: &[u8], at: usize| {
        d.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    for_each_in_range(
        fs.volume(),
        subvol.root.tree_root(),
        &first,
        &last,
        |item| {
            if item.key.item_type != ondisk::BTRFS_EXTENT_DATA_KEY {
                return Ok(());
            }
            let d = item.data;
            // btrfs_file_extent_item: generation 0, ram_bytes 8, compression 16,
            // encryption 17, other_encoding 18, type 20, disk_bytenr 21,
            // disk_num_bytes 29, offset 37, num_bytes 45.
            let n = match d.get(20) {
                Some(&ondisk::BTRFS_FILE_EXTENT_INLINE) => le(d, 8),
                Some(&ondisk::BTRFS_FILE_EXTENT_REG) if le(d, 21) != 0 => le(d, 45),
                _ => 0,
            };
            total = total.saturating_add(n);
            Ok(())
        },
    )?;
    Ok(total)
}
