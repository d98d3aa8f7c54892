use super::*;

#[test]
fn numbers_round_trip_and_versions_match_markers() {
    for (i, k) in CommandKind::ALL.iter().enumerate() {
        assert_eq!(usize::from(k.number()), i + 1);
        assert_eq!(CommandKind::from_u16(k.number()), Some(*k));
        assert!(k.number() <= CommandKind::max_for_version(k.since_version()));
        if k.since_version() > 1 {
            assert!(k.number() > CommandKind::max_for_version(k.since_version() - 1));
        }
        for a in k.required_attrs() {
            assert!(k.kernel_attrs().contains(a), "{k} {a}");
        }
    }
    assert_eq!(CommandKind::from_u16(0), None);
    assert_eq!(CommandKind::from_u16(27), None);
    assert_eq!(CommandName(99).to_string(), "cmd 99");
    assert_eq!(CommandName(15).to_string(), "WRITE");
}

#[test]
fn timespec_bytes() {
    let t = Timespec {
        sec: 1_704_164_645,
        nsec: 123_456_789,
    };
    let b = t.to_bytes();
    assert_eq!(
        b,
        [0x25, 0x7d, 0x93, 0x65, 0, 0, 0, 0, 0x15, 0xcd, 0x5b, 0x07]
    );
    assert_eq!(Timespec::from_bytes(b), t);
    assert_eq!(
        Timespec {
            sec: u64::MAX,
            nsec: 0
        }
        .sec_signed(),
        -1
    );
}
