//! Assembling kernel-made images (the fixtures' `meta.txt` says what
//! mkfs made: devices, sizes, profiles).
#![allow(clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use super::*;

fn unpack(dir: &Path, fixture: &str, dev: &str) -> PathBuf {
    let zst = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture)
        .join(format!("{dev}.img.zst"));
    let img = dir.join(format!("{fixture}-{dev}.img"));
    let mut dec = zstd::stream::read::Decoder::new(std::fs::File::open(zst).unwrap()).unwrap();
    std::io::copy(&mut dec, &mut std::fs::File::create(&img).unwrap()).unwrap();
    img
}

#[test]
fn a_dup_filesystem_has_two_copies_of_its_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let v = Volume::open(&[unpack(dir.path(), "001-basic", "dev1")]).unwrap();
    let sb = v.superblock();
    assert_eq!((sb.nodesize, sb.sectorsize), (16384, 4096));
    assert_eq!(v.devices().len(), 1);
    assert_eq!(v.devices()[0].devid, DevId(1));
    // metadata=dup: two copies of the root tree's block, identical.
    let root = v.root_tree();
    assert_eq!(v.num_copies(root.logical).unwrap(), 2);
    let mut a = vec![0; 16384];
    let mut b = vec![1; 16384];
    v.read_copy(root.logical, &mut a, 0).unwrap();
    v.read_copy(root.logical, &mut b, 1).unwrap();
    assert_eq!(a, b);
    // And the validated block is that block.
    let block = v.read_block(&root.expect()).unwrap();
    assert_eq!(block.node().bytes(), &a[..]);
    assert_eq!(block.node().bytenr(), root.logical);
    // An address no chunk maps is an error, not a panic.
    assert!(v.num_copies(Logical(u64::MAX - 4096)).is_err());
    let mut buf = [0u8; 16];
    assert!(v.read_logical(Logical(u64::MAX - 4096), &mut buf).is_err());
}

#[test]
fn raid1_reads_from_either_device_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d1 = unpack(dir.path(), "009-raid1", "dev1");
    let d2 = unpack(dir.path(), "009-raid1", "dev2");
    let both = Volume::open(&[&d1, &d2]).unwrap();
    let ids: Vec<DevId> = both.devices().iter().map(|d| d.devid).collect();
    assert_eq!(ids, [DevId(1), DevId(2)]);
    let root = both.root_tree();
    assert_eq!(both.num_copies(root.logical).unwrap(), 2);
    let want = both.read_block(&root.expect()).unwrap();
    // One device missing: refused unless degraded, naming the other
    // (the kernel will not mount it without -o degraded either);
    // degraded, every block still has a copy on the present one.
    let records = both.devices().to_vec();
    for (alone, other) in [(&d1, &records[1]), (&d2, &records[0])] {
        let e = Volume::open(&[alone]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "missing device: devid {} uuid {} was not given; give every device of the \
                 filesystem, or read it degraded from the remaining copies with --degraded \
                 (as mounting needs -o degraded)",
                other.devid, other.uuid
            )
        );
        let v = Volume::open_with(&[alone], &ReadOptions::default().with_degraded(true)).unwrap();
        assert_eq!(
            v.notices(),
            [Notice::MissingDevice {
                devid: other.devid,
                uuid: other.uuid
            }]
        );
        let got = v.read_block(&root.expect()).unwrap();
        assert_eq!(got.node().bytes(), want.node().bytes());
    }
    // The same device twice is not a filesystem of two devices.
    assert!(Volume::open(&[&d1, &d1]).is_err());
}
