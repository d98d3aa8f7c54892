//! A volume: the devices of one filesystem assembled, with the full chunk
//! map, serving logical reads with mirror fallback and validated tree
//! blocks (the walker's [`BlockSource`]).
//!
//! Opening follows btrfs-progs `open_ctree` (format doc §0, §12.3): read
//! every device's superblock, check they belong together (fsid; devid and
//! device uuid), take the newest superblock, refuse unsupported features,
//! bootstrap the chunk map from `sys_chunk_array`, read the chunk tree
//! (DEV_ITEMs, CHUNK_ITEMs), and switch to the full map. A device that was
//! not given is only an error when a read has no other copy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::chunk_map::{ChunkInfo, ChunkMap};
use crate::device::{Device, FileDevice};
use crate::error::{CorruptKind, DeviceSetError, Error, Location, Notice, Result, Unsupported};
use crate::ondisk::{self, DevItem};
use crate::superblock::{Superblock, read_superblock};
use crate::tree::key::Key;
use crate::tree::node::{BlockCheck, BlockExpect, TreeBlock};
use crate::tree::walk::{BlockSource, Cursor, TreeRoot};
use crate::types::{DevId, Logical, TreeId, Uuid};

use zerocopy::FromBytes;

/// A device of the filesystem as the chunk tree records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevRecord {
    /// Device id.
    pub devid: DevId,
    /// Device UUID.
    pub uuid: Uuid,
    /// Size.
    pub total_bytes: u64,
    /// The device we opened for it, if any.
    pub path: Option<PathBuf>,
}

/// The assembled devices of one filesystem.
#[derive(Debug)]
pub struct Volume {
    sb: Superblock,
    devices: BTreeMap<DevId, Arc<dyn Device>>,
    records: Vec<DevRecord>,
    chunk_map: ChunkMap,
    check: BlockCheck,
    notices: Vec<Notice>,
}

impl Volume {
    /// Open the image files or block devices at `paths` (all devices of one
    /// filesystem; missing ones are tolerated while copies suffice).
    ///
    /// # Errors
    ///
    /// [`Error::Open`], superblock and chunk tree errors,
    /// [`Error::DeviceSet`] when the devices do not belong together,
    /// [`Error::Unsupported`] for features we cannot read.
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Volume> {
        let devices = paths
            .iter()
            .map(|p| FileDevice::open(p).map(|d| Box::new(d) as Box<dyn Device>))
            .collect::<Result<Vec<_>>>()?;
        Volume::from_devices(devices)
    }

    /// Assemble already opened devices.
    ///
    /// # Errors
    ///
    /// As [`Volume::open`].
    pub fn from_devices(devices: Vec<Box<dyn Device>>) -> Result<Volume> {
        let mut notices = Vec::new();
        let mut supers: Vec<(Superblock, Arc<dyn Device>)> = Vec::new();
        for dev in devices {
            let (sb, notice) = read_superblock(dev.as_ref())?;
            notices.extend(notice);
            supers.push((sb, Arc::from(dev)));
        }
        let Some((first, _)) = supers.first() else {
            return Err(Error::DeviceSet(DeviceSetError::NoDevice));
        };
        let fsid = first.fsid;
        let mut by_devid: BTreeMap<DevId, Arc<dyn Device>> = BTreeMap::new();
        let mut dev_uuids: BTreeMap<DevId, Uuid> = BTreeMap::new();
        for (sb, dev) in &supers {
            if sb.fsid != fsid {
                return Err(Error::DeviceSet(DeviceSetError::ForeignDevice {
                    device: dev.path().to_path_buf(),
                    found: sb.fsid,
                    expected: fsid,
                }));
            }
            let devid = sb.dev_item.devid;
            if let Some(other) = by_devid.get(&devid) {
                return Err(Error::DeviceSet(DeviceSetError::DuplicateDevid {
                    devid,
                    first: other.path().to_path_buf(),
                    second: dev.path().to_path_buf(),
                }));
            }
            by_devid.insert(devid, Arc::clone(dev));
            dev_uuids.insert(devid, sb.dev_item.uuid);
        }
        // Filesystem-wide fields from the newest superblock.
        let newest = supers
            .iter()
            .max_by_key(|(sb, _)| sb.generation)
            .map(|(sb, _)| sb.clone())
            .ok_or(Error::DeviceSet(DeviceSetError::NoDevice))?;
        let newest_path = supers
            .iter()
            .find(|(sb, _)| sb.generation == newest.generation)
            .map(|(_, d)| d.path().to_path_buf());
        notices.extend(newest.check_supported()?);

        let chunk_map = ChunkMap::from_sys_chunk_array(
            &newest.sys_chunk_array,
            newest.sectorsize,
            newest_path.as_deref().unwrap_or(Path::new("?")),
        )?;
        let check = BlockCheck {
            nodesize: newest.nodesize,
            sectorsize: newest.sectorsize,
            csum_type: newest.csum_type,
            metadata_uuid: newest.metadata_uuid,
            chunk_tree_uuid: None,
        };
        let mut vol = Volume {
            sb: newest,
            devices: by_devid,
            records: Vec::new(),
            chunk_map,
            check,
            notices,
        };
        vol.read_chunk_tree(&dev_uuids)?;
        Ok(vol)
    }

    fn read_chunk_tree(&mut self, opened: &BTreeMap<DevId, Uuid>) -> Result<()> {
        let root = self.chunk_tree();
        let root_block = self.read_block(&BlockExpect {
            logical: root.logical,
            tree: root.tree,
            generation: root.generation,
            level: root.level,
            first_key: None,
        })?;
        self.check.chunk_tree_uuid = Some(Uuid(root_block.node().header().chunk_tree_uuid));
        let mut map = ChunkMap::new();
        let mut records = Vec::new();
        {
            let mut cursor = Cursor::new(&*self, root);
            cursor.seek(&Key::MIN)?;
            let mut started = false;
            while let Some(item) = cursor.next_until(&Key::MAX, &mut started)? {
                match (item.key.objectid, item.key.item_type) {
                    (ondisk::BTRFS_DEV_ITEMS_OBJECTID, ondisk::BTRFS_DEV_ITEM_KEY) => {
                        let raw = DevItem::ref_from_bytes(item.data).map_err(|_| {
                            Error::corrupt(
                                item.location(),
                                CorruptKind::BadSize {
                                    what: "dev item",
                                    found: len64(item.data),
                                    expected: 98,
                                },
                            )
                        })?;
                        let fsid = Uuid(raw.fsid);
                        if fsid != self.sb.metadata_uuid {
                            // A sprout filesystem: this device is a seed.
                            return Err(Error::Unsupported(Unsupported::Seed(fsid)));
                        }
                        records.push(DevRecord {
                            devid: DevId(raw.devid.get()),
                            uuid: Uuid(raw.uuid),
                            total_bytes: raw.total_bytes.get(),
                            path: None,
                        });
                    }
                    (ondisk::BTRFS_FIRST_CHUNK_TREE_OBJECTID, ondisk::BTRFS_CHUNK_ITEM_KEY) => {
                        let loc = item.location();
                        let chunk =
                            ChunkInfo::parse(item.key.offset, item.data, self.sb.sectorsize, &loc)?;
                        map.insert(chunk, &loc)?;
                    }
                    _ => {}
                }
            }
        }
        for rec in &mut records {
            match (opened.get(&rec.devid), self.devices.get(&rec.devid)) {
                (Some(uuid), Some(dev)) => {
                    if *uuid != rec.uuid {
                        return Err(Error::DeviceSet(DeviceSetError::UuidMismatch {
                            device: dev.path().to_path_buf(),
                            devid: rec.devid,
                            found: *uuid,
                            expected: rec.uuid,
                        }));
                    }
                    rec.path = Some(dev.path().to_path_buf());
                }
                _ => self.notices.push(Notice::MissingDevice {
                    devid: rec.devid,
                    uuid: rec.uuid,
                }),
            }
        }
        // A device we opened that the chunk tree does not know: drop it.
        self.devices
            .retain(|devid, _| records.iter().any(|r| r.devid == *devid));
        self.records = records;
        self.chunk_map = map;
        Ok(())
    }

    /// The superblock in use.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The chunk map.
    pub fn chunk_map(&self) -> &ChunkMap {
        &self.chunk_map
    }

    /// The devices the chunk tree lists.
    pub fn devices(&self) -> &[DevRecord] {
        &self.records
    }

    /// Things worth telling the user (dirty log, missing devices, …).
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// What every tree block is checked against.
    pub fn block_check(&self) -> &BlockCheck {
        &self.check
    }

    /// The root tree's root, from the superblock.
    pub fn root_tree(&self) -> TreeRoot {
        TreeRoot {
            tree: TreeId::ROOT,
            logical: self.sb.root,
            level: self.sb.root_level,
            generation: self.sb.generation,
        }
    }

    /// The chunk tree's root, from the superblock.
    pub fn chunk_tree(&self) -> TreeRoot {
        TreeRoot {
            tree: TreeId::CHUNK,
            logical: self.sb.chunk_root,
            level: self.sb.chunk_root_level,
            generation: self.sb.chunk_root_generation,
        }
    }

    /// How many copies a plain read of `logical` can choose from.
    ///
    /// # Errors
    ///
    /// [`CorruptKind::Unmapped`].
    pub fn num_copies(&self, logical: Logical) -> Result<usize> {
        self.chunk_map
            .lookup(logical)
            .map(ChunkInfo::num_copies)
            .ok_or_else(|| {
                Error::corrupt(
                    Location::Logical(logical),
                    CorruptKind::Unmapped { logical },
                )
            })
    }

    /// Read copy `copy` of `[logical, logical + buf.len())`.
    ///
    /// # Errors
    ///
    /// [`Error::MissingDevice`] when the copy lives on a device not given,
    /// [`Error::Io`], [`CorruptKind::Unmapped`].
    pub fn read_copy(&self, logical: Logical, buf: &mut [u8], copy: usize) -> Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let pos = logical.checked_add(len64u(done)).ok_or_else(|| {
                Error::corrupt(
                    Location::Logical(logical),
                    CorruptKind::Unmapped { logical },
                )
            })?;
            let rest = buf.get_mut(done..).unwrap_or_default();
            let mapping = self.chunk_map.map(pos, len64(rest))?;
            let loc = mapping.copy(copy).ok_or_else(|| {
                Error::corrupt(
                    Location::Logical(pos),
                    CorruptKind::Unmapped { logical: pos },
                )
            })?;
            let n = usize::try_from(mapping.len)
                .unwrap_or(usize::MAX)
                .min(rest.len());
            let dev = self.devices.get(&loc.devid).ok_or(Error::MissingDevice {
                devid: loc.devid,
                uuid: loc.dev_uuid,
                logical: pos,
            })?;
            dev.read_at(rest.get_mut(..n).unwrap_or_default(), loc.physical)?;
            if n == 0 {
                break;
            }
            done = done.saturating_add(n);
        }
        Ok(())
    }

    /// Read `[logical, logical + buf.len())` from the first copy that can be
    /// read (no checksum verification: callers that can verify should use
    /// [`read_copy`](Self::read_copy) per copy).
    ///
    /// # Errors
    ///
    /// The first copy's error when none can be read.
    pub fn read_logical(&self, logical: Logical, buf: &mut [u8]) -> Result<()> {
        let mut first_err = None;
        for copy in 0..self.num_copies(logical)? {
            match self.read_copy(logical, buf, copy) {
                Ok(()) => return Ok(()),
                Err(e) => keep_most_telling(&mut first_err, e),
            }
        }
        Err(first_err.unwrap_or_else(|| {
            Error::corrupt(
                Location::Logical(logical),
                CorruptKind::Unmapped { logical },
            )
        }))
    }
}

/// Keep the first error, but prefer any error over "missing device" (a
/// corrupt or unreadable copy says more).
fn keep_most_telling(slot: &mut Option<Error>, e: Error) {
    match slot {
        None => *slot = Some(e),
        Some(Error::MissingDevice { .. }) if !matches!(e, Error::MissingDevice { .. }) => {
            *slot = Some(e)
        }
        Some(_) => {}
    }
}

fn len64(b: &[u8]) -> u64 {
    len64u(b.len())
}

fn len64u(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl BlockSource for Volume {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        let nodesize = usize::try_from(self.check.nodesize).unwrap_or(usize::MAX);
        let mut first_err = None;
        for copy in 0..self.num_copies(expect.logical)? {
            let mut buf = vec![0u8; nodesize];
            if let Err(e) = self.read_copy(expect.logical, &mut buf, copy) {
                keep_most_telling(&mut first_err, e);
                continue;
            }
            match TreeBlock::new(Arc::from(buf), &self.check, expect) {
                Ok(block) => return Ok(block),
                Err(e) => keep_most_telling(&mut first_err, e),
            }
        }
        Err(first_err.unwrap_or_else(|| {
            Error::corrupt(
                Location::Logical(expect.logical),
                CorruptKind::Unmapped {
                    logical: expect.logical,
                },
            )
        }))
    }
}
