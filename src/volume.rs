//! A volume: the devices of one filesystem assembled, with the full chunk
//! map, serving logical reads with mirror fallback and validated tree
//! blocks (the walker's [`BlockSource`]).
//!
//! Opening follows btrfs-progs `open_ctree` (`kernel-shared/disk-io.c`): read
//! every device's superblock, check they belong together (fsid; devid and
//! device uuid), take the newest superblock, refuse unsupported features,
//! bootstrap the chunk map from `sys_chunk_array`, read the chunk tree
//! (DEV_ITEMs, CHUNK_ITEMs), and switch to the full map. A device that was
//! not given is only an error when a read has no other copy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::chunk_map::{ChunkInfo, ChunkMap};
use crate::device::readahead::{Cache, CacheStats, ReadOptions};
use crate::device::{Device, FileDevice};
use crate::error::{CorruptKind, DeviceSetError, Error, Notice, Result, Unsupported};
use crate::ondisk::{self, DevItem};
use crate::superblock::{Superblock, read_superblock};
use crate::tree::check::{BlockCheck, BlockExpect};
use crate::tree::key::Key;
use crate::tree::node::TreeBlock;
use crate::tree::walk::{BlockSource, Cursor, TreeRoot};
use crate::types::{DevId, Logical, TreeId, Uuid, len64};

use zerocopy::FromBytes;

mod io;
pub mod mount_check;

use io::{Io, fits, unmapped};

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

/// Data prefetch reads at most this much per task, so block readahead
/// (which the reader threads serve first) never waits long behind data.
const DATA_PIECE: u64 = 1 << 20;

/// The assembled devices of one filesystem.
///
/// Tree blocks are read through a bounded cache with a pool of reader
/// threads ([`ReadOptions`]): the walker's hints ([`BlockSource::will_need`])
/// become concurrent reads, and a block is never read twice at once.
#[derive(Debug)]
pub struct Volume {
    sb: Superblock,
    records: Vec<DevRecord>,
    /// The I/O half (devices, chunk map, checks) lives in the cache as its
    /// loader, shared with the reader threads.
    cache: Cache<Io>,
    options: ReadOptions,
    notices: Vec<Notice>,
    /// Data-prefetch bytes queued and not yet read.
    data_queued: Arc<AtomicU64>,
    /// Data-prefetch bytes queued so far.
    data_requested: AtomicU64,
    /// File data bytes read without checking them against checksums
    /// (NODATASUM files, sectors without checksums, `--no-verify-data`).
    unverified: AtomicU64,
    /// Tests: reads until one fails (`u64::MAX`: none).
    #[cfg(feature = "testing")]
    fail_after: AtomicU64,
    /// Tests: tree block and data reads so far.
    #[cfg(feature = "testing")]
    reads: AtomicU64,
}

impl Volume {
    /// Count `n` bytes of file data read without checking them against
    /// checksums.
    pub(crate) fn note_unverified(&self, n: u64) {
        self.unverified
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// File data bytes read so far without checking them against
    /// checksums (NODATASUM files, sectors without checksums, reads with
    /// verification off): what a relocation during a send could have
    /// made stale unnoticed.
    pub fn unverified_bytes(&self) -> u64 {
        self.unverified.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Open the image files or block devices at `paths` (all devices of one
    /// filesystem), with the default [`ReadOptions`] (readahead on, not
    /// degraded: a device the chunk tree lists that is not given is an
    /// error, [`DeviceSetError::Missing`]; with
    /// [`ReadOptions::degraded`] it is a [`Notice::MissingDevice`] and
    /// reads use the remaining copies while they suffice).
    ///
    /// # Errors
    ///
    /// [`Error::Open`], superblock and chunk tree errors,
    /// [`Error::DeviceSet`] when the devices do not belong together or
    /// some are missing (not degraded),
    /// [`Error::Unsupported`] for features we cannot read.
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Volume> {
        Volume::open_with(paths, &ReadOptions::default())
    }

    /// [`open`](Self::open) with these read options.
    ///
    /// # Errors
    ///
    /// As [`Volume::open`].
    pub fn open_with<P: AsRef<Path>>(paths: &[P], options: &ReadOptions) -> Result<Volume> {
        let devices = paths
            .iter()
            .map(|p| FileDevice::open(p).map(|d| Box::new(d) as Box<dyn Device>))
            .collect::<Result<Vec<_>>>()?;
        Volume::from_devices_with(devices, options)
    }

    /// Assemble already opened devices (default [`ReadOptions`]).
    ///
    /// # Errors
    ///
    /// As [`Volume::open`].
    pub fn from_devices(devices: Vec<Box<dyn Device>>) -> Result<Volume> {
        Volume::from_devices_with(devices, &ReadOptions::default())
    }

    /// Assemble already opened devices with these read options.
    ///
    /// # Errors
    ///
    /// As [`Volume::open`].
    pub fn from_devices_with(
        devices: Vec<Box<dyn Device>>,
        options: &ReadOptions,
    ) -> Result<Volume> {
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

        let sys_map = ChunkMap::from_sys_chunk_array(
            &newest.sys_chunk_array,
            newest.chunk_rules(),
            newest_path.as_deref().unwrap_or(Path::new("?")),
        )?;
        let mut check = BlockCheck {
            nodesize: newest.nodesize,
            sectorsize: newest.sectorsize,
            csum_type: newest.csum_type,
            metadata_uuid: newest.metadata_uuid,
            chunk_tree_uuid: None,
            super_generation: newest.generation,
            mixed_groups: newest.chunk_rules().mixed_groups,
            skinny_metadata: newest.has_incompat(ondisk::BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA),
        };
        // The chunk tree is read once, before the cache exists: directly
        // through the bootstrap map.
        let chunk_root = chunk_tree_root(&newest);
        let mut boot = Io {
            devices: by_devid,
            chunk_map: sys_map,
            check: check.clone(),
        };
        let root_expect = chunk_root.expect();
        let root_block = boot.read_block(&root_expect)?;
        check.chunk_tree_uuid = Some(Uuid(root_block.node().header().chunk_tree_uuid));
        boot.check = check.clone();
        let chunk_tree = ChunkTreeIo {
            io: &boot,
            root: (root_expect, root_block),
        };
        let (chunk_map, mut records) = read_chunk_tree(&chunk_tree, &newest, chunk_root)?;
        let mut devices = boot.devices;
        for rec in &mut records {
            match (dev_uuids.get(&rec.devid), devices.get(&rec.devid)) {
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
                _ => notices.push(Notice::MissingDevice {
                    devid: rec.devid,
                    uuid: rec.uuid,
                }),
            }
        }
        let missing: Vec<(DevId, Uuid)> = records
            .iter()
            .filter(|r| r.path.is_none())
            .map(|r| (r.devid, r.uuid))
            .collect();
        if !missing.is_empty() && !options.degraded {
            return Err(Error::DeviceSet(DeviceSetError::Missing { missing }));
        }
        // A device we opened that the chunk tree does not know: drop it.
        devices.retain(|devid, _| records.iter().any(|r| r.devid == *devid));
        let io = Io {
            devices,
            chunk_map,
            check,
        };
        Ok(Volume {
            sb: newest,
            records,
            cache: Cache::new(io, options),
            options: options.clone(),
            notices,
            data_queued: Arc::new(AtomicU64::new(0)),
            data_requested: AtomicU64::new(0),
            unverified: AtomicU64::new(0),
            #[cfg(feature = "testing")]
            fail_after: AtomicU64::new(u64::MAX),
            #[cfg(feature = "testing")]
            reads: AtomicU64::new(0),
        })
    }

    fn io(&self) -> &Io {
        self.cache.loader()
    }

    /// The superblock in use.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The chunk map.
    pub fn chunk_map(&self) -> &ChunkMap {
        &self.io().chunk_map
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
        &self.io().check
    }

    /// How this volume reads (cache size, readahead).
    pub fn read_options(&self) -> &ReadOptions {
        &self.options
    }

    /// Block cache and readahead counters so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Bytes of data prefetch queued so far ([`prefetch_data`](Self::prefetch_data)).
    pub fn data_prefetch_queued(&self) -> u64 {
        self.data_requested.load(Ordering::Relaxed)
    }

    /// Forget every cached tree block (for benchmarks: the next walk reads
    /// the devices again, through the OS page cache).
    pub fn drop_cache(&self) {
        self.cache.clear();
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
        chunk_tree_root(&self.sb)
    }

    /// How many copies a read of `logical` can choose from (for RAID5/6
    /// including the rebuilds from parity).
    ///
    /// # Errors
    ///
    /// [`CorruptKind::Unmapped`].
    pub fn num_copies(&self, logical: Logical) -> Result<usize> {
        self.io().lookup(logical).map(ChunkInfo::num_copies)
    }

    /// Read copy `copy` of `[logical, logical + buf.len())`. For RAID5/6,
    /// copy 1 rebuilds every strip from the other data strips and P, copy
    /// 2 (RAID6) from Q, copy 3 + k from P and Q taking the k-th other data
    /// strip as bad too; any uses P and Q together when a second data strip
    /// of the row cannot be read.
    ///
    /// # Errors
    ///
    /// [`Error::MissingDevice`] when the copy lives on a device not given,
    /// [`Error::Io`], [`CorruptKind::Unmapped`].
    pub fn read_copy(&self, logical: Logical, buf: &mut [u8], copy: usize) -> Result<()> {
        self.io().read_copy(logical, buf, copy)
    }

    /// Read `[logical, logical + buf.len())`, each piece (up to a stripe
    /// boundary) from the first copy that can be read — for RAID5/6 the
    /// data strip, else a rebuild — with no checksum verification: callers
    /// that can verify should use [`read_verified`](Self::read_verified).
    ///
    /// # Errors
    ///
    /// The most telling error of a piece no copy can give.
    pub fn read_logical(&self, logical: Logical, buf: &mut [u8]) -> Result<()> {
        #[cfg(feature = "testing")]
        self.injected_failure(logical)?;
        self.io().read_logical(logical, buf)
    }

    /// Tests: the read after `reads` more tree block or data reads fails
    /// once (as a block a balance moved away does).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn fail_read_after(&self, reads: u64) {
        self.fail_after
            .store(reads, std::sync::atomic::Ordering::SeqCst);
    }

    /// Tests: the tree block and data reads so far.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[cfg(feature = "testing")]
    fn injected_failure(&self, logical: Logical) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.reads.fetch_add(1, SeqCst);
        let due = self
            .fail_after
            .fetch_update(SeqCst, SeqCst, |n| match n {
                u64::MAX => None,
                0 => Some(u64::MAX),
                n => Some(n - 1),
            })
            .is_ok_and(|n| n == 0);
        if due {
            return Err(crate::Error::corrupt(
                crate::error::Location::Logical(logical),
                crate::error::CorruptKind::BadField {
                    field: "injected read failure",
                    value: 0,
                    why: "a test made this read fail",
                },
            ));
        }
        Ok(())
    }

    /// Read `[logical, logical + buf.len())` checking it sector by sector
    /// (the superblock's sectorsize, aligned on logical addresses: the
    /// units data checksums cover) with `verify(offset in buf, bytes)`.
    /// Each piece (up to a stripe boundary) is read from the first copy;
    /// only the sectors that fail are read again, from the next copy —
    /// mirror, or RAID5/6 rebuild from P, then Q — until each verifies, so
    /// two bad sectors on two mirrors, or a corrupt strip next to good
    /// ones, still give good data. Returns whether every sector verified; a
    /// sector no copy verifies holds the first copy that could be read.
    ///
    /// # Errors
    ///
    /// The most telling read error of a sector no copy can give at all.
    pub fn read_verified(
        &self,
        logical: Logical,
        buf: &mut [u8],
        mut verify: impl FnMut(usize, &[u8]) -> bool,
    ) -> Result<bool> {
        self.read_verified_copies(logical, buf, |off, bytes, _| verify(off, bytes))
    }

    /// [`read_verified`](Self::read_verified), also telling `verify` which
    /// copy (0-based, as [`read_copy`](Self::read_copy) counts) the bytes
    /// come from; copies of one sector are offered in order.
    ///
    /// # Errors
    ///
    /// As [`read_verified`](Self::read_verified).
    pub fn read_verified_copies(
        &self,
        logical: Logical,
        buf: &mut [u8],
        mut verify: impl FnMut(usize, &[u8], usize) -> bool,
    ) -> Result<bool> {
        let io = self.io();
        let sector = u64::from(self.sb.sectorsize.max(1));
        let mut all = true;
        io.each_piece(logical, buf, |chunk, pos, done, rest| {
            let n = chunk
                .mapping(pos, len64(rest.len()))
                .and_then(|m| usize::try_from(m.len).ok())
                .map(|n| n.min(rest.len()))
                .filter(|&n| n > 0)
                .ok_or_else(|| unmapped(pos))?;
            let piece = rest.get_mut(..n).unwrap_or_default();
            all &= io.read_verified_piece(chunk, pos, piece, sector, |off, bytes, copy| {
                verify(done.saturating_add(off), bytes, copy)
            })?;
            Ok(n)
        })?;
        Ok(all)
    }

    /// Ask the reader threads to read these data ranges ahead (each
    /// `(logical start, length)`), in order, into the OS page cache, so a
    /// later [`read_logical`](Self::read_logical) of them is a memory copy.
    /// Returns the bytes queued: requests are dropped without readahead or
    /// beyond [`ReadOptions::data_queue_bytes`] queued; errors are ignored
    /// (the later read reports them).
    pub fn prefetch_data(&self, ranges: &[(Logical, u64)]) -> u64 {
        if !self.cache.readahead() {
            return 0;
        }
        let mut queued = 0u64;
        for &(start, len) in ranges {
            let mut done = 0u64;
            while done < len {
                let piece = (len - done).min(DATA_PIECE);
                let Some(pos) = start.checked_add(done) else {
                    break;
                };
                let before = self.data_queued.fetch_add(piece, Ordering::Relaxed);
                if before.saturating_add(piece) > self.options.data_queue_bytes {
                    self.data_queued.fetch_sub(piece, Ordering::Relaxed);
                    return queued;
                }
                let counter = Arc::clone(&self.data_queued);
                let spawned = self.cache.spawn(move |io: &Io| {
                    io.prefetch_data(pos, piece);
                    counter.fetch_sub(piece, Ordering::Relaxed);
                });
                if !spawned {
                    self.data_queued.fetch_sub(piece, Ordering::Relaxed);
                    return queued;
                }
                queued = queued.saturating_add(piece);
                self.data_requested.fetch_add(piece, Ordering::Relaxed);
                done = done.saturating_add(piece);
            }
        }
        queued
    }
}

fn chunk_tree_root(sb: &Superblock) -> TreeRoot {
    TreeRoot {
        tree: TreeId::CHUNK,
        logical: sb.chunk_root,
        level: sb.chunk_root_level,
        generation: sb.chunk_root_generation,
    }
}

/// The bootstrap reads of the chunk tree: its root block, read once to
/// learn the tree's uuid (which every other block of it must carry, as the
/// root does), is not read from the device a second time.
struct ChunkTreeIo<'a> {
    io: &'a Io,
    root: (BlockExpect, TreeBlock),
}

impl BlockSource for ChunkTreeIo<'_> {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        if *expect == self.root.0 {
            return Ok(self.root.1.clone());
        }
        self.io.read_block(expect)
    }
}

/// Read the chunk tree through the bootstrap map: the full chunk map and
/// the DEV_ITEMs.
fn read_chunk_tree(
    io: &ChunkTreeIo<'_>,
    sb: &Superblock,
    root: TreeRoot,
) -> Result<(ChunkMap, Vec<DevRecord>)> {
    let mut map = ChunkMap::new();
    let mut records = Vec::new();
    let mut cursor = Cursor::new(io, root);
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
                            found: len64(item.data.len()),
                            expected: 98,
                        },
                    )
                })?;
                let fsid = Uuid(raw.fsid);
                if fsid != sb.metadata_uuid {
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
                let chunk = ChunkInfo::parse(item.key.offset, item.data, sb.chunk_rules(), &loc)?;
                map.insert(chunk, &loc)?;
            }
            _ => {}
        }
    }
    Ok((map, records))
}

impl Volume {
    /// A cached block, for `expect`: as it is when it was validated for the
    /// same tree; cached for another subvolume tree sharing it, without new
    /// checks; else checked again for this tree (no I/O).
    fn validated_for(&self, block: TreeBlock, expect: &BlockExpect) -> Result<TreeBlock> {
        if fits(&block, expect) {
            return Ok(block);
        }
        if let Some(shared) = block.shared_with(expect) {
            return Ok(shared);
        }
        TreeBlock::new(Arc::clone(block.bytes()), &self.io().check, expect)
    }
}

impl BlockSource for Volume {
    fn read_block(&self, expect: &BlockExpect) -> Result<TreeBlock> {
        #[cfg(feature = "testing")]
        self.injected_failure(expect.logical)?;
        let block = self.cache.get(expect)?;
        // If the cached copy does not pass for this tree, the other copies
        // may.
        self.validated_for(block, expect)
            .or_else(|_| self.io().read_block(expect))
    }

    fn will_need(&self, upcoming: &[BlockExpect]) {
        self.cache.prefetch(upcoming.iter().cloned());
    }

    fn readahead_window(&self) -> usize {
        if self.cache.readahead() {
            self.options.window
        } else {
            0
        }
    }

    fn cached(&self, expect: &BlockExpect) -> Option<TreeBlock> {
        let block = self.cache.peek(&(expect.logical, expect.generation))?;
        self.validated_for(block, expect).ok()
    }
}

#[cfg(test)]
mod tests;
