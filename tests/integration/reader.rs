//! The device reader against the kernel-made fixtures: superblocks, chunk
//! maps and tree walks compared with what btrfs-progs prints for the same
//! images (`btrfs inspect-internal dump-super` / `dump-tree`, run here), plus
//! mirror fallback, missing and foreign devices.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use btrsend::Error;
use btrsend::device::FileDevice;
use btrsend::device::readahead::ReadOptions;
use btrsend::error::DeviceSetError;
use btrsend::fs::Filesystem;
use btrsend::superblock::read_superblock;
use btrsend::tree::key::Key;
use btrsend::tree::walk::{TreeRoot, for_each_in_range};
use btrsend::types::{DevId, TreeId};
use btrsend::volume::Volume;

/// A fixture directory with device images.
pub struct Fixture {
    /// `tests/fixtures/NNN-name`.
    pub dir: PathBuf,
    /// Unpacked device images, in `meta.txt` order.
    pub devices: Vec<PathBuf>,
}

impl Fixture {
    pub fn name(&self) -> String {
        self.dir.file_name().unwrap().to_string_lossy().into_owned()
    }
}

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Unpack `src` (zstd) to the test scratch dir once; reuse across runs when
/// the size matches `meta.txt`.
fn unpack(src: &Path, name: &str, size: Option<u64>) -> PathBuf {
    static LOCK: OnceLock<Mutex<HashMap<PathBuf, ()>>> = OnceLock::new();
    let dest_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reader-fixtures");
    fs::create_dir_all(&dest_dir).unwrap();
    let dest = dest_dir.join(name);
    let mut done = LOCK.get_or_init(Default::default).lock().unwrap();
    let fresh = fs::metadata(&dest).is_ok_and(|m| {
        size.is_none_or(|s| s == m.len())
            && m.modified().ok() >= fs::metadata(src).and_then(|s| s.modified()).ok()
    });
    if !done.contains_key(&dest) && !fresh {
        let tmp = dest.with_extension("part");
        let mut out = fs::File::create(&tmp).unwrap();
        let mut dec = zstd::stream::read::Decoder::new(fs::File::open(src).unwrap()).unwrap();
        dec.window_log_max(31).unwrap();
        std::io::copy(&mut dec, &mut out).unwrap();
        fs::rename(&tmp, &dest).unwrap();
    }
    done.insert(dest.clone(), ());
    dest
}

/// Every fixture with device images, unpacked. Says loudly when there are
/// none.
pub fn fixtures() -> Vec<Fixture> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(fixtures_root())
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("meta.txt").is_file())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let meta = fs::read_to_string(dir.join("meta.txt")).unwrap();
        let size = meta
            .lines()
            .find_map(|l| l.strip_prefix("size "))
            .and_then(|s| s.trim().parse().ok());
        let names: Vec<&str> = meta
            .lines()
            .filter_map(|l| l.strip_prefix("device "))
            .map(str::trim)
            .collect();
        if names.is_empty() {
            continue;
        }
        let fname = dir.file_name().unwrap().to_string_lossy().into_owned();
        let devices = names
            .iter()
            .map(|n| {
                unpack(
                    &dir.join(n),
                    &format!("{fname}-{}", n.trim_end_matches(".zst")),
                    size,
                )
            })
            .collect();
        out.push(Fixture { dir, devices });
    }
    if out.is_empty() {
        eprintln!("=== reader tests: no fixture images under tests/fixtures: nothing compared ===");
    }
    out
}

/// Run btrfs-progs; `None` (said loudly, a failure in CI) when it is missing.
pub fn progs(args: &[&str], devices: &[PathBuf]) -> Option<String> {
    let out = match Command::new("btrfs").args(args).args(devices).output() {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "btrfs-progs needed in CI: {e}"
            );
            eprintln!("=== SKIPPED: btrfs-progs not available: {e} ===");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "btrfs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn super_field<'a>(dump: &'a str, name: &str) -> &'a str {
    dump.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(char::is_whitespace)?;
            (k == name).then(|| v.trim())
        })
        .unwrap_or_else(|| panic!("dump-super has no {name}"))
}

/// `3 (blake2)` -> our name for the algorithm.
fn progs_csum_name(field: &str) -> &'static str {
    match field.split(['(', ')']).nth(1).unwrap() {
        "crc32c" => "crc32c",
        "xxhash64" | "xxhash" => "xxhash64",
        "sha256" => "sha256",
        "blake2" | "blake2b" => "blake2b",
        other => panic!("unknown csum type {other}"),
    }
}

fn num(s: &str) -> u64 {
    let s = s.split_whitespace().next().unwrap();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

#[test]
fn superblocks_match_dump_super() {
    for fx in fixtures() {
        for dev in &fx.devices {
            let Some(dump) = progs(
                &["inspect-internal", "dump-super"],
                std::slice::from_ref(dev),
            ) else {
                return;
            };
            let (sb, notice) = read_superblock(&FileDevice::open(dev).unwrap()).unwrap();
            let ctx = format!("{} {}", fx.name(), dev.display());
            assert!(notice.is_none(), "{ctx}");
            assert_eq!(
                sb.csum_type.name(),
                progs_csum_name(super_field(&dump, "csum_type")),
                "{ctx}"
            );
            assert_eq!(sb.fsid.to_string(), super_field(&dump, "fsid"), "{ctx}");
            assert_eq!(
                sb.metadata_uuid.to_string(),
                super_field(&dump, "metadata_uuid"),
                "{ctx}"
            );
            assert_eq!(
                sb.generation.get(),
                num(super_field(&dump, "generation")),
                "{ctx}"
            );
            assert_eq!(sb.root.get(), num(super_field(&dump, "root")), "{ctx}");
            assert_eq!(
                sb.chunk_root.get(),
                num(super_field(&dump, "chunk_root")),
                "{ctx}"
            );
            assert_eq!(
                u64::from(sb.root_level),
                num(super_field(&dump, "root_level")),
                "{ctx}"
            );
            assert_eq!(
                u64::from(sb.nodesize),
                num(super_field(&dump, "nodesize")),
                "{ctx}"
            );
            assert_eq!(
                u64::from(sb.sectorsize),
                num(super_field(&dump, "sectorsize")),
                "{ctx}"
            );
            assert_eq!(
                sb.num_devices,
                num(super_field(&dump, "num_devices")),
                "{ctx}"
            );
            assert_eq!(
                sb.incompat_flags,
                num(super_field(&dump, "incompat_flags")),
                "{ctx}"
            );
            assert_eq!(
                sb.compat_ro_flags,
                num(super_field(&dump, "compat_ro_flags")),
                "{ctx}"
            );
            assert_eq!(
                sb.dev_item.devid.get(),
                num(super_field(&dump, "dev_item.devid")),
                "{ctx}"
            );
            assert_eq!(
                sb.dev_item.uuid.to_string(),
                super_field(&dump, "dev_item.uuid"),
                "{ctx}"
            );
            assert!(sb.check_supported().unwrap().is_empty(), "{ctx}");
        }
    }
}

/// `(logical, length, type, [(devid, offset)])`.
type ChunkRow = (u64, u64, String, Vec<(u64, u64)>);

/// `(logical, length, type, [(devid, offset)])` of every CHUNK_ITEM that
/// `dump-tree -t chunk` prints.
fn progs_chunks(dump: &str) -> Vec<ChunkRow> {
    let mut out: Vec<ChunkRow> = Vec::new();
    for line in dump.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["item", _, "key", "(FIRST_CHUNK_TREE", "CHUNK_ITEM", off, ..] => {
                out.push((num(off.trim_end_matches(')')), 0, String::new(), Vec::new()));
            }
            ["length", len, "owner", _, "stripe_len", _, "type", ty] => {
                let last = out.last_mut().unwrap();
                last.1 = num(len);
                last.2 = (*ty).to_owned();
            }
            ["stripe", _, "devid", devid, "offset", off] => {
                out.last_mut().unwrap().3.push((num(devid), num(off)));
            }
            _ => {}
        }
    }
    out
}

#[test]
fn chunk_maps_match_dump_tree() {
    for fx in fixtures() {
        let Some(dump) = progs(
            &["inspect-internal", "dump-tree", "-t", "chunk"],
            &fx.devices,
        ) else {
            return;
        };
        let expected = progs_chunks(&dump);
        let vol = Volume::open(&fx.devices).unwrap();
        assert!(
            vol.notices().is_empty(),
            "{}: {:?}",
            fx.name(),
            vol.notices()
        );
        let ours: Vec<ChunkRow> = vol
            .chunk_map()
            .chunks()
            .iter()
            .map(|c| {
                let mut ty = Vec::new();
                for (bit, name) in [(1, "DATA"), (2, "SYSTEM"), (4, "METADATA")] {
                    if c.flags & bit != 0 {
                        ty.push(name);
                    }
                }
                let profile = match c.profile.name() {
                    "DUP" | "single" => c.profile.name().to_owned(),
                    other => other.to_owned(),
                };
                (
                    c.logical.get(),
                    c.length,
                    format!("{}|{profile}", ty.join("|")),
                    c.stripes
                        .iter()
                        .map(|s| (s.devid.get(), s.offset.get()))
                        .collect(),
                )
            })
            .collect();
        assert!(!ours.is_empty());
        assert_eq!(ours, expected, "{}", fx.name());
        assert_eq!(vol.devices().len(), fx.devices.len(), "{}", fx.name());
    }
}

/// `(leaf bytenr, slot, objectid if numeric, item size)`.
type ItemRow = (u64, u32, Option<u64>, u32);

/// `(leaf bytenr, slot, objectid if numeric, item size)` of every item in
/// the order `dump-tree -t ID` prints them.
fn progs_items(dump: &str) -> Vec<ItemRow> {
    let mut out = Vec::new();
    let mut leaf = 0;
    for line in dump.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["leaf", bytenr, "items", ..] => leaf = num(bytenr),
            [
                "item",
                slot,
                "key",
                objectid,
                _,
                _,
                "itemoff",
                _,
                "itemsize",
                size,
            ] => {
                let objectid = objectid.trim_start_matches('(').parse().ok();
                out.push((leaf, slot.parse().unwrap(), objectid, size.parse().unwrap()));
            }
            _ => {}
        }
    }
    out
}

fn our_items(fs: &Filesystem, root: TreeRoot) -> Vec<ItemRow> {
    let mut out = Vec::new();
    for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
        out.push((
            item.leaf.get(),
            item.slot,
            Some(item.key.objectid),
            u32::try_from(item.data.len()).unwrap(),
        ));
        Ok(())
    })
    .unwrap();
    out
}

fn same_items(ours: &[ItemRow], progs: &[ItemRow], ctx: &str) {
    assert_eq!(ours.len(), progs.len(), "{ctx}: item count");
    for (a, b) in ours.iter().zip(progs) {
        assert_eq!((a.0, a.1, a.3), (b.0, b.1, b.3), "{ctx}");
        if b.2.is_some() {
            assert_eq!(a.2, b.2, "{ctx}");
        }
    }
}

#[test]
fn tree_walks_match_dump_tree() {
    for fx in fixtures() {
        let fs = Filesystem::open(&fx.devices).unwrap();
        let mut trees = vec![
            (TreeId::ROOT, fs.volume().root_tree()),
            (TreeId::FS, fs.tree_root(TreeId::FS).unwrap()),
        ];
        for s in btrsend::fs::subvol::list_subvolumes(&fs).unwrap() {
            trees.push((s.id(), s.root.tree_root()));
        }
        for (id, root) in trees {
            let Some(dump) = progs(
                &["inspect-internal", "dump-tree", "-t", &id.to_string()],
                &fx.devices,
            ) else {
                return;
            };
            let ctx = format!("{} tree {id}", fx.name());
            same_items(&our_items(&fs, root), &progs_items(&dump), &ctx);
        }
    }
}

#[test]
fn cursor_search_lands_on_every_key() {
    // Seek to each key of a multi-level tree (4 KiB nodes) and check the
    // cursor lands on it, and that seeking just past it lands on the next.
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("002")) else {
        return;
    };
    let fs = Filesystem::open(&fx.devices).unwrap();
    let mut roots = vec![fs.tree_root(TreeId::FS).unwrap()];
    roots.extend(
        btrsend::fs::subvol::list_subvolumes(&fs)
            .unwrap()
            .iter()
            .map(|s| s.root.tree_root()),
    );
    let root = roots.into_iter().max_by_key(|r| r.level).unwrap();
    assert!(
        root.level >= 1,
        "002 should have a multi-level subvolume tree"
    );
    let mut keys = Vec::new();
    for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
        keys.push(item.key);
        Ok(())
    })
    .unwrap();
    let mut cursor = btrsend::tree::walk::Cursor::new(fs.volume(), root);
    for (i, key) in keys.iter().enumerate().step_by(7) {
        assert_eq!(cursor.find(key).unwrap().map(|it| it.key), Some(*key));
        if key.offset < u64::MAX {
            let next = Key::new(key.objectid, key.item_type, key.offset + 1);
            cursor.seek(&next).unwrap();
            assert_eq!(cursor.current().map(|it| it.key), keys.get(i + 1).copied());
        }
    }
    // A range in the middle: exactly the keys in it.
    let (lo, hi) = (keys[keys.len() / 3], keys[keys.len() / 2]);
    let mut got = Vec::new();
    for_each_in_range(fs.volume(), root, &lo, &hi, |item| {
        got.push(item.key);
        Ok(())
    })
    .unwrap();
    assert_eq!(got, keys[keys.len() / 3..=keys.len() / 2]);
}

fn scratch_copy(src: &Path, dir: &Path) -> PathBuf {
    let dest = dir.join(src.file_name().unwrap());
    fs::copy(src, &dest).unwrap();
    dest
}

#[test]
fn missing_mirror_device_is_tolerated() {
    for fx in fixtures() {
        let name = fx.name();
        if !(name.contains("raid1") || name.contains("raid10")) {
            continue;
        }
        let all = Filesystem::open(&fx.devices).unwrap();
        let expected = btrsend::fs::subvol::list_subvolumes(&all).unwrap();
        // Drop the last device: every chunk still has a copy.
        let some = &fx.devices[..fx.devices.len() - 1];
        // Refused unless degraded, as the kernel refuses to mount it
        // without -o degraded.
        let refused = Filesystem::open(some).unwrap_err().to_string();
        assert!(
            refused.starts_with("missing device: devid ") && refused.contains("--degraded"),
            "{name}: {refused}"
        );
        let fs = Filesystem::open_with(some, &ReadOptions::default().with_degraded(true)).unwrap();
        let missing = fs.volume().devices().last().unwrap().clone();
        assert_eq!(
            fs.volume()
                .notices()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [format!(
                "missing device: devid {} uuid {} (reading from the remaining copies)",
                missing.devid, missing.uuid
            )],
            "{name}"
        );
        assert_eq!(
            btrsend::fs::subvol::list_subvolumes(&fs).unwrap(),
            expected,
            "{name}"
        );
    }
}

#[test]
fn missing_raid5_device_is_named() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().contains("raid5")) else {
        return;
    };
    // Without parity rebuild, a RAID5 filesystem missing a device can only
    // be read where no needed strip is on it: either it works, or the error
    // names the device.
    let degraded = ReadOptions::default().with_degraded(true);
    let vol = Volume::open_with(&fx.devices[1..], &degraded).and_then(|v| {
        btrsend::fs::subvol::list_subvolumes(&Filesystem::from_volume(v)).map(|_| ())
    });
    match vol {
        Ok(()) => {}
        Err(Error::MissingDevice { devid, uuid, .. }) => {
            assert_eq!(devid, DevId(1));
            let (sb, _) = read_superblock(&FileDevice::open(&fx.devices[0]).unwrap()).unwrap();
            assert_eq!(uuid, sb.dev_item.uuid);
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn foreign_and_duplicate_devices_are_refused() {
    let fxs = fixtures();
    let multi: Vec<&Fixture> = fxs.iter().filter(|f| f.devices.len() > 1).collect();
    if multi.len() < 2 {
        return;
    }
    let e = Volume::open(&[&multi[0].devices[0], &multi[1].devices[0]]).unwrap_err();
    assert!(
        matches!(e, Error::DeviceSet(DeviceSetError::ForeignDevice { .. })),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(" belongs to filesystem ") && msg.contains(", not "),
        "{msg}"
    );
    let e = Volume::open(&[&multi[0].devices[0], &multi[0].devices[0]]).unwrap_err();
    assert!(e.to_string().contains("both claim devid 1"), "{e}");
}

#[test]
fn bad_primary_superblock_falls_back_to_mirror() {
    let Some(fx) = fixtures().into_iter().find(|f| {
        f.devices.len() == 1
            && fs::metadata(&f.devices[0]).is_ok_and(|m| m.len() >= (64 << 20) + 4096)
    }) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = scratch_copy(&fx.devices[0], tmp.path());
    let mut bytes = fs::read(&img).unwrap();
    bytes[65536 + 0x100] ^= 0xff;
    fs::write(&img, &bytes).unwrap();
    let fs = Filesystem::open(&[&img]).unwrap();
    let notice = fs.volume().notices()[0].to_string();
    assert!(notice.starts_with("primary superblock on "), "{notice}");
    assert!(
        notice.ends_with("; using the mirror at physical 67108864"),
        "{notice}"
    );
    btrsend::fs::subvol::list_subvolumes(&fs).unwrap();
}

#[test]
fn corrupt_tree_block_copy_falls_back_then_fails_by_name() {
    let Some(fx) = fixtures().into_iter().find(|f| f.name().starts_with("001")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = scratch_copy(&fx.devices[0], tmp.path());
    let vol = Volume::open(&[&img]).unwrap();
    let root = vol.root_tree().logical;
    let copies: Vec<u64> = vol
        .chunk_map()
        .map(root, 1)
        .unwrap()
        .copies()
        .map(|c| c.physical.get())
        .collect();
    assert_eq!(copies.len(), 2, "001 has DUP metadata");
    drop(vol);
    let mut bytes = fs::read(&img).unwrap();
    let first = usize::try_from(copies[0]).unwrap();
    bytes[first + 200] ^= 0xff;
    fs::write(&img, &bytes).unwrap();
    // The second copy serves the read.
    let fs = Filesystem::open(&[&img]).unwrap();
    btrsend::fs::subvol::list_subvolumes(&fs).unwrap();
    drop(fs);
    // Copy 2 resealed with another generation: both failures are named.
    let second = usize::try_from(copies[1]).unwrap();
    let generation = u64::from_le_bytes(bytes[second + 80..second + 88].try_into().unwrap());
    bytes[second + 80..second + 88].copy_from_slice(&(generation + 7).to_le_bytes());
    let c = crc32c::crc32c(&bytes[second + 32..second + 16384]);
    bytes[second..second + 4].copy_from_slice(&c.to_le_bytes());
    fs::write(&img, &bytes).unwrap();
    // As dump-tree prints checksums: the stored bytes in order.
    let hex = |b: &[u8]| {
        let digits: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!("0x{digits}")
    };
    let stored = hex(&bytes[first..first + 4]);
    let computed = hex(&crc32c::crc32c(&bytes[first + 32..first + 16384]).to_le_bytes());
    let e = Filesystem::open(&[&img])
        .and_then(|fs| btrsend::fs::subvol::list_subvolumes(&fs))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "all 2 copies of tree block at logical {root} (tree 1) are bad: copy 1: crc32c \
             checksum mismatch: stored {stored}, computed {computed}; copy 2: parent \
             transid verify failed: wanted {generation} found {}",
            generation + 7
        )
    );
}
