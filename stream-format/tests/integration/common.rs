//! Locating the fixtures (the same ~40 lines live in `cli/tests/common/mod.rs`).
//!
//! Kernel-made send streams live in the repository's
//! `tests/fixtures/send-streams/` and `tests/fixtures/NNN-name/` (`*.stream.zst` with a sibling
//! `*.dump` or `*.dump.zst` from `TZ=UTC btrfs receive --dump`).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

/// The kernel-made research streams: the repository's
/// `tests/fixtures/send-streams/`.
pub fn send_streams_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/send-streams")
}

/// Sorted files in `dir` whose names end with `suffix`.
pub fn files_with_suffix(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(suffix))
        })
        .collect();
    v.sort();
    v
}

/// A kernel stream with the `btrfs receive --dump` output (TZ=UTC) made from it.
pub struct KernelStream {
    pub name: String,
    pub stream: Vec<u8>,
    pub dump: Vec<u8>,
}

/// Every `tests/fixtures/*/*.stream.zst` of the repository that has a sibling
/// `.dump` or `.dump.zst`.
pub fn repo_fixture_streams() -> Vec<KernelStream> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let Ok(entries) = fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        for zst in files_with_suffix(&dir, ".stream.zst") {
            let file = zst.file_name().unwrap().to_str().unwrap();
            let base = file.strip_suffix(".stream.zst").unwrap();
            let plain = dir.join(format!("{base}.dump"));
            let packed = dir.join(format!("{base}.dump.zst"));
            let dump = if plain.is_file() {
                fs::read(&plain).unwrap()
            } else if packed.is_file() {
                zstd::decode_all(fs::File::open(&packed).unwrap()).unwrap()
            } else {
                continue;
            };
            let stream = zstd::decode_all(fs::File::open(&zst).unwrap()).unwrap();
            let name = format!("{}/{file}", dir.file_name().unwrap().to_string_lossy());
            out.push(KernelStream { name, stream, dump });
        }
    }
    out
}

/// The shared `*.stream` fixtures with their `.dump`.
pub fn shared_streams(dir: &Path) -> Vec<KernelStream> {
    files_with_suffix(dir, ".stream")
        .into_iter()
        .map(|p| {
            let dump = p.with_extension("dump");
            KernelStream {
                name: p.file_name().unwrap().to_string_lossy().into_owned(),
                stream: fs::read(&p).unwrap(),
                dump: fs::read(&dump).unwrap_or_else(|e| panic!("{}: {e}", dump.display())),
            }
        })
        .collect()
}
