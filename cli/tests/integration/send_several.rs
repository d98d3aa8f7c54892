//! `btrsend send A B …` (issue 15), judged against the kernel on a
//! loop-mounted btrfs: several subvolumes give one stream each,
//! concatenated, command for command what `btrfs send A B …` writes — with
//! neither `-p` nor `-c` (each full), with `-c` and no `-p` (each one sent
//! becomes a clone source of the next, whose parent is chosen among them),
//! and with `-p` (each against the parent). `-v` prints progs' default
//! "At subvol" lines; the default and `-q` print nothing. The streams are
//! split at their END commands and each piece dumped by `btrfs receive
//! --dump` (btrfs-progs dumps only the first stream of a file).

use std::path::Path;
use std::process::Command;

use btrsend::testing::{self, LiveBtrfs};

use crate::common::{btrsend, shell};

/// Split concatenated send streams after each END command.
fn split_streams(bytes: &[u8]) -> Vec<Vec<u8>> {
    const HEADER: usize = 17;
    const END: u16 = 21;
    let mut out = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        assert_eq!(
            &bytes[start..start + 13],
            b"btrfs-stream\0",
            "header at {start}"
        );
        let mut off = start + HEADER;
        loop {
            let len = u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
            let cmd = u16::from_le_bytes(bytes[off + 4..off + 6].try_into().unwrap());
            off += 10 + len;
            if cmd == END {
                break;
            }
        }
        out.push(bytes[start..off].to_vec());
        start = off;
    }
    out
}

/// `btrfs receive --dump` of each stream in `file`.
fn dumps(file: &Path) -> Vec<String> {
    let bytes = std::fs::read(file).unwrap();
    split_streams(&bytes)
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let piece = file.with_extension(format!("piece{i}"));
            std::fs::write(&piece, s).unwrap();
            let out = Command::new("btrfs")
                .args(["receive", "--dump", "-f"])
                .arg(&piece)
                .env("TZ", "UTC")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        })
        .collect()
}

#[test]
fn several_subvolumes_concatenate_like_btrfs_send() {
    if !testing::require_live("several_subvolumes_concatenate_like_btrfs_send") {
        return;
    }
    let fs = LiveBtrfs::with_options(1 << 30, &[], "").expect("live btrfs");
    let m = fs.path().to_str().unwrap().to_owned();
    shell(&format!(
        "cd {m} && btrfs -q subvolume create sv && head -c 300000 /dev/urandom > sv/a && \
         mkdir sv/d && echo one > sv/d/f && btrfs -q subvolume snapshot -r sv s1 && \
         cp --reflink=always sv/a sv/b && echo two >> sv/d/f && mv sv/d sv/e && \
         btrfs -q subvolume snapshot -r sv s2 && head -c 70000 /dev/urandom >> sv/b && \
         rm sv/a && ln sv/b sv/c && btrfs -q subvolume snapshot -r sv s3 && sync"
    ));
    let scratch = fs.scratch_dir();
    let snaps = [format!("{m}/s1"), format!("{m}/s2"), format!("{m}/s3")];
    let cases: [(&str, Vec<String>, &[String]); 4] = [
        ("full", vec![], &snaps[..]),
        ("chain", vec!["-c".into(), snaps[0].clone()], &snaps[..]),
        (
            "chain-no-first",
            vec!["-c".into(), snaps[0].clone()],
            &snaps[1..],
        ),
        ("parent", vec!["-p".into(), snaps[0].clone()], &snaps[1..]),
    ];
    for (name, opts, subvols) in cases {
        let kernel = scratch.join(format!("{name}.kernel"));
        let out = Command::new("btrfs")
            .arg("send")
            .args(&opts)
            .arg("-f")
            .arg(&kernel)
            .args(subvols)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let progs_stderr = String::from_utf8(out.stderr).unwrap();
        let ours = scratch.join(format!("{name}.ours"));
        let out = btrsend()
            .arg("send")
            .arg("-v")
            .args(&opts)
            .arg("-f")
            .arg(&ours)
            .args(subvols)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // -v: the lines btrfs send prints by default.
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            progs_stderr,
            "{name} -v"
        );
        let (want, got) = (dumps(&kernel), dumps(&ours));
        assert_eq!(
            want.len(),
            subvols.len(),
            "{name}: one stream per subvolume"
        );
        assert_eq!(got, want, "{name}");
        // Default and -q: nothing on stderr; the same stream.
        for quiet in [&[][..], &["-q"][..]] {
            let out = btrsend()
                .arg("send")
                .args(quiet)
                .args(&opts)
                .args(subvols)
                .output()
                .unwrap();
            assert!(out.status.success());
            assert!(
                out.stderr.is_empty(),
                "{name} {quiet:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                out.stdout,
                std::fs::read(&ours).unwrap(),
                "{name} {quiet:?}"
            );
        }
    }
}
