//! The kernel's tree-checker refusals (`fs/btrfs/tree-checker.c`), each on a
//! resealed real block: one field of a leaf of the kernel-made `001-basic`
//! image is patched in both DUP copies and the checksum recomputed, then
//!
//! * btrsend must refuse the send with the exact message naming the leaf,
//!   the slot, the key and the rule;
//! * the kernel (live, as root; CI must run it) must refuse the same leaf:
//!   the patched image mounted read-only gives EIO when the snapshot is
//!   read, and the kernel log names the same block and slot with its own
//!   reason ("corrupt leaf: root=… block=… slot=…, name hash mismatch …").
//!
//! The same for what the kernel checks when it mounts (issue 28 item 9):
//! root items and chunk items in the root tree, the superblock's fields
//! (`disk-io.c` `btrfs_validate_super`) and its sys_chunk_array
//! (`volumes.c` `btrfs_read_sys_array`), patched in every superblock copy
//! and resealed. There the kernel refuses the mount itself, naming the
//! rule in its log.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use btrsend::fs::Filesystem;
use btrsend::ondisk;
use btrsend::send::{self, NoProgress, SendOptions};
use btrsend::tree::key::Key;
use btrsend::tree::walk::Cursor;
use btrsend::types::{Logical, TreeId};
use btrsend::volume::Volume;

use crate::reader::fixtures;

/// One mount at a time: the patched images share the fixture's fsid.
static MOUNTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// An item of the clean image: where it lives and where its data starts in
/// its leaf.
struct Found {
    leaf: Logical,
    slot: u32,
    key: Key,
    tree: TreeId,
    data_at: usize,
    data: Vec<u8>,
}

fn image_001() -> Option<PathBuf> {
    fixtures()
        .into_iter()
        .find(|f| f.name().starts_with("001"))
        .map(|f| f.devices[0].clone())
}

/// The first item of the snapshot's tree (257, `snaps/basic`) that `pick`
/// accepts.
fn find(img: &Path, pick: impl Fn(&Key, &[u8]) -> bool) -> Found {
    find_in(img, TreeId(257), pick)
}

/// The first item of `tree` (the root tree included) that `pick` accepts.
fn find_in(img: &Path, tree: TreeId, pick: impl Fn(&Key, &[u8]) -> bool) -> Found {
    let fs = Filesystem::open(&[img]).unwrap();
    let root = if tree == TreeId::ROOT {
        fs.volume().root_tree()
    } else {
        fs.tree_root(tree).unwrap()
    };
    let mut c = Cursor::new(fs.volume(), root);
    c.seek(&Key::MIN).unwrap();
    loop {
        let leaf = c.leaf().unwrap().clone();
        let it = c.current().unwrap();
        if pick(&it.key, it.data) {
            let base = leaf.bytes().as_ptr() as usize;
            return Found {
                leaf: it.leaf,
                slot: it.slot,
                key: it.key,
                tree: it.tree,
                data_at: it.data.as_ptr() as usize - base,
                data: it.data.to_vec(),
            };
        }
        assert!(c.advance().unwrap(), "no such item in tree {tree}");
    }
}

/// A copy of `img` in `dir` with `patch` applied to the leaf of `f` (its
/// bytes, and the item data's offset in them) in every copy, resealed.
fn patched(img: &Path, dir: &Path, f: &Found, patch: impl Fn(&mut [u8], usize)) -> PathBuf {
    let vol = Volume::open(&[img]).unwrap();
    let nodesize = vol.superblock().nodesize as usize;
    let copies: Vec<usize> = vol
        .chunk_map()
        .map(f.leaf, nodesize as u64)
        .unwrap()
        .copies()
        .map(|c| c.physical.get() as usize)
        .collect();
    assert_eq!(copies.len(), 2, "001 has DUP metadata");
    drop(vol);
    let mut bytes = fs::read(img).unwrap();
    for p in copies {
        let block = &mut bytes[p..p + nodesize];
        patch(block, f.data_at);
        let c = crc32c::crc32c(&block[32..]);
        block[..4].copy_from_slice(&c.to_le_bytes());
    }
    let out = dir.join("patched.img");
    fs::write(&out, &bytes).unwrap();
    out
}

/// Our error sending the snapshot `snaps/basic` of `img`, without the
/// `inode N (path): ` the planner puts before it when it was working on an
/// inode.
fn our_error(img: &Path) -> String {
    let r = Filesystem::open(&[img])
        .map_err(|e| e.to_string())
        .and_then(|fs| {
            let sv = send::find_subvolume(&fs, "snaps/basic").map_err(|e| e.to_string())?;
            send::send_full(&fs, &sv, std::io::sink(), SendOptions::new(2), &NoProgress)
                .map_err(|e| e.to_string())?;
            Ok(())
        });
    let e = match r {
        Ok(()) => panic!("{}: the patched leaf was accepted", img.display()),
        Err(e) => e,
    };
    match e
        .strip_prefix("inode ")
        .and_then(|r| r.find(": corrupt item "))
    {
        Some(i) => e["inode ".len() + i + 2..].to_owned(),
        None => e,
    }
}

/// The message for the item `f` with `what`, both DUP copies patched alike.
fn item_error(f: &Found, what: &str) -> String {
    format!(
        "corrupt item {} key {} in leaf at logical {} (tree {}): {what} (the same in all 2 copies)",
        f.slot, f.key, f.leaf, f.tree
    )
}

/// The kernel's view: mount `img` read-only, read the snapshot; it must
/// fail with EIO and the kernel log must name the leaf and slot of `f`
/// and `reason`. Skipped loudly (failing in CI) without root.
fn kernel_refuses(test: &str, img: &Path, f: &Found, reason: &str) {
    if !btrsend::testing::require_live(test) {
        return;
    }
    let _one = MOUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let want = format!("block={} slot={}", f.leaf, f.slot);
    let mut new = String::new();
    for attempt in 0..2 {
        if attempt > 0 {
            wait_out_rate_limit();
        }
        let mark = log_mark(test);
        let mnt = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-o", "ro,loop"])
            .arg(img)
            .arg(mnt.path())
            .status()
            .unwrap();
        assert!(st.success(), "{test}: mount failed");
        struct Umount<'a>(&'a Path);
        impl Drop for Umount<'_> {
            fn drop(&mut self) {
                let _ = Command::new("umount").arg(self.0).status();
            }
        }
        let guard = Umount(mnt.path());
        let snap = mnt.path().join("snaps/basic");
        let out = Command::new("sh")
            .arg("-c")
            .arg(
                "find \"$1\" -print0 | xargs -0 stat > /dev/null; \
                 find \"$1\" -type f -print0 | xargs -0 cat > /dev/null",
            )
            .arg("sh")
            .arg(&snap)
            .output()
            .unwrap();
        drop(guard);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Input/output error"),
            "{test}: the kernel read the patched snapshot without EIO: {err}"
        );
        new = log_since(&mark);
        if new
            .lines()
            .any(|l| l.contains("corrupt leaf") && l.contains(&want) && l.contains(reason))
        {
            return;
        }
    }
    panic!("{test}: no kernel message with {want:?} and {reason:?} in:\n{new}");
}

/// Mark the kernel log with a line of its own, so that what follows can
/// be told from what came before: the log is a ring, whose start rotates
/// out as the tests' corrupt blocks fill it with page dumps.
fn log_mark(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mark = format!("btrsend tree_checker {test} {nanos}");
    fs::write("/dev/kmsg", format!("{mark}\n")).unwrap();
    mark
}

/// The kernel log from `mark` on.
fn log_since(mark: &str) -> String {
    let all = dmesg();
    match all.rfind(mark) {
        Some(i) => all[i..].to_owned(),
        None => all,
    }
}

/// btrfs rate-limits its messages (`_btrfs_printk`: at most 100 per level
/// in 5 s), and the corrupt images of these tests together print more:
/// a refusal can then be logged as "callbacks suppressed" only. Past the
/// window a second try is logged in full.
fn wait_out_rate_limit() {
    std::thread::sleep(std::time::Duration::from_secs(6));
}

fn dmesg() -> String {
    let out = Command::new("dmesg").output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn dir_item_name_hash_is_checked() {
    let Some(img) = image_001() else { return };
    let f = find(&img, |k, _| k.item_type == ondisk::BTRFS_DIR_ITEM_KEY);
    // The first name byte of the first record (after the 30-byte header).
    let name_len = u16::from_le_bytes(f.data[27..29].try_into().unwrap()) as usize;
    let mut name = f.data[30..30 + name_len].to_vec();
    name[0] ^= 0x20;
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, at| b[at + 30] ^= 0x20);
    // The hash of the patched name: the kernel's btrfs_name_hash, i.e. the
    // raw crc32c seeded with ~1 (crate crc32c: !crc32c_append(1, name)).
    let hash = u64::from(!crc32c::crc32c_append(1, &name));
    assert_eq!(
        our_error(&p),
        item_error(
            &f,
            &format!(
                "name hash mismatch: key offset {:#x}, but the name \"{}\" hashes to {hash:#x}",
                f.key.offset,
                name.escape_ascii()
            )
        )
    );
    kernel_refuses(
        "dir_item_name_hash_is_checked",
        &p,
        &f,
        "name hash mismatch",
    );
}

#[test]
fn dir_item_location_key_offset_is_checked() {
    let Some(img) = image_001() else { return };
    let f = find(&img, |k, d| {
        k.item_type == ondisk::BTRFS_DIR_INDEX_KEY && d[8] == ondisk::BTRFS_INODE_ITEM_KEY
    });
    let tmp = tempfile::tempdir().unwrap();
    // location = (objectid u64, type u8, offset u64): offset at 9.
    let p = patched(&img, tmp.path(), &f, |b, at| b[at + 9] = 1);
    assert_eq!(
        our_error(&p),
        item_error(&f, "invalid location key offset 1: must be 0")
    );
    kernel_refuses(
        "dir_item_location_key_offset_is_checked",
        &p,
        &f,
        "invalid location key offset",
    );
}

#[test]
fn inode_generation_newer_than_the_superblock_is_checked() {
    let Some(img) = image_001() else { return };
    let f = find(&img, |k, _| {
        k.item_type == ondisk::BTRFS_INODE_ITEM_KEY && k.objectid > 256
    });
    // The superblock's generation as btrfs-progs prints it.
    let Some(dump) = crate::reader::progs(
        &["inspect-internal", "dump-super"],
        std::slice::from_ref(&img),
    ) else {
        return;
    };
    let generation: u64 = dump
        .lines()
        .find_map(|l| l.strip_prefix("generation"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // + 1 is allowed (the log tree's transaction): + 2 is not.
    let ok = patched(&img, tmp.path(), &f, |b, at| {
        b[at..at + 8].copy_from_slice(&(generation + 1).to_le_bytes())
    });
    let fs = Filesystem::open(&[&ok]).unwrap();
    for sv in btrsend::fs::subvol::list_subvolumes(&fs).unwrap() {
        send::send_full(&fs, &sv, std::io::sink(), SendOptions::new(2), &NoProgress).unwrap();
    }
    drop(fs);
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at..at + 8].copy_from_slice(&(generation + 2).to_le_bytes())
    });
    assert_eq!(
        our_error(&p),
        item_error(
            &f,
            &format!(
                "inode generation {} is newer than the filesystem: the superblock's generation \
                 is {generation}, so at most {} is possible",
                generation + 2,
                generation + 1
            )
        )
    );
    kernel_refuses(
        "inode_generation_newer_than_the_superblock_is_checked",
        &p,
        &f,
        "invalid inode generation",
    );
}

/// A regular (not inline) extent with data.
fn regular_extent(k: &Key, d: &[u8]) -> bool {
    k.item_type == ondisk::BTRFS_EXTENT_DATA_KEY
        && d[20] == ondisk::BTRFS_FILE_EXTENT_REG
        && u64_at(d, 21) != 0
}

#[test]
fn unaligned_file_extent_offsets_are_checked() {
    let Some(img) = image_001() else { return };
    let f = find(&img, regular_extent);
    let tmp = tempfile::tempdir().unwrap();
    // The extent's data offset (header 21 + disk_bytenr 8 + disk_num_bytes 8).
    let offset = u64_at(&f.data, 37);
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at + 37..at + 45].copy_from_slice(&(offset + 512).to_le_bytes())
    });
    assert_eq!(
        our_error(&p),
        item_error(
            &f,
            &format!(
                "unaligned file extent data offset {}: must be a multiple of the sector size 4096",
                offset + 512
            )
        )
    );
    kernel_refuses(
        "unaligned_file_extent_offsets_are_checked",
        &p,
        &f,
        "invalid offset for file extent",
    );
}

#[test]
fn unaligned_file_offset_is_checked() {
    let Some(img) = image_001() else { return };
    // An extent whose key offset can move by 512 without passing the next
    // key: the last EXTENT_DATA of its inode in the leaf is enough, as the
    // next key belongs to another inode.
    let f = find(&img, regular_extent);
    assert!(f.slot > 0, "slot 0 would also change the parent's key");
    let tmp = tempfile::tempdir().unwrap();
    // The key offset in the item header: slot * 25 + 101, offset at 9.
    let slot = f.slot as usize;
    let p = patched(&img, tmp.path(), &f, |b, _| {
        let at = 101 + slot * 25 + 9;
        let off = u64_at(b, at);
        b[at..at + 8].copy_from_slice(&(off + 512).to_le_bytes());
    });
    let key = Key::new(f.key.objectid, f.key.item_type, f.key.offset + 512);
    let f = Found { key, ..f };
    let msg = our_error(&p);
    assert_eq!(
        msg,
        item_error(
            &f,
            &format!(
                "unaligned file extent offset {}: must be a multiple of the sector size 4096",
                f.key.offset
            )
        )
    );
    kernel_refuses(
        "unaligned_file_offset_is_checked",
        &p,
        &f,
        "unaligned file_offset for file extent",
    );
}

/// Our error opening `img` and sending every subvolume: the first one.
fn our_open_error(img: &Path) -> String {
    let r = Filesystem::open(&[img])
        .map_err(|e| e.to_string())
        .and_then(|fs| {
            let subvols = btrsend::fs::subvol::list_subvolumes(&fs).map_err(|e| e.to_string())?;
            for sv in subvols {
                send::send_full(&fs, &sv, std::io::sink(), SendOptions::new(2), &NoProgress)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        });
    match r {
        Ok(()) => panic!("{}: the patched image was accepted", img.display()),
        Err(e) => e,
    }
}

/// The kernel's view of a filesystem it must not mount: `mount -o ro` of
/// `img` fails and the kernel log has a btrfs line with `reason`. Skipped
/// loudly (failing in CI) without root.
fn kernel_refuses_mount(test: &str, img: &Path, reason: &str) {
    if !btrsend::testing::require_live(test) {
        return;
    }
    let _one = MOUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut new = String::new();
    for attempt in 0..2 {
        if attempt > 0 {
            wait_out_rate_limit();
        }
        let mark = log_mark(test);
        let mnt = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-o", "ro,loop"])
            .arg(img)
            .arg(mnt.path())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        if st.success() {
            let _ = Command::new("umount").arg(mnt.path()).status();
            panic!("{test}: the kernel mounted the patched image");
        }
        new = log_since(&mark);
        if new
            .lines()
            .any(|l| l.contains("BTRFS") && l.contains(reason))
        {
            return;
        }
    }
    panic!("{test}: no kernel message with {reason:?} in:\n{new}");
}

/// The superblock's generation as btrfs-progs prints it.
fn super_generation(img: &Path) -> Option<u64> {
    let dump = crate::reader::progs(&["inspect-internal", "dump-super"], &[img.to_path_buf()])?;
    Some(
        dump.lines()
            .find_map(|l| l.strip_prefix("generation"))
            .unwrap()
            .trim()
            .parse()
            .unwrap(),
    )
}

#[test]
fn root_item_generation_newer_than_the_superblock_is_checked() {
    let Some(img) = image_001() else { return };
    let Some(generation) = super_generation(&img) else {
        return;
    };
    let f = find_in(&img, TreeId::ROOT, |k, _| {
        k.item_type == ondisk::BTRFS_ROOT_ITEM_KEY && k.objectid == 5
    });
    let tmp = tempfile::tempdir().unwrap();
    // generation: after the 160-byte embedded inode item.
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at + 160..at + 168].copy_from_slice(&(generation + 2).to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        item_error(
            &f,
            &format!(
                "root generation {} is newer than the filesystem: the superblock's generation \
                 is {generation}, so at most {} is possible",
                generation + 2,
                generation + 1
            )
        )
    );
    kernel_refuses_mount(
        "root_item_generation_newer_than_the_superblock_is_checked",
        &p,
        "invalid root generation",
    );
}

#[test]
fn reloc_tree_of_a_negative_root_is_checked() {
    let Some(img) = image_001() else { return };
    // The data reloc tree (-9) has the highest key of the root tree, so
    // its key can become the reloc tree (-8) of root -5 in place.
    let f = find_in(&img, TreeId::ROOT, |k, _| {
        k.item_type == ondisk::BTRFS_ROOT_ITEM_KEY
            && k.objectid == ondisk::BTRFS_DATA_RELOC_TREE_OBJECTID
    });
    let slot = f.slot as usize;
    let key = Key::new(
        ondisk::BTRFS_TREE_RELOC_OBJECTID,
        ondisk::BTRFS_ROOT_ITEM_KEY,
        -5i64 as u64,
    );
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, _| {
        let at = 101 + slot * 25;
        b[at..at + 8].copy_from_slice(&key.objectid.to_le_bytes());
        b[at + 9..at + 17].copy_from_slice(&key.offset.to_le_bytes());
    });
    let f = Found { key, ..f };
    assert_eq!(
        our_open_error(&p),
        item_error(
            &f,
            "invalid reloc tree root id (key offset) 18446744073709551611: a reloc tree belongs \
             to a subvolume tree (5, or 256 to 2^63 - 1)"
        )
    );
    kernel_refuses_mount(
        "reloc_tree_of_a_negative_root_is_checked",
        &p,
        "invalid reloc tree for root -5",
    );
}

#[test]
fn chunk_item_outside_the_chunk_tree_is_checked() {
    let Some(img) = image_001() else { return };
    // The extent tree's root item (2 ROOT_ITEM 0) becomes (2 CHUNK_ITEM 0),
    // still before (4 …): a chunk item whose 439 bytes fit no stripe count.
    let f = find_in(&img, TreeId::ROOT, |k, _| {
        k.item_type == ondisk::BTRFS_ROOT_ITEM_KEY && k.objectid == 2
    });
    let slot = f.slot as usize;
    // num_stripes (at 44 of a chunk item): 2, for 112 bytes, not 439.
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[101 + slot * 25 + 8] = ondisk::BTRFS_CHUNK_ITEM_KEY;
        b[at + 44..at + 46].copy_from_slice(&2u16.to_le_bytes());
    });
    let err = our_open_error(&p);
    let f = Found {
        key: Key::new(2, ondisk::BTRFS_CHUNK_ITEM_KEY, 0),
        ..f
    };
    assert_eq!(err, item_error(&f, "bad chunk item size 439, expected 112"));
    kernel_refuses_mount(
        "chunk_item_outside_the_chunk_tree_is_checked",
        &p,
        "invalid chunk item size: have 439 expect 112",
    );
}

/// A copy of `img` in `dir` with `patch` applied to every superblock copy
/// (the primary and each mirror the image holds), resealed.
fn patched_supers(img: &Path, dir: &Path, patch: impl Fn(&mut [u8])) -> PathBuf {
    let mut bytes = fs::read(img).unwrap();
    let mut n = 0;
    for off in [65536usize, 64 << 20, 256 << 30] {
        let Some(sb) = bytes.get_mut(off..off + 4096) else {
            break;
        };
        assert_eq!(&sb[0x40..0x48], b"_BHRfS_M");
        patch(sb);
        let c = crc32c::crc32c(&sb[32..]);
        sb[..4].copy_from_slice(&c.to_le_bytes());
        n += 1;
    }
    assert_eq!(n, 2, "001 holds the primary and mirror 1");
    let out = dir.join("patched.img");
    fs::write(&out, &bytes).unwrap();
    out
}

#[test]
fn bogus_stripesize_is_checked() {
    let Some(img) = image_001() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // The value of btrfs-progs' fuzz image superblock-stripsize-bogus.
    let p = patched_supers(&img, tmp.path(), |sb| {
        sb[0x9c..0xa0].copy_from_slice(&593920u32.to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        format!(
            "corrupt superblock on {} at physical 65536: invalid stripesize 593920: must be a \
             power of two",
            p.display()
        )
    );
    kernel_refuses_mount(
        "bogus_stripesize_is_checked",
        &p,
        "invalid stripesize 593920",
    );
}

#[test]
fn huge_system_chunk_is_checked() {
    let Some(img) = image_001() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // The length of the first chunk of sys_chunk_array (0x32b), after its
    // 17-byte key: 2.4e18 bytes, a multiple of the sector size, as in
    // btrfs-progs' fuzz image bko-199833.
    let p = patched_supers(&img, tmp.path(), |sb| {
        let at = 0x32b + 17;
        sb[at..at + 8].copy_from_slice(&2_400_000_000_000_000_000u64.to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        format!(
            "corrupt sys_chunk_array of superblock on {} at byte 0: invalid length \
             2400000000000000000: chunk length too large: the kernel's limit is 2^32 - 1 stripes \
             of 64 KiB (281474976645120 bytes)",
            p.display()
        )
    );
    kernel_refuses_mount(
        "huge_system_chunk_is_checked",
        &p,
        "chunk length too large: have 2400000000000000000",
    );
}

/// The message of a check across items (block groups and dev extents
/// against the chunks) that item `f` fails: no copy is at fault, so no
/// count of copies.
fn cross_error(f: &Found, what: &str) -> String {
    format!(
        "corrupt item {} key {} in leaf at logical {} (tree {}): {what}",
        f.slot, f.key, f.leaf, f.tree
    )
}

const EXTENT_TREE: TreeId = TreeId(ondisk::BTRFS_EXTENT_TREE_OBJECTID);
const DEV_TREE: TreeId = TreeId(ondisk::BTRFS_DEV_TREE_OBJECTID);

#[test]
fn inode_ref_name_len_is_checked() {
    let Some(img) = image_001() else { return };
    // The top level's name in the root tree, (5 INODE_REF 6) "default",
    // as in btrfs-progs' fuzz image bko-97191.
    let f = find_in(&img, TreeId::ROOT, |k, _| {
        k.item_type == ondisk::BTRFS_INODE_REF_KEY && k.objectid == 5
    });
    let tmp = tempfile::tempdir().unwrap();
    // name_len after the 8-byte index.
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at + 8..at + 10].copy_from_slice(&0u16.to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        item_error(&f, "invalid inode ref name_len 0: must be 1 to 255")
    );
    kernel_refuses_mount(
        "inode_ref_name_len_is_checked",
        &p,
        "invalid inode ref name length, has 0 expect [1, 255]",
    );
}

#[test]
fn block_group_used_beyond_its_size_is_checked() {
    let Some(img) = image_001() else { return };
    let f = find_in(&img, EXTENT_TREE, |k, _| {
        k.item_type == ondisk::BTRFS_BLOCK_GROUP_ITEM_KEY
    });
    let used = f.key.offset + 4096;
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at..at + 8].copy_from_slice(&used.to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        item_error(
            &f,
            &format!(
                "invalid block group used {used}: more than the block group's size (key offset)"
            )
        )
    );
    kernel_refuses_mount(
        "block_group_used_beyond_its_size_is_checked",
        &p,
        &format!(
            "invalid block group used, have {used} expect [0, {})",
            f.key.offset
        ),
    );
}

#[test]
fn block_group_type_must_match_its_chunk() {
    let Some(img) = image_001() else { return };
    // A data block group (flags at 16) made a metadata one: a valid item,
    // but its chunk holds data.
    let f = find_in(&img, EXTENT_TREE, |k, d| {
        k.item_type == ondisk::BTRFS_BLOCK_GROUP_ITEM_KEY
            && u64_at(d, 16) == ondisk::BTRFS_BLOCK_GROUP_DATA
    });
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at + 16..at + 24].copy_from_slice(&ondisk::BTRFS_BLOCK_GROUP_METADATA.to_le_bytes())
    });
    let (start, len) = (f.key.objectid, f.key.offset);
    assert_eq!(
        our_open_error(&p),
        cross_error(
            &f,
            &format!(
                "block group type does not match its chunk: block group {start} length {len} \
                 type 0x4, chunk type 0x1"
            )
        )
    );
    kernel_refuses_mount(
        "block_group_type_must_match_its_chunk",
        &p,
        &format!("block group {start} len {len} type flags 0x4 mismatch with chunk type flags 0x1"),
    );
}

#[test]
fn extent_item_generation_newer_than_the_superblock_is_checked() {
    let Some(img) = image_001() else { return };
    let Some(generation) = super_generation(&img) else {
        return;
    };
    // The extent tree's one leaf holds the block groups, which the kernel
    // reads at mount, so it checks every extent item of it.
    let f = find_in(&img, EXTENT_TREE, |k, _| {
        k.item_type == ondisk::BTRFS_EXTENT_ITEM_KEY
            || k.item_type == ondisk::BTRFS_METADATA_ITEM_KEY
    });
    let tmp = tempfile::tempdir().unwrap();
    // generation after the 8-byte refs.
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at + 8..at + 16].copy_from_slice(&(generation + 2).to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        item_error(
            &f,
            &format!(
                "extent generation {} is newer than the filesystem: the superblock's generation \
                 is {generation}, so at most {} is possible",
                generation + 2,
                generation + 1
            )
        )
    );
    kernel_refuses_mount(
        "extent_item_generation_newer_than_the_superblock_is_checked",
        &p,
        &format!(
            "invalid generation, have {} expect (0, {}]",
            generation + 2,
            generation + 1
        ),
    );
}

#[test]
fn dev_extent_chunk_tree_is_checked() {
    let Some(img) = image_001() else { return };
    let f = find_in(&img, DEV_TREE, |k, _| {
        k.item_type == ondisk::BTRFS_DEV_EXTENT_KEY
    });
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at..at + 8].copy_from_slice(&4u64.to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        item_error(
            &f,
            "invalid dev extent chunk_tree 4: must be 3 (the chunk tree)"
        )
    );
    kernel_refuses_mount(
        "dev_extent_chunk_tree_is_checked",
        &p,
        "invalid dev extent chunk tree id, has 4 expect 3",
    );
}

#[test]
fn dev_extent_must_be_a_stripe_of_its_chunk() {
    let Some(img) = image_001() else { return };
    // chunk_offset at 16, length at 24. A dev extent of its own chunk, and
    // a later one of another chunk with stripes as long: the first is
    // pointed at the second's chunk, where it is no stripe (as in
    // btrfs-progs' fuzz image bko-200403).
    let dev_extent = |k: &Key| k.item_type == ondisk::BTRFS_DEV_EXTENT_KEY;
    let a = find_in(&img, DEV_TREE, |k, d| {
        dev_extent(k) && u64_at(d, 16) == k.offset
    });
    let (a_chunk, a_len) = (u64_at(&a.data, 16), u64_at(&a.data, 24));
    let b = find_in(&img, DEV_TREE, |k, d| {
        dev_extent(k)
            && k.offset > a.key.offset
            && u64_at(d, 24) == a_len
            && u64_at(d, 16) != a_chunk
    });
    let other = u64_at(&b.data, 16);
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &a, |b, at| {
        b[at + 16..at + 24].copy_from_slice(&other.to_le_bytes())
    });
    let physical = a.key.offset;
    assert_eq!(
        our_open_error(&p),
        cross_error(
            &a,
            &format!(
                "dev extent without a chunk stripe: devid 1 physical {physical} is not a stripe \
                 of chunk {other}"
            )
        )
    );
    kernel_refuses_mount(
        "dev_extent_must_be_a_stripe_of_its_chunk",
        &p,
        &format!("dev extent physical offset {physical} devid 1 has no corresponding chunk"),
    );
}

#[test]
fn top_level_root_directory_is_checked() {
    let Some(img) = image_001() else { return };
    let Some(generation) = super_generation(&img) else {
        return;
    };
    // Inode 256 of tree 5, which the kernel reads at mount (as in
    // btrfs-progs' fuzz image bko-161811).
    let f = find_in(&img, TreeId::FS, |k, _| {
        k.item_type == ondisk::BTRFS_INODE_ITEM_KEY && k.objectid == 256
    });
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, at| {
        b[at..at + 8].copy_from_slice(&(generation + 2).to_le_bytes())
    });
    assert_eq!(
        our_open_error(&p),
        item_error(
            &f,
            &format!(
                "inode generation {} is newer than the filesystem: the superblock's generation \
                 is {generation}, so at most {} is possible",
                generation + 2,
                generation + 1
            )
        )
    );
    kernel_refuses_mount(
        "top_level_root_directory_is_checked",
        &p,
        &format!(
            "invalid inode generation: has {} expect (0, {}]",
            generation + 2,
            generation + 1
        ),
    );
}

#[test]
fn extent_tree_root_level_is_checked() {
    let Some(img) = image_001() else { return };
    // The extent tree's root item says its root (one leaf) is a node of
    // level 1, as btrfs-progs' fuzz image bko-155551 says of a node a
    // leaf. Layout: the 160-byte inode, then generation, root_dirid,
    // bytenr (at 176), byte_limit, bytes_used, last_snapshot, flags, refs
    // (u32), drop_progress (17 bytes), drop_level, level (at 238).
    let f = find_in(&img, TreeId::ROOT, |k, _| {
        k.item_type == ondisk::BTRFS_ROOT_ITEM_KEY && k.objectid == 2
    });
    assert_eq!(f.data[238], 0, "001's extent tree is one leaf");
    let bytenr = u64_at(&f.data, 176);
    let tmp = tempfile::tempdir().unwrap();
    let p = patched(&img, tmp.path(), &f, |b, at| b[at + 238] = 1);
    assert_eq!(
        our_open_error(&p),
        format!(
            "corrupt leaf at logical {bytenr} (tree 2): level mismatch: expected 1, found 0 (the \
             same in all 2 copies)"
        )
    );
    kernel_refuses_mount(
        "extent_tree_root_level_is_checked",
        &p,
        &format!("level verify failed on logical {bytenr} mirror 1 wanted 1 found 0"),
    );
}
