//! The chunk map: logical → (devid, physical) for every RAID profile.
//!
//! Layout: `struct btrfs_chunk` + `struct btrfs_stripe`
//! ([`crate::ondisk::Chunk`]); mapping formulas
//! of btrfs-progs `volumes.c` `__btrfs_map_block` (facts only). The map is
//! bootstrapped from the superblock's `sys_chunk_array`, then replaced by the
//! full chunk tree. Chunks sit in a sorted `Vec`; a lookup first tries the
//! chunk of the calling thread's previous hit (tree walks and file reads
//! move forward within one chunk, and each reader thread keeps its own
//! hint, so a walker and the readahead threads do not evict each other's),
//! then binary-searches. Callers that map several pieces of one chunk look
//! the chunk up once and use [`ChunkInfo::mapping`].

#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::as_conversions
)]

use std::cell::Cell;
use std::fmt;

use zerocopy::FromBytes;

use crate::error::{CorruptKind, Error, Location, Result, Unsupported};
use crate::ondisk::{self, DiskKey};
use crate::tree::key::Key;
use crate::types::{DevId, Logical, Physical, Uuid, len64};

/// The RAID profile of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// One copy.
    Single,
    /// Two copies on one device.
    Dup,
    /// Striped, no redundancy.
    Raid0,
    /// Two copies on two devices.
    Raid1,
    /// Three copies.
    Raid1C3,
    /// Four copies.
    Raid1C4,
    /// Striped mirrors.
    Raid10,
    /// Striped with one rotating parity.
    Raid5,
    /// Striped with two rotating parities.
    Raid6,
}

impl Profile {
    fn from_flags(flags: u64) -> Option<Profile> {
        use ondisk::*;
        Some(match flags & BTRFS_BLOCK_GROUP_PROFILE_MASK {
            0 => Profile::Single,
            BTRFS_BLOCK_GROUP_DUP => Profile::Dup,
            BTRFS_BLOCK_GROUP_RAID0 => Profile::Raid0,
            BTRFS_BLOCK_GROUP_RAID1 => Profile::Raid1,
            BTRFS_BLOCK_GROUP_RAID1C3 => Profile::Raid1C3,
            BTRFS_BLOCK_GROUP_RAID1C4 => Profile::Raid1C4,
            BTRFS_BLOCK_GROUP_RAID10 => Profile::Raid10,
            BTRFS_BLOCK_GROUP_RAID5 => Profile::Raid5,
            BTRFS_BLOCK_GROUP_RAID6 => Profile::Raid6,
            _ => return None,
        })
    }

    /// btrfs-progs' name.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Single => "single",
            Profile::Dup => "DUP",
            Profile::Raid0 => "RAID0",
            Profile::Raid1 => "RAID1",
            Profile::Raid1C3 => "RAID1C3",
            Profile::Raid1C4 => "RAID1C4",
            Profile::Raid10 => "RAID10",
            Profile::Raid5 => "RAID5",
            Profile::Raid6 => "RAID6",
        }
    }

    /// Parity stripes per row.
    fn nparity(self) -> usize {
        match self {
            Profile::Raid5 => 1,
            Profile::Raid6 => 2,
            _ => 0,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One stripe of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkStripe {
    /// The device.
    pub devid: DevId,
    /// Where the stripe starts on it.
    pub offset: Physical,
    /// The device's UUID.
    pub dev_uuid: Uuid,
}

/// A validated chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkInfo {
    /// First logical address.
    pub logical: Logical,
    /// Logical length.
    pub length: u64,
    /// Type and profile bits.
    pub flags: u64,
    /// The profile.
    pub profile: Profile,
    /// Stripe length (64 KiB).
    pub stripe_len: u64,
    /// 2 for RAID10.
    pub sub_stripes: u16,
    /// The stripes.
    pub stripes: Vec<ChunkStripe>,
}

/// Where one copy of a logical range lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeLoc {
    /// The device.
    pub devid: DevId,
    /// Its UUID (to name it when missing).
    pub dev_uuid: Uuid,
    /// Offset on the device.
    pub physical: Physical,
}

/// The copies of a logical range, and how much of the range they cover
/// contiguously.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    copies: [Option<StripeLoc>; 4],
    /// Bytes from the start of the request that every copy covers
    /// contiguously (up to the end of a 64 KiB stripe for striped profiles,
    /// up to the chunk end otherwise).
    pub len: u64,
    /// The chunk's profile.
    pub profile: Profile,
}

impl Mapping {
    /// All copies, preferred first.
    pub fn copies(&self) -> impl Iterator<Item = StripeLoc> + '_ {
        self.copies.iter().flatten().copied()
    }

    /// Copy `i`, if it exists.
    pub fn copy(&self, i: usize) -> Option<StripeLoc> {
        self.copies.get(i).copied().flatten()
    }

    /// Number of copies.
    pub fn num_copies(&self) -> usize {
        self.copies.iter().flatten().count()
    }
}

/// The longest chunk the kernel accepts: its stripe numbers must fit a
/// `u32` (`U32_MAX << BTRFS_STRIPE_LEN_SHIFT`, kernel `tree-checker.c`
/// `btrfs_check_chunk_valid`), so anything this long is a bit flip or worse.
pub const MAX_CHUNK_LENGTH: u64 = 0xffff_ffff_0000;

/// What a chunk is checked against besides itself: the superblock's
/// geometry and features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRules {
    /// The filesystem's sector size: a chunk's start, length and
    /// `sector_size` follow it.
    pub sectorsize: u32,
    /// INCOMPAT_MIXED_GROUPS: only then may a chunk hold data and metadata.
    pub mixed_groups: bool,
}

impl ChunkRules {
    /// The rules of a filesystem with this sector size and no mixed block
    /// groups.
    pub fn new(sectorsize: u32) -> ChunkRules {
        ChunkRules {
            sectorsize,
            mixed_groups: false,
        }
    }
}

impl ChunkInfo {
    /// Decode and validate a CHUNK_ITEM payload whose key offset is `logical`.
    /// `location` names the item for messages.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a malformed chunk (the checks of the kernel's
    /// `tree-checker.c` `btrfs_check_chunk_valid` and
    /// `check_leaf_chunk_item`), [`Error::Unsupported`] for the remap tree's
    /// chunk types.
    pub fn parse(
        logical: u64,
        data: &[u8],
        rules: ChunkRules,
        location: &Location,
    ) -> Result<ChunkInfo> {
        let sectorsize = rules.sectorsize;
        let corrupt = |kind| Error::corrupt(location.clone(), kind);
        let (raw, rest) = ondisk::Chunk::ref_from_prefix(data).map_err(|_| {
            corrupt(CorruptKind::Truncated {
                what: "chunk item",
                needed: 48,
                available: len64(data.len()),
            })
        })?;
        let num_stripes = raw.num_stripes.get();
        let stripes_len = usize::from(num_stripes).saturating_mul(32);
        let stripes_raw = rest.get(..stripes_len).ok_or_else(|| {
            corrupt(CorruptKind::Truncated {
                what: "chunk stripes",
                needed: 48u64.saturating_add(u64::try_from(stripes_len).unwrap_or(u64::MAX)),
                available: len64(data.len()),
            })
        })?;
        // The size first, as the kernel's check_leaf_chunk_item does: an
        // item that is not exactly its stripes is no chunk at all.
        if num_stripes != 0 && data.len() != 48usize.saturating_add(stripes_len) {
            return Err(corrupt(CorruptKind::BadSize {
                what: "chunk item",
                found: len64(data.len()),
                expected: 48u64.saturating_add(len64(stripes_raw.len())),
            }));
        }
        let flags = raw.chunk_type.get();
        let field = |field, value, why| corrupt(CorruptKind::BadField { field, value, why });
        // First, as the kernel's btrfs_check_chunk_valid: a chunk without
        // stripes maps nothing, whatever its other fields say.
        if num_stripes == 0 {
            return Err(field("num_stripes", 0, "a chunk has at least one stripe"));
        }
        if flags & (ondisk::BTRFS_BLOCK_GROUP_REMAPPED | ondisk::BTRFS_BLOCK_GROUP_METADATA_REMAP)
            != 0
        {
            return Err(Error::Unsupported(Unsupported::ChunkType {
                flags,
                logical: Logical(logical),
            }));
        }
        if flags & !(ondisk::BTRFS_BLOCK_GROUP_TYPE_MASK | ondisk::BTRFS_BLOCK_GROUP_PROFILE_MASK)
            != 0
        {
            return Err(field("type", flags, "unknown type bits"));
        }
        if flags & ondisk::BTRFS_BLOCK_GROUP_TYPE_MASK == 0 {
            return Err(field("type", flags, "no DATA, METADATA or SYSTEM bit"));
        }
        let profile = Profile::from_flags(flags)
            .ok_or_else(|| field("type", flags, "more than one profile bit"))?;
        if flags & ondisk::BTRFS_BLOCK_GROUP_SYSTEM != 0
            && flags & (ondisk::BTRFS_BLOCK_GROUP_DATA | ondisk::BTRFS_BLOCK_GROUP_METADATA) != 0
        {
            return Err(field(
                "type",
                flags,
                "a system chunk holds neither data nor metadata",
            ));
        }
        if !rules.mixed_groups
            && flags & ondisk::BTRFS_BLOCK_GROUP_DATA != 0
            && flags & ondisk::BTRFS_BLOCK_GROUP_METADATA != 0
        {
            return Err(field(
                "type",
                flags,
                "data and metadata in one chunk without the mixed-bg feature",
            ));
        }
        let length = raw.length.get();
        if length == 0 || !length.is_multiple_of(u64::from(sectorsize)) {
            return Err(field(
                "length",
                length,
                "must be a non-zero multiple of sectorsize",
            ));
        }
        if !logical.is_multiple_of(u64::from(sectorsize)) {
            return Err(field(
                "logical",
                logical,
                "must be a multiple of sectorsize",
            ));
        }
        if logical.checked_add(length).is_none() {
            return Err(field("length", length, "chunk end overflows"));
        }
        if length >= MAX_CHUNK_LENGTH {
            return Err(field(
                "length",
                length,
                "chunk length too large: the kernel's limit is 2^32 - 1 stripes of 64 KiB \
                 (281474976645120 bytes)",
            ));
        }
        let stripe_len = raw.stripe_len.get();
        if stripe_len != ondisk::BTRFS_STRIPE_LEN {
            return Err(field("stripe_len", stripe_len, "must be 65536"));
        }
        if raw.sector_size.get() != sectorsize {
            return Err(field(
                "sector_size",
                raw.sector_size.get().into(),
                "must equal the superblock's sectorsize",
            ));
        }
        let n = num_stripes;
        let sub = raw.sub_stripes.get();
        let ok = match profile {
            Profile::Single => n == 1,
            Profile::Dup | Profile::Raid1 => n == 2,
            Profile::Raid1C3 => n == 3,
            Profile::Raid1C4 => n == 4,
            Profile::Raid0 => n >= 1,
            Profile::Raid10 => n >= 2 && n % 2 == 0 && sub == 2,
            Profile::Raid5 => n >= 2,
            Profile::Raid6 => n >= 3,
        };
        if !ok {
            return Err(field(
                "num_stripes",
                n.into(),
                "does not fit the chunk profile",
            ));
        }
        if data.len() != 48usize.saturating_add(stripes_len) {
            return Err(corrupt(CorruptKind::BadSize {
                what: "chunk item",
                found: len64(data.len()),
                expected: 48u64.saturating_add(len64(stripes_raw.len())),
            }));
        }
        let stripes: Vec<ChunkStripe> = <[ondisk::Stripe]>::ref_from_bytes(stripes_raw)
            .map_err(|_| field("num_stripes", n.into(), "stripes do not fit"))?
            .iter()
            .map(|s| ChunkStripe {
                devid: DevId(s.devid.get()),
                offset: Physical(s.offset.get()),
                dev_uuid: Uuid(s.dev_uuid),
            })
            .collect();
        // No stripe holds more than the chunk's length on its device, so a
        // stripe that would end past 2^64 lies on no device: refuse it here
        // rather than fail every read of the chunk as unmapped.
        if let Some(s) = stripes
            .iter()
            .find(|s| s.offset.get().checked_add(length).is_none())
        {
            return Err(field(
                "stripe offset",
                s.offset.get(),
                "the stripe would end past 2^64 bytes of its device",
            ));
        }
        Ok(ChunkInfo {
            logical: Logical(logical),
            length,
            flags,
            profile,
            stripe_len,
            sub_stripes: sub,
            stripes,
        })
    }

    /// The bytes each stripe takes on its device (the kernel's
    /// `calc_stripe_length`, which dev extents must match): the length
    /// over the data stripes, i.e. the stripes less parity, over the
    /// copies.
    pub fn stripe_size(&self) -> u64 {
        let copies = match self.profile {
            Profile::Dup | Profile::Raid1 | Profile::Raid10 => 2,
            Profile::Raid1C3 => 3,
            Profile::Raid1C4 => 4,
            Profile::Single | Profile::Raid0 | Profile::Raid5 | Profile::Raid6 => 1,
        };
        let data = self
            .stripes
            .len()
            .saturating_sub(self.profile.nparity())
            .checked_div(copies)
            .unwrap_or(0)
            .max(1);
        self.length.checked_div(len64(data)).unwrap_or(self.length)
    }

    /// One past the last logical address.
    pub fn end(&self) -> u64 {
        // OK: checked in `parse`.
        self.logical.get().saturating_add(self.length)
    }

    /// Copies a read can choose from, as the kernel numbers mirrors
    /// (`btrfs_num_copies`): RAID5 2 (the data strip, then a rebuild from P).
    /// RAID6 has one per stripe, as the kernel's `btrfs_num_copies`: the
    /// data strip, a rebuild from P, one from Q, then one for each other
    /// data strip of the row taken as bad too (rebuilt from P and Q), so
    /// a second corrupt strip in the row can be got round. The rebuilt
    /// copies are not in [`Mapping::copies`]: see
    /// [`raid56_row`](Self::raid56_row).
    pub fn num_copies(&self) -> usize {
        match self.profile {
            Profile::Single | Profile::Raid0 => 1,
            Profile::Dup | Profile::Raid1 | Profile::Raid10 | Profile::Raid5 => 2,
            Profile::Raid1C3 => 3,
            Profile::Raid1C4 => 4,
            Profile::Raid6 => self.stripes.len().max(3),
        }
    }

    /// Whether `logical` lies in this chunk.
    pub fn contains(&self, logical: Logical) -> bool {
        self.logical <= logical && logical.get() < self.end()
    }

    /// Map `[logical, logical + len)`, which must start inside this chunk
    /// (`None` otherwise): what [`ChunkMap::map`] does without the lookup.
    pub fn mapping(&self, logical: Logical, len: u64) -> Option<Mapping> {
        self.map(logical, len)
    }

    /// For RAID5/6: the row (full stripe) holding `logical`, for a rebuild
    /// from parity; `None` for other profiles or outside the chunk.
    pub fn raid56_row(&self, logical: Logical, len: u64) -> Option<Raid56Row> {
        let np = u64::try_from(self.profile.nparity()).ok()?;
        if np == 0 {
            return None;
        }
        let n = u64::try_from(self.stripes.len()).ok()?;
        let off = logical.get().checked_sub(self.logical.get())?;
        let to_end = self.length.checked_sub(off).filter(|&n| n > 0)?;
        let sl = self.stripe_len;
        let nd = n.checked_sub(np)?;
        let stripe_nr = off.checked_div(sl)?;
        let so = off.checked_rem(sl)?;
        let full_nr = stripe_nr.checked_div(nd)?;
        let col = stripe_nr.checked_rem(nd)?;
        let rot = full_nr.checked_rem(n)?;
        let dev_off = full_nr.checked_mul(sl)?.checked_add(so)?;
        let loc = |i: u64| -> Option<StripeLoc> {
            let idx = i.checked_add(rot)?.checked_rem(n)?;
            let s = self.stripes.get(usize::try_from(idx).ok()?)?;
            Some(StripeLoc {
                devid: s.devid,
                dev_uuid: s.dev_uuid,
                physical: Physical(s.offset.get().checked_add(dev_off)?),
            })
        };
        Some(Raid56Row {
            data: (0..nd).map(loc).collect::<Option<Vec<_>>>()?,
            parity: (nd..n).map(loc).collect::<Option<Vec<_>>>()?,
            col: usize::try_from(col).ok()?,
            len: len.min(sl.checked_sub(so)?).min(to_end),
        })
    }

    /// Map `[logical, logical + len)`, which must start inside this chunk.
    fn map(&self, logical: Logical, len: u64) -> Option<Mapping> {
        let off = logical.get().checked_sub(self.logical.get())?;
        let to_end = self.length.checked_sub(off).filter(|&n| n > 0)?;
        let sl = self.stripe_len;
        let stripe_nr = off.checked_div(sl)?;
        let so = off.checked_rem(sl)?;
        let in_stripe = sl.checked_sub(so)?;
        let mut copies = [None; 4];
        let loc = |idx: u64, dev_off: u64| -> Option<StripeLoc> {
            let s = self.stripes.get(usize::try_from(idx).ok()?)?;
            Some(StripeLoc {
                devid: s.devid,
                dev_uuid: s.dev_uuid,
                physical: Physical(s.offset.get().checked_add(dev_off)?),
            })
        };
        let n = u64::try_from(self.stripes.len()).ok()?;
        let contiguous = match self.profile {
            Profile::Single
            | Profile::Dup
            | Profile::Raid1
            | Profile::Raid1C3
            | Profile::Raid1C4 => {
                for (c, slot) in copies.iter_mut().enumerate().take(self.stripes.len()) {
                    *slot = Some(loc(u64::try_from(c).ok()?, off)?);
                }
                to_end
            }
            Profile::Raid0 => {
                let idx = stripe_nr.checked_rem(n)?;
                let row = stripe_nr.checked_div(n)?;
                copies[0] = Some(loc(idx, row.checked_mul(sl)?.checked_add(so)?)?);
                in_stripe.min(to_end)
            }
            Profile::Raid10 => {
                let sub = u64::from(self.sub_stripes);
                let groups = n.checked_div(sub)?;
                let row = stripe_nr.checked_div(groups)?;
                let first = stripe_nr.checked_rem(groups)?.checked_mul(sub)?;
                let dev_off = row.checked_mul(sl)?.checked_add(so)?;
                for (c, slot) in copies
                    .iter_mut()
                    .enumerate()
                    .take(usize::from(self.sub_stripes))
                {
                    *slot = Some(loc(first.checked_add(u64::try_from(c).ok()?)?, dev_off)?);
                }
                in_stripe.min(to_end)
            }
            Profile::Raid5 | Profile::Raid6 => {
                let nd = n.checked_sub(u64::try_from(self.profile.nparity()).ok()?)?;
                let full_nr = stripe_nr.checked_div(nd)?;
                let col = stripe_nr.checked_rem(nd)?;
                let rot = full_nr.checked_rem(n)?;
                let idx = col.checked_add(rot)?.checked_rem(n)?;
                copies[0] = Some(loc(idx, full_nr.checked_mul(sl)?.checked_add(so)?)?);
                in_stripe.min(to_end)
            }
        };
        Some(Mapping {
            copies,
            len: len.min(contiguous),
            profile: self.profile,
        })
    }

    /// Where the parity strips of the row holding `logical` live (P, then Q
    /// for RAID6); empty for other profiles. For a later parity rebuild.
    pub fn parity_of(&self, logical: Logical) -> Vec<StripeLoc> {
        let np = self.profile.nparity();
        let mut out = Vec::new();
        let Some(n) = u64::try_from(self.stripes.len()).ok() else {
            return out;
        };
        let calc = || -> Option<(u64, u64, u64)> {
            let off = logical.get().checked_sub(self.logical.get())?;
            let nd = n.checked_sub(u64::try_from(np).ok()?)?;
            let stripe_nr = off.checked_div(self.stripe_len)?;
            let full_nr = stripe_nr.checked_div(nd)?;
            let rot = full_nr.checked_rem(n)?;
            Some((
                nd,
                rot,
                full_nr
                    .checked_mul(self.stripe_len)?
                    .checked_add(off.checked_rem(self.stripe_len)?)?,
            ))
        };
        let Some((nd, rot, dev_off)) = calc() else {
            return out;
        };
        for p in 0..u64::try_from(np).unwrap_or(0) {
            let idx = nd
                .checked_add(p)
                .and_then(|x| x.checked_add(rot))
                .and_then(|x| x.checked_rem(n));
            if let Some(s) = idx.and_then(|i| self.stripes.get(usize::try_from(i).ok()?))
                && let Some(physical) = s.offset.get().checked_add(dev_off)
            {
                out.push(StripeLoc {
                    devid: s.devid,
                    dev_uuid: s.dev_uuid,
                    physical: Physical(physical),
                });
            }
        }
        out
    }
}

/// The strips of one RAID5/6 row at one offset within its strips.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raid56Row {
    /// The data strips, in logical (column) order.
    pub data: Vec<StripeLoc>,
    /// P, then Q for RAID6.
    pub parity: Vec<StripeLoc>,
    /// The data column holding the address asked for.
    pub col: usize,
    /// Bytes from there to the end of the strip (or the request, or the
    /// chunk): every location above covers them.
    pub len: u64,
}

thread_local! {
    /// Index of the chunk of this thread's last successful lookup (in
    /// whichever map: a stale index only costs the binary search, since the
    /// hit is checked against the address).
    static LAST_HIT: Cell<usize> = const { Cell::new(0) };
}

/// All chunks of a filesystem, sorted by logical address.
#[derive(Debug, Default, Clone)]
pub struct ChunkMap {
    chunks: Vec<ChunkInfo>,
}

impl ChunkMap {
    /// An empty map.
    pub fn new() -> ChunkMap {
        ChunkMap::default()
    }

    /// Add a chunk.
    ///
    /// # Errors
    ///
    /// [`CorruptKind::ChunkOverlap`] if it overlaps a chunk already present.
    pub fn insert(&mut self, chunk: ChunkInfo, location: &Location) -> Result<()> {
        let pos = self.chunks.partition_point(|c| c.logical < chunk.logical);
        let overlap_prev = pos
            .checked_sub(1)
            .and_then(|p| self.chunks.get(p))
            .filter(|p| p.end() > chunk.logical.get());
        let overlap_next = self
            .chunks
            .get(pos)
            .filter(|n| n.logical.get() < chunk.end());
        if let Some(other) = overlap_prev.or(overlap_next) {
            return Err(Error::corrupt(
                location.clone(),
                CorruptKind::ChunkOverlap {
                    logical: chunk.logical,
                    prev_end: other.end(),
                },
            ));
        }
        self.chunks.insert(pos, chunk);
        Ok(())
    }

    /// Bootstrap from a superblock's `sys_chunk_array`.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the byte offset in the array.
    /// Every chunk there must be a SYSTEM chunk (kernel `volumes.c`
    /// `btrfs_read_sys_array`): the array exists to find the chunk tree.
    pub fn from_sys_chunk_array(
        array: &[u8],
        rules: ChunkRules,
        device: &std::path::Path,
    ) -> Result<ChunkMap> {
        let mut map = ChunkMap::new();
        let mut pos = 0usize;
        while pos < array.len() {
            let location = Location::SysChunkArray {
                device: device.to_path_buf(),
                offset: pos,
            };
            let corrupt = |kind| Error::corrupt(location.clone(), kind);
            let rest = array.get(pos..).unwrap_or_default();
            let (key, rest) = DiskKey::ref_from_prefix(rest).map_err(|_| {
                corrupt(CorruptKind::Truncated {
                    what: "key",
                    needed: 17,
                    available: len64(rest.len()),
                })
            })?;
            let key = Key::from(key);
            if key.objectid != ondisk::BTRFS_FIRST_CHUNK_TREE_OBJECTID
                || key.item_type != ondisk::BTRFS_CHUNK_ITEM_KEY
            {
                return Err(corrupt(CorruptKind::UnexpectedKey {
                    key,
                    what: "sys_chunk_array",
                }));
            }
            // The item has no explicit size: derive it from num_stripes.
            let (raw, _) = ondisk::Chunk::ref_from_prefix(rest).map_err(|_| {
                corrupt(CorruptKind::Truncated {
                    what: "chunk item",
                    needed: 48,
                    available: len64(rest.len()),
                })
            })?;
            let size =
                48usize.saturating_add(usize::from(raw.num_stripes.get()).saturating_mul(32));
            let item = rest.get(..size).ok_or_else(|| {
                corrupt(CorruptKind::Truncated {
                    what: "chunk item",
                    needed: u64::try_from(size).unwrap_or(u64::MAX),
                    available: len64(rest.len()),
                })
            })?;
            let chunk = ChunkInfo::parse(key.offset, item, rules, &location)?;
            if chunk.flags & ondisk::BTRFS_BLOCK_GROUP_SYSTEM == 0 {
                return Err(corrupt(CorruptKind::BadField {
                    field: "type",
                    value: chunk.flags,
                    why: "a chunk in sys_chunk_array must be a SYSTEM chunk",
                }));
            }
            map.insert(chunk, &location)?;
            pos = pos.saturating_add(17).saturating_add(size);
        }
        Ok(map)
    }

    /// The chunks, in logical order.
    pub fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }

    /// The chunk containing `logical`. Tries this thread's last hit
    /// first, then binary-searches.
    #[inline]
    pub fn lookup(&self, logical: Logical) -> Option<&ChunkInfo> {
        let last = LAST_HIT.with(Cell::get);
        if let Some(c) = self.chunks.get(last).filter(|c| c.contains(logical)) {
            return Some(c);
        }
        self.search(logical)
    }

    /// The chunk containing `logical` by binary search alone (the slow
    /// path of [`lookup`](Self::lookup); public for the benchmark).
    pub fn search(&self, logical: Logical) -> Option<&ChunkInfo> {
        let idx = self
            .chunks
            .partition_point(|c| c.logical <= logical)
            .checked_sub(1)?;
        let c = self.chunks.get(idx).filter(|c| c.contains(logical))?;
        LAST_HIT.with(|l| l.set(idx));
        Some(c)
    }

    /// Map `[logical, logical + len)`: all copies of its first contiguous
    /// piece ([`Mapping::len`] bytes; map the rest separately).
    ///
    /// # Errors
    ///
    /// [`CorruptKind::Unmapped`] if no chunk holds `logical`.
    pub fn map(&self, logical: Logical, len: u64) -> Result<Mapping> {
        let unmapped = || {
            Error::corrupt(
                Location::Logical(logical),
                CorruptKind::Unmapped { logical },
            )
        };
        let chunk = self.lookup(logical).ok_or_else(unmapped)?;
        chunk.map(logical, len).ok_or_else(unmapped)
    }
}

#[cfg(test)]
mod tests;
