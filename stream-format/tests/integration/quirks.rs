//! Corner cases of the btrfs-progs 6.2 dump format, checked against what progs
//! printed for hand-made streams (`tests/data/progs-quirks/README.md`).

use std::fs;
use std::path::Path;

use jiff::tz::TimeZone;
use stream_format::dump::{DumpOptions, dump};

use crate::common;

#[test]
fn dump_quirks_like_btrfs_progs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/progs-quirks");
    let cases = common::files_with_suffix(&dir, ".stream");
    assert!(cases.len() >= 14, "{}", cases.len());
    for case in &cases {
        let stream = fs::read(case).unwrap();
        let want = fs::read(case.with_extension("stdout")).unwrap();
        let rc: i32 = fs::read_to_string(case.with_extension("rc"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut out = Vec::new();
        let res = dump(
            stream.as_slice(),
            &mut out,
            &DumpOptions::with_time_zone(TimeZone::UTC),
        );
        let name = case.file_name().unwrap().to_string_lossy();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&want),
            "{name}"
        );
        assert_eq!(res.is_ok(), rc == 0, "{name}: {res:?}");
        if let Err(e) = res {
            assert!(e.to_string().contains("offset"), "{name}: {e}");
        }
    }
}
