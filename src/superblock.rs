//! The superblock: read, verify and select a copy; check features.
//!
//! Layout: `struct btrfs_super_block` ([`crate::ondisk::SuperBlock`]);
//! validation follows the kernel's `disk-io.c` `btrfs_validate_super` and
//! btrfs-progs' `btrfs_check_super`: an image the kernel
//! would refuse to mount is refused here too, naming the field and the rule. The primary copy at 64 KiB is used when valid; otherwise the valid
//! mirror (64 MiB, 256 GiB) with the highest generation, as btrfs-progs does
//! in recovery. [`Superblock::check_supported`] refuses, by name, features
//! this reader cannot handle.

use std::path::Path;

use zerocopy::FromBytes;

use crate::chunk_map::ChunkRules;
use crate::csum::{Csum, CsumType};
use crate::device::Device;
use crate::error::{CorruptKind, Error, Location, NotBtrfs, Notice, Result, Unsupported};
use crate::ondisk::{self, SuperBlock};
use crate::types::{DevId, Generation, Logical, Physical, Uuid};

/// The physical offset of superblock copy `mirror` (0 = primary).
pub fn super_offset(mirror: u32) -> Physical {
    if mirror == 0 {
        Physical(ondisk::BTRFS_SUPER_INFO_OFFSET)
    } else {
        let shift = ondisk::BTRFS_SUPER_MIRROR_SHIFT.saturating_mul(mirror);
        Physical((16u64 * 1024).checked_shl(shift).unwrap_or(u64::MAX))
    }
}

/// The device item of the device a superblock was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevInfo {
    /// Device id.
    pub devid: DevId,
    /// Device UUID.
    pub uuid: Uuid,
    /// The metadata UUID of its filesystem.
    pub fsid: Uuid,
    /// Its size as recorded.
    pub total_bytes: u64,
}

/// A verified superblock.
#[derive(Debug, Clone)]
pub struct Superblock {
    /// User-visible filesystem UUID.
    pub fsid: Uuid,
    /// The UUID in tree block headers: `metadata_uuid` with
    /// INCOMPAT_METADATA_UUID, else `fsid`.
    pub metadata_uuid: Uuid,
    /// Where this copy was read.
    pub bytenr: Physical,
    /// `BTRFS_SUPER_FLAG_*`.
    pub flags: u64,
    /// Last committed transaction.
    pub generation: Generation,
    /// Root tree root.
    pub root: Logical,
    /// Its level.
    pub root_level: u8,
    /// Chunk tree root.
    pub chunk_root: Logical,
    /// Its level.
    pub chunk_root_level: u8,
    /// Its generation.
    pub chunk_root_generation: Generation,
    /// Log root tree (0 if none).
    pub log_root: Logical,
    /// Its level.
    pub log_root_level: u8,
    /// Sum of device sizes.
    pub total_bytes: u64,
    /// Bytes used.
    pub bytes_used: u64,
    /// Number of devices.
    pub num_devices: u64,
    /// Data block size.
    pub sectorsize: u32,
    /// Tree block size.
    pub nodesize: u32,
    /// `BTRFS_FEATURE_COMPAT_RO_*`.
    pub compat_ro_flags: u64,
    /// `BTRFS_FEATURE_INCOMPAT_*`.
    pub incompat_flags: u64,
    /// Checksum algorithm.
    pub csum_type: CsumType,
    /// This device.
    pub dev_item: DevInfo,
    /// Label bytes (up to the first NUL).
    pub label: Vec<u8>,
    /// The valid part of `sys_chunk_array`.
    pub sys_chunk_array: Vec<u8>,
    /// UUID tree generation.
    pub uuid_tree_generation: Generation,
    raw: Box<SuperBlock>,
}

fn bad(device: &Path, physical: Physical, kind: CorruptKind) -> Error {
    Error::corrupt(
        Location::Superblock {
            device: device.to_path_buf(),
            physical,
        },
        kind,
    )
}

fn field(field: &'static str, value: u64, why: &'static str) -> CorruptKind {
    CorruptKind::BadField { field, value, why }
}

impl Superblock {
    /// Verify and decode one 4096-byte copy read at `physical` of `device`.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a bad magic, checksum, bytenr or field;
    /// [`Error::Unsupported`] for an unknown checksum type.
    pub fn parse(bytes: &[u8], device: &Path, physical: Physical) -> Result<Superblock> {
        let raw = SuperBlock::read_from_bytes(bytes).map_err(|_| {
            bad(
                device,
                physical,
                CorruptKind::Truncated {
                    what: "superblock",
                    needed: 4096,
                    available: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
                },
            )
        })?;
        let bad = |kind| bad(device, physical, kind);
        if raw.magic.get() != ondisk::BTRFS_MAGIC {
            return Err(bad(CorruptKind::BadMagic {
                found: raw.magic.get(),
            }));
        }
        let csum_type = CsumType::from_raw(raw.csum_type.get()).ok_or(Error::Unsupported(
            Unsupported::CsumType(raw.csum_type.get()),
        ))?;
        // OK to index: `raw` is 4096 bytes, so `bytes` is too.
        let covered = bytes.get(ondisk::BTRFS_CSUM_SIZE..).unwrap_or_default();
        if let Err(computed) = csum_type.verify(&raw.csum, covered) {
            return Err(bad(CorruptKind::ChecksumMismatch {
                algo: csum_type,
                stored: Csum::from_stored(csum_type, &raw.csum),
                computed,
            }));
        }
        if raw.bytenr.get() != physical.get() {
            return Err(bad(CorruptKind::BytenrMismatch {
                expected: physical.get(),
                found: raw.bytenr.get(),
            }));
        }

        let sectorsize = raw.sectorsize.get();
        let nodesize = raw.nodesize.get();
        if !sectorsize.is_power_of_two() || !(4096..=65536).contains(&sectorsize) {
            return Err(bad(field(
                "sectorsize",
                sectorsize.into(),
                "must be a power of two in [4096, 65536]",
            )));
        }
        if !nodesize.is_power_of_two()
            || !(4096..=65536).contains(&nodesize)
            || nodesize < sectorsize
        {
            return Err(bad(field(
                "nodesize",
                nodesize.into(),
                "must be a power of two in [sectorsize, 65536]",
            )));
        }
        // The kernel keeps the obsolete leafsize equal to nodesize and
        // refuses a superblock where they differ.
        let leafsize = raw.leafsize.get();
        if leafsize != nodesize {
            return Err(bad(field(
                "leafsize",
                leafsize.into(),
                "must equal nodesize",
            )));
        }
        // Unused for mapping, but the kernel refuses anything that is not a
        // power of two (old mkfs wrote 4096 whatever the sector size).
        let stripesize = raw.stripesize.get();
        if !stripesize.is_power_of_two() {
            return Err(bad(field(
                "stripesize",
                stripesize.into(),
                "must be a power of two",
            )));
        }
        // Every filesystem has at least six trees (root, chunk, extent,
        // dev, fs, csum) of one block each: the kernel's bit-flip hint.
        let bytes_used = raw.bytes_used.get();
        if bytes_used < u64::from(nodesize).saturating_mul(6) {
            return Err(bad(field(
                "bytes_used",
                bytes_used,
                "must be at least 6 * nodesize (one block for each tree every filesystem has)",
            )));
        }
        for (name, level) in [
            ("root_level", raw.root_level),
            ("chunk_root_level", raw.chunk_root_level),
            ("log_root_level", raw.log_root_level),
        ] {
            if level >= ondisk::BTRFS_MAX_LEVEL {
                return Err(bad(field(name, level.into(), "must be below 8")));
            }
        }
        let align = u64::from(sectorsize);
        for (name, addr, required) in [
            ("root", raw.root.get(), true),
            ("chunk_root", raw.chunk_root.get(), true),
            ("log_root", raw.log_root.get(), false),
        ] {
            if (required && addr == 0) || addr % align != 0 {
                return Err(bad(field(
                    name,
                    addr,
                    "must be a non-zero multiple of sectorsize",
                )));
            }
        }
        if raw.total_bytes.get() == 0 {
            return Err(bad(field("total_bytes", 0, "must not be zero")));
        }
        if raw.num_devices.get() == 0 {
            return Err(bad(field("num_devices", 0, "must not be zero")));
        }
        let sys_size = raw.sys_chunk_array_size.get();
        // One key (17) and one single-stripe chunk (48 + 32) at least.
        if !(97..=2048).contains(&sys_size) {
            return Err(bad(field(
                "sys_chunk_array_size",
                sys_size.into(),
                "must be in [97, 2048]",
            )));
        }
        let fsid = Uuid(raw.fsid);
        let metadata_uuid =
            if raw.incompat_flags.get() & ondisk::BTRFS_FEATURE_INCOMPAT_METADATA_UUID != 0 {
                Uuid(raw.metadata_uuid)
            } else {
                fsid
            };
        let dev_fsid = Uuid(raw.dev_item.fsid);
        if dev_fsid != metadata_uuid {
            return Err(bad(CorruptKind::FsidMismatch {
                expected: metadata_uuid,
                found: dev_fsid,
            }));
        }
        let label_len = raw
            .label
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(raw.label.len());
        let sys_len = usize::try_from(sys_size).unwrap_or(usize::MAX);
        Ok(Superblock {
            fsid,
            metadata_uuid,
            bytenr: physical,
            flags: raw.flags.get(),
            generation: Generation(raw.generation.get()),
            root: Logical(raw.root.get()),
            root_level: raw.root_level,
            chunk_root: Logical(raw.chunk_root.get()),
            chunk_root_level: raw.chunk_root_level,
            chunk_root_generation: Generation(raw.chunk_root_generation.get()),
            log_root: Logical(raw.log_root.get()),
            log_root_level: raw.log_root_level,
            total_bytes: raw.total_bytes.get(),
            bytes_used: raw.bytes_used.get(),
            num_devices: raw.num_devices.get(),
            sectorsize,
            nodesize,
            compat_ro_flags: raw.compat_ro_flags.get(),
            incompat_flags: raw.incompat_flags.get(),
            csum_type,
            dev_item: DevInfo {
                devid: DevId(raw.dev_item.devid.get()),
                uuid: Uuid(raw.dev_item.uuid),
                fsid: dev_fsid,
                total_bytes: raw.dev_item.total_bytes.get(),
            },
            label: raw.label.get(..label_len).unwrap_or_default().to_vec(),
            sys_chunk_array: raw
                .sys_chunk_array
                .get(..sys_len)
                .unwrap_or_default()
                .to_vec(),
            uuid_tree_generation: Generation(raw.uuid_tree_generation.get()),
            raw: Box::new(raw),
        })
    }

    /// The raw structure (backup roots, fields not decoded here).
    pub fn raw(&self) -> &SuperBlock {
        &self.raw
    }

    /// What every chunk of this filesystem is checked against.
    pub fn chunk_rules(&self) -> ChunkRules {
        ChunkRules {
            sectorsize: self.sectorsize,
            mixed_groups: self.has_incompat(ondisk::BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS),
        }
    }

    /// Whether an incompat feature bit is set.
    pub fn has_incompat(&self, bit: u64) -> bool {
        self.incompat_flags & bit != 0
    }

    /// Refuse what this reader cannot read; return what the user should know.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] naming the first feature or flag we refuse.
    pub fn check_supported(&self) -> Result<Vec<Notice>> {
        use ondisk::*;
        let refuse = |u| Err(Error::Unsupported(u));
        for (bit, name) in [
            (
                BTRFS_SUPER_FLAG_METADUMP,
                "METADUMP (a btrfs-image dump has no file data)",
            ),
            (
                BTRFS_SUPER_FLAG_METADUMP_V2,
                "METADUMP_V2 (a btrfs-image dump has no file data)",
            ),
            (
                BTRFS_SUPER_FLAG_CHANGING_FSID,
                "CHANGING_FSID (interrupted fsid change)",
            ),
            (
                BTRFS_SUPER_FLAG_CHANGING_FSID_V2,
                "CHANGING_FSID_V2 (interrupted metadata_uuid change)",
            ),
            (
                BTRFS_SUPER_FLAG_CHANGING_BG_TREE,
                "CHANGING_BG_TREE (interrupted conversion)",
            ),
            (
                BTRFS_SUPER_FLAG_CHANGING_DATA_CSUM,
                "CHANGING_DATA_CSUM (interrupted conversion)",
            ),
            (
                BTRFS_SUPER_FLAG_CHANGING_META_CSUM,
                "CHANGING_META_CSUM (interrupted conversion)",
            ),
        ] {
            if self.flags & bit != 0 {
                return refuse(Unsupported::SuperFlag(name));
            }
        }
        for (bit, name) in [
            (BTRFS_FEATURE_INCOMPAT_ZONED, "zoned"),
            (BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2, "extent-tree-v2"),
            (BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE, "raid-stripe-tree"),
            (BTRFS_FEATURE_INCOMPAT_REMAP_TREE, "remap-tree"),
        ] {
            if self.has_incompat(bit) {
                return refuse(Unsupported::IncompatFeature { name, bit });
            }
        }
        let known = BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF
            | BTRFS_FEATURE_INCOMPAT_DEFAULT_SUBVOL
            | BTRFS_FEATURE_INCOMPAT_MIXED_GROUPS
            | BTRFS_FEATURE_INCOMPAT_COMPRESS_LZO
            | BTRFS_FEATURE_INCOMPAT_COMPRESS_ZSTD
            | BTRFS_FEATURE_INCOMPAT_BIG_METADATA
            | BTRFS_FEATURE_INCOMPAT_EXTENDED_IREF
            | BTRFS_FEATURE_INCOMPAT_RAID56
            | BTRFS_FEATURE_INCOMPAT_SKINNY_METADATA
            | BTRFS_FEATURE_INCOMPAT_NO_HOLES
            | BTRFS_FEATURE_INCOMPAT_METADATA_UUID
            | BTRFS_FEATURE_INCOMPAT_RAID1C34
            | BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA;
        let unknown = self.incompat_flags & !known;
        if unknown != 0 {
            return refuse(Unsupported::UnknownIncompat(unknown));
        }
        if !self.has_incompat(BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF) {
            // Pre-2.6.31 filesystems with EXTENT_REF_V0 back references.
            return refuse(Unsupported::IncompatFeature {
                name: "old backref format (mixed-backref not set)",
                bit: BTRFS_FEATURE_INCOMPAT_MIXED_BACKREF,
            });
        }
        let mut notices = Vec::new();
        let known_ro = BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE
            | BTRFS_FEATURE_COMPAT_RO_FREE_SPACE_TREE_VALID
            | BTRFS_FEATURE_COMPAT_RO_VERITY
            | BTRFS_FEATURE_COMPAT_RO_BLOCK_GROUP_TREE;
        if self.compat_ro_flags & !known_ro != 0 {
            notices.push(Notice::UnknownCompatRo(self.compat_ro_flags & !known_ro));
        }
        if self.flags & BTRFS_SUPER_FLAG_ERROR != 0 {
            notices.push(Notice::ErrorFlag);
        }
        if self.log_root.get() != 0 {
            notices.push(Notice::DirtyLog(self.log_root));
        }
        Ok(notices)
    }
}

/// Read one superblock copy.
///
/// # Errors
///
/// As [`Superblock::parse`], and [`Error::Io`].
pub fn read_copy(dev: &dyn Device, mirror: u32) -> Result<Superblock> {
    let offset = super_offset(mirror);
    let mut buf = vec![0u8; ondisk::BTRFS_SUPER_INFO_SIZE];
    dev.read_at(&mut buf, offset)?;
    Superblock::parse(&buf, dev.path(), offset)
}

/// Read the superblock of `dev`: the primary copy, or when it is spoilt (no
/// magic, a checksum mismatch), the valid mirror with the highest
/// generation (with a notice saying so). A primary whose checksum matches
/// but whose fields are invalid is refused, as the kernel refuses it.
///
/// # Errors
///
/// [`Error::NotBtrfs`] when the device is too short to hold the primary
/// copy or no copy carries the btrfs magic; the primary's own error when
/// its checksum matches but a field is invalid, or when it is the only copy
/// that fits on the device; else [`Error::Superblocks`], naming each copy's
/// failure.
pub fn read_superblock(dev: &dyn Device) -> Result<(Superblock, Option<Notice>)> {
    let not_btrfs = |why| Error::NotBtrfs {
        device: dev.path().to_path_buf(),
        why,
    };
    let fits = |mirror: u32| {
        super_offset(mirror)
            .get()
            .checked_add(len64(ondisk::BTRFS_SUPER_INFO_SIZE))
            .is_some_and(|end| end <= dev.size())
    };
    if !fits(0) {
        return Err(not_btrfs(NotBtrfs::TooShort { size: dev.size() }));
    }
    let primary_err = match read_copy(dev, 0) {
        Ok(sb) => return Ok((sb, None)),
        Err(e) => e,
    };
    // A mirror stands in for a primary that a torn write or bit rot
    // spoilt (no magic, a checksum that does not match). A primary whose
    // checksum matches but whose fields break the kernel's rules was
    // written that way: the kernel, which reads only the primary, refuses
    // to mount such a filesystem, and so do we.
    if let Some(c) = primary_err.as_corrupt()
        && !matches!(
            c.kind,
            CorruptKind::BadMagic { .. } | CorruptKind::ChecksumMismatch { .. }
        )
    {
        return Err(primary_err);
    }
    let mut failures = vec![(super_offset(0), primary_err)];
    let mut best: Option<Superblock> = None;
    for mirror in 1..ondisk::BTRFS_SUPER_MIRROR_MAX {
        if !fits(mirror) {
            break;
        }
        match read_copy(dev, mirror) {
            Ok(sb) => {
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
            Err(e) => failures.push((super_offset(mirror), e)),
        }
    }
    if let Some(sb) = best {
        let (_, primary_err) = failures.swap_remove(0);
        let reason = match primary_err {
            Error::Corrupt(c) => c.kind.to_string(),
            e => e.to_string(),
        };
        let notice = Notice::SuperblockMirror {
            device: dev.path().to_path_buf(),
            mirror: sb.bytenr,
            reason,
        };
        return Ok((sb, Some(notice)));
    }
    let no_magic = failures.iter().all(|(_, e)| {
        matches!(e.as_corrupt(), Some(c) if matches!(c.kind, CorruptKind::BadMagic { .. }))
    });
    if no_magic {
        return Err(not_btrfs(NotBtrfs::NoMagic {
            copies: failures.iter().map(|(p, _)| *p).collect(),
        }));
    }
    if failures.len() == 1 {
        let (_, e) = failures.swap_remove(0);
        return Err(e);
    }
    Err(Error::Superblocks {
        device: dev.path().to_path_buf(),
        copies: failures,
    })
}

fn len64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    /// The primary superblock of a kernel-made image (mkfs.btrfs 6.2 default
    /// options, kernel 6.18; see `testdata/README.md`).
    const SUPER: &[u8; 4096] = include_bytes!("testdata/super-crc32c.bin");

    fn parse(bytes: &[u8]) -> Result<Superblock> {
        Superblock::parse(bytes, Path::new("img"), Physical(65536))
    }

    #[test]
    fn kernel_superblock() {
        let sb = parse(SUPER).unwrap();
        assert_eq!(sb.csum_type, CsumType::Crc32c);
        assert_eq!(sb.nodesize, 16384);
        assert_eq!(sb.sectorsize, 4096);
        assert_eq!(sb.num_devices, 1);
        assert_eq!(sb.dev_item.devid, DevId(1));
        assert_eq!(sb.metadata_uuid, sb.fsid);
        assert!(sb.check_supported().unwrap().is_empty());
    }

    /// `csum` and `fsid` as `btrfs inspect-internal dump-super` printed them.
    #[test]
    fn all_checksum_algorithms_match_dump_super() {
        let cases: [(&[u8], CsumType, &str, &str); 4] = [
            (
                SUPER,
                CsumType::Crc32c,
                "0xd0e7b272",
                "aa751912-02b8-4b4b-85b4-6f7430c22e43",
            ),
            (
                include_bytes!("testdata/super-xxhash.bin"),
                CsumType::Xxhash64,
                "0x48b4605dc5907f82",
                "1b01d9a0-8ec5-4f15-8304-87ffac351bfb",
            ),
            (
                include_bytes!("testdata/super-sha256.bin"),
                CsumType::Sha256,
                "0x5dc1a45487730d3e587ca8a5473cd15b3303c1535cbdf4304db19d47b2edce00",
                "2c01c3b1-fbe5-4740-9f25-b3222080b671",
            ),
            (
                include_bytes!("testdata/super-blake2.bin"),
                CsumType::Blake2b,
                "0x8f5df9b4e26d420b6869e1eaa1fce5bc76ec82a7faaf19b1077f0f39968a4747",
                "55914553-9929-4a13-9f12-548df42edc5a",
            ),
        ];
        for (bytes, ty, csum, fsid) in cases {
            let sb = parse(bytes).unwrap();
            assert_eq!(sb.csum_type, ty);
            assert_eq!(ty.compute(&bytes[32..]).to_string(), csum);
            assert_eq!(sb.fsid.to_string(), fsid);
            assert_eq!(sb.incompat_flags, 0x361);
            // One flipped bit in the covered area must be caught.
            let mut b = bytes.to_vec();
            b[0x200] ^= 0x10;
            let msg = parse(&b).unwrap_err().to_string();
            assert!(
                msg.contains(&format!(
                    "{} checksum mismatch: stored {csum}, computed 0x",
                    ty.name()
                )),
                "{msg}"
            );
        }
    }

    #[test]
    fn mirror_offsets() {
        assert_eq!(super_offset(0), Physical(65536));
        assert_eq!(super_offset(1), Physical(64 << 20));
        assert_eq!(super_offset(2), Physical(256 << 30));
    }

    fn patched(off: usize, bytes: &[u8], fix_csum: bool) -> Vec<u8> {
        let mut b = SUPER.to_vec();
        b[off..off + bytes.len()].copy_from_slice(bytes);
        if fix_csum {
            let c = CsumType::Crc32c.compute(&b[32..]);
            b[..4].copy_from_slice(c.as_bytes());
        }
        b
    }

    #[test]
    fn bad_magic() {
        let e = parse(&patched(0x40, b"_BHRfS_X", false)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt superblock on img at physical 65536: bad magic 0x585f53665248425f, expected _BHRfS_M"
        );
    }

    #[test]
    fn bad_checksum() {
        let e = parse(&patched(0x12B, b"x", false)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "corrupt superblock on img at physical 65536: crc32c checksum mismatch: stored 0x"
            ),
            "{msg}"
        );
    }

    #[test]
    fn bytenr_mismatch() {
        let e = Superblock::parse(SUPER, Path::new("img"), Physical(64 << 20)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt superblock on img at physical 67108864: bytenr mismatch: expected 67108864, found 65536"
        );
    }

    #[test]
    fn unknown_checksum_type_is_unsupported() {
        // csum_type (u16 at 0xc4) 9, resealed with crc32c as if it were.
        let e = parse(&patched(0xc4, &9u16.to_le_bytes(), true)).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        assert_eq!(e.to_string(), "unsupported checksum type 9");
    }

    #[test]
    fn bad_nodesize() {
        let e = parse(&patched(0x94, &12288u32.to_le_bytes(), true)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt superblock on img at physical 65536: invalid nodesize 12288: must be a power of two in [sectorsize, 65536]"
        );
    }

    /// The kernel's `btrfs_validate_super` rules beyond the checksum, each on
    /// a resealed kernel-made superblock.
    #[test]
    fn kernel_field_rules() {
        let cases: [(usize, Vec<u8>, &str); 4] = [
            (
                0x9c,
                593920u32.to_le_bytes().to_vec(),
                "invalid stripesize 593920: must be a power of two",
            ),
            (
                0x98,
                4096u32.to_le_bytes().to_vec(),
                "invalid leafsize 4096: must equal nodesize",
            ),
            (
                0x78,
                (6 * 16384 - 1u64).to_le_bytes().to_vec(),
                "invalid bytes_used 98303: must be at least 6 * nodesize (one block for each \
                 tree every filesystem has)",
            ),
            (
                0x70,
                0u64.to_le_bytes().to_vec(),
                "invalid total_bytes 0: must not be zero",
            ),
        ];
        for (off, bytes, why) in cases {
            let e = parse(&patched(off, &bytes, true)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("corrupt superblock on img at physical 65536: {why}")
            );
        }
        // Every power of two is a stripesize the kernel takes (old mkfs
        // wrote 4096 whatever the sector size), and 6 * nodesize is enough.
        parse(&patched(0x9c, &65536u32.to_le_bytes(), true)).unwrap();
        parse(&patched(0x78, &(6 * 16384u64).to_le_bytes(), true)).unwrap();
    }

    /// A primary whose checksum matches but whose fields are invalid was
    /// written that way: the kernel refuses it, so no mirror stands in.
    #[test]
    fn a_sealed_invalid_primary_is_refused_not_replaced() {
        let mut dev = image_with(&[(1, 9)]);
        let bad = patched(0x9c, &12345u32.to_le_bytes(), true);
        dev.data_mut()[65536..65536 + 4096].copy_from_slice(&bad);
        assert_eq!(
            read_superblock(&dev).unwrap_err().to_string(),
            "corrupt superblock on mem at physical 65536: invalid stripesize 12345: must be a \
             power of two"
        );
    }

    #[test]
    fn refuses_features_by_name() {
        let incompat = u64::from_le_bytes(SUPER[0xBC..0xC4].try_into().unwrap());
        let with = |bit: u64| {
            parse(&patched(0xBC, &(incompat | bit).to_le_bytes(), true))
                .unwrap()
                .check_supported()
        };
        assert_eq!(
            with(ondisk::BTRFS_FEATURE_INCOMPAT_ZONED)
                .unwrap_err()
                .to_string(),
            "unsupported incompat feature zoned (0x1000)"
        );
        assert_eq!(
            with(ondisk::BTRFS_FEATURE_INCOMPAT_RAID_STRIPE_TREE)
                .unwrap_err()
                .to_string(),
            "unsupported incompat feature raid-stripe-tree (0x4000)"
        );
        assert_eq!(
            with(ondisk::BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2)
                .unwrap_err()
                .to_string(),
            "unsupported incompat feature extent-tree-v2 (0x2000)"
        );
        assert_eq!(
            with(ondisk::BTRFS_FEATURE_INCOMPAT_REMAP_TREE)
                .unwrap_err()
                .to_string(),
            "unsupported incompat feature remap-tree (0x20000)"
        );
        assert_eq!(
            with(1 << 15).unwrap_err().to_string(),
            "unknown incompat feature bits 0x8000"
        );
        let flags = u64::from_le_bytes(SUPER[0x38..0x40].try_into().unwrap());
        let e = parse(&patched(
            0x38,
            &(flags | ondisk::BTRFS_SUPER_FLAG_METADUMP).to_le_bytes(),
            true,
        ))
        .unwrap()
        .check_supported()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "unsupported superblock flag METADUMP (a btrfs-image dump has no file data)"
        );
    }

    #[test]
    fn dirty_log_notice() {
        let n = parse(&patched(0x60, &(30u64 << 20).to_le_bytes(), true))
            .unwrap()
            .check_supported()
            .unwrap();
        assert_eq!(n.len(), 1);
        assert_eq!(
            n[0].to_string(),
            "dirty log tree: reading the last committed state (log root at logical 31457280)"
        );
    }

    fn image_with(copies: &[(u32, u64)]) -> MemDevice {
        // A sparse in-memory device with superblock copies of given
        // generations (0 = a corrupt copy).
        let mut data = vec![0u8; (64 << 20) + 4096];
        for &(mirror, generation) in copies {
            let off = super_offset(mirror).get() as usize;
            let mut b = patched(0x30, &(off as u64).to_le_bytes(), true);
            b[0x48..0x50].copy_from_slice(&generation.to_le_bytes());
            let c = CsumType::Crc32c.compute(&b[32..]);
            b[..4].copy_from_slice(c.as_bytes());
            if generation == 0 {
                b[100] ^= 1;
            }
            data[off..off + 4096].copy_from_slice(&b);
        }
        MemDevice::new(data, "mem")
    }

    #[test]
    fn primary_preferred_even_if_older() {
        let dev = image_with(&[(0, 5), (1, 9)]);
        let (sb, notice) = read_superblock(&dev).unwrap();
        assert_eq!((sb.generation, sb.bytenr), (Generation(5), Physical(65536)));
        assert!(notice.is_none());
    }

    #[test]
    fn falls_back_to_mirror() {
        let dev = image_with(&[(0, 0), (1, 9)]);
        let (sb, notice) = read_superblock(&dev).unwrap();
        assert_eq!(
            (sb.generation, sb.bytenr),
            (Generation(9), Physical(64 << 20))
        );
        let msg = notice.unwrap().to_string();
        assert!(
            msg.starts_with(
                "primary superblock on mem is bad (crc32c checksum mismatch: stored 0x"
            ),
            "{msg}"
        );
        assert!(
            msg.ends_with("; using the mirror at physical 67108864"),
            "{msg}"
        );
    }

    /// The stored and computed crc32c of a copy `image_with` spoilt.
    fn spoilt_csums(dev: &MemDevice, mirror: u32) -> (String, String) {
        let mut b = vec![0u8; 4096];
        dev.read_at(&mut b, super_offset(mirror)).unwrap();
        // Printed as dump-super prints them: the stored bytes in order; the
        // standard CRC-32C of the covered bytes (crate crc32c) stored
        // little-endian.
        let hex = |bytes: &[u8]| {
            let digits: String = bytes.iter().map(|x| format!("{x:02x}")).collect();
            format!("0x{digits}")
        };
        (hex(&b[..4]), hex(&crc32c::crc32c(&b[32..]).to_le_bytes()))
    }

    #[test]
    fn every_bad_copy_is_named() {
        let dev = image_with(&[(0, 0), (1, 0)]);
        let (s0, c0) = spoilt_csums(&dev, 0);
        let (s1, c1) = spoilt_csums(&dev, 1);
        assert_eq!(
            read_superblock(&dev).unwrap_err().to_string(),
            format!(
                "every superblock copy on mem is bad: primary at physical 65536: crc32c checksum \
                 mismatch: stored {s0}, computed {c0}; mirror 1 at physical 67108864: crc32c \
                 checksum mismatch: stored {s1}, computed {c1}"
            )
        );
        // A device holding only the primary: its own error.
        let mut small = vec![0u8; 1 << 20];
        small[65536..65536 + 4096].copy_from_slice(&patched(0x12B, b"x", false));
        let e = read_superblock(&MemDevice::new(small, "mem")).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "corrupt superblock on mem at physical 65536: crc32c checksum mismatch: stored 0x"
            ),
            "{e}"
        );
    }

    #[test]
    fn not_btrfs() {
        let e = read_superblock(&MemDevice::new(vec![0; 1000], "short.img")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a btrfs filesystem: short.img (1000 bytes, too short to hold a superblock: \
             the primary copy ends at byte 69632)"
        );
        let e = read_superblock(&MemDevice::new(vec![0; 69631], "short.img")).unwrap_err();
        assert!(e.to_string().contains("(69631 bytes, too short"), "{e}");
        let e = read_superblock(&MemDevice::new(vec![0; 69632], "zero.img")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a btrfs filesystem: zero.img (no btrfs superblock magic at physical 65536)"
        );
        let e = read_superblock(&image_with(&[])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a btrfs filesystem: mem (no btrfs superblock magic at physical 65536 or 67108864)"
        );
        // One copy with the magic: corrupt, not "not btrfs".
        let e = read_superblock(&image_with(&[(1, 0)])).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "every superblock copy on mem is bad: primary at physical 65536: bad magic \
                 0x0000000000000000, expected _BHRfS_M; mirror 1 at physical 67108864: crc32c \
                 checksum mismatch: stored 0x"
            ),
            "{e}"
        );
    }
}
