//! Shared CLI test helpers: the binary under test, fixture images, and locating
//! the kernel streams (the locating part, ~40 lines, stands again in
//! `stream-format/tests/integration/common.rs`: that crate cannot depend on the
//! core or the cli).
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

/// `(name, stream, dump)` for every `tests/fixtures/*/*.stream.zst` of the
/// repository that has a sibling `.dump` or `.dump.zst`.
pub fn repo_fixture_streams() -> Vec<(String, Vec<u8>, Vec<u8>)> {
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
            out.push((name, stream, dump));
        }
    }
    out
}

/// The `btrsend` binary under test, with `TZ=UTC` (the stored dumps were made
/// with `TZ=UTC btrfs receive --dump`).
pub fn btrsend() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_btrsend"));
    // No config file of the host's (/etc/btrsend/btrsend.toml) is read.
    c.env("TZ", "UTC")
        .env("BTRSEND_CONFIG", "/nonexistent/btrsend-test.toml")
        .env_remove("BTRSEND_REPOSITORY")
        .stdin(std::process::Stdio::null());
    c
}

/// The standard output of a command that must have succeeded (else a
/// panic with its exit status and standard error).
#[track_caller]
pub fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `script` with `bash -ec`; panic with its standard error unless it
/// succeeds; its standard output.
#[track_caller]
pub fn shell(script: &str) -> String {
    let out = std::process::Command::new("bash")
        .arg("-ec")
        .arg(script)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `btrfs subvolume show` says of `path` under `field`.
pub fn subvolume_show(path: &Path, field: &str) -> String {
    let out = std::process::Command::new("btrfs")
        .args(["subvolume", "show"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "btrfs subvolume show {}",
        path.display()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            (k.trim() == field).then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no {field} in btrfs subvolume show {}", path.display()))
}

/// The JSON lines of a `--json` run.
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// The repository's `tests/fixtures/<fixture>` directory.
pub fn fixture_dir(fixture: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(fixture)
}

/// Unpack `tests/fixtures/<fixture>/<name>.zst` (sparse) into `dir/<name>`.
pub fn unpack(dir: &Path, fixture: &str, name: &str) -> PathBuf {
    let dst = dir.join(name);
    let st = std::process::Command::new("zstd")
        .args(["-q", "-d", "-f", "--sparse", "-o"])
        .arg(&dst)
        .arg(fixture_dir(fixture).join(format!("{name}.zst")))
        .status()
        .expect("zstd is needed to unpack the fixture");
    assert!(st.success(), "zstd failed to unpack {fixture}/{name}.zst");
    dst
}

/// `btrsend dump -f STREAM`, which must succeed: its output.
pub fn dump(stream: &Path) -> String {
    let out = btrsend().args(["dump", "-f"]).arg(stream).output().unwrap();
    assert!(
        out.status.success(),
        "dump {}: {}",
        stream.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `btrsend send --device IMG ARGS -f STREAM SUBVOL`, which must succeed:
/// the dump of the stream it wrote.
pub fn send_dump(img: &Path, args: &[&str], stream: &Path, subvol: &str) -> String {
    let out = btrsend()
        .arg("send")
        .arg("--device")
        .arg(img)
        .args(args)
        .arg("-f")
        .arg(stream)
        .arg(subvol)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "send {args:?} {subvol}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dump(stream)
}

/// Run `cmd`, which must succeed (its stderr in the panic otherwise): its
/// output.
pub fn sh(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A read-only snapshot of subvolume `from` at `to`, by the kernel.
pub fn snapshot_ro(from: &Path, to: &Path) {
    sh(std::process::Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(from)
        .arg(to));
}

/// A command's stderr as text.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Write `len` bytes of random data to `path`, in pieces of 4 MiB of which
/// about 30 % compress.
pub fn write_random(path: &Path, len: usize, rng: &mut btrsend::testing::workload::Rng) {
    use std::io::Write;
    let mut f = fs::File::create(path).unwrap();
    let mut left = len;
    while left > 0 {
        let n = left.min(4 << 20);
        let compressible = rng.chance(30);
        f.write_all(&rng.bytes(n, compressible)).unwrap();
        left -= n;
    }
}

/// Unmounts on drop.
pub struct Mount(pub PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The first file of `tree` with checksums and an uncompressed regular
/// extent of at least two sectors: (ino, its file name, file offset,
/// logical).
pub fn data_extent(fs: &btrsend::fs::Filesystem, tree: u64) -> (u64, String, u64, u64) {
    use btrsend::fs::items::{Compression, ExtentData};
    let t = fs.fs_tree(btrsend::types::TreeId(tree)).unwrap();
    for g in t.inodes(btrsend::fs::WalkOptions::default()) {
        let g = g.unwrap();
        let Some(name) = g.names.first() else {
            continue;
        };
        for e in &g.extents {
            if let ExtentData::Regular(d) = &e.data
                && d.disk_bytenr.get() != 0
                && d.offset == 0
                && d.num_bytes >= 8192
                && e.compression == Compression::None
                && !g.inode.nodatasum()
            {
                let name = String::from_utf8_lossy(&name.name).into_owned();
                return (g.inode.ino, name, e.file_offset, d.disk_bytenr.get());
            }
        }
    }
    panic!("no uncompressed data extent in tree {tree}");
}

/// Overwrite the first 4 KiB at `logical` in its copy `copy` on its device.
pub fn corrupt(fs: &btrsend::fs::Filesystem, logical: u64, copy: usize) {
    use std::os::unix::fs::FileExt;
    let m = fs
        .volume()
        .chunk_map()
        .map(btrsend::types::Logical(logical), 4096)
        .unwrap();
    let loc = m.copies().nth(copy).expect("copy");
    let dev = fs
        .volume()
        .devices()
        .iter()
        .find(|d| d.devid == loc.devid)
        .and_then(|d| d.path.clone())
        .unwrap();
    let f = fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.write_all_at(&[0xa5; 4096], loc.physical.get()).unwrap();
}

/// A new age identity from the real `age-keygen`, in `dir/name`: the
/// file and its recipient.
pub fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let f = dir.join(name);
    let out = std::process::Command::new("age-keygen")
        .arg("-o")
        .arg(&f)
        .output()
        .expect("age-keygen (apt-get install age)");
    assert!(out.status.success(), "{}", stderr(&out));
    let r = std::process::Command::new("age-keygen")
        .arg("-y")
        .arg(&f)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", stderr(&r));
    (f, String::from_utf8(r.stdout).unwrap().trim().to_owned())
}

/// Every file below `dir` (a repository's objects), raw and as `zstd
/// -dc` makes it (empty when it is no zstd file).
pub fn objects(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.is_file() {
                let z = std::process::Command::new("zstd")
                    .arg("-dcq")
                    .arg(&p)
                    .output()
                    .unwrap();
                out.push((p.clone(), std::fs::read(&p).unwrap()));
                out.push((p.with_extension("zstd-dc"), z.stdout));
            }
        }
    }
    out.sort();
    out
}

/// None of `canaries` appears in any of `objects`.
pub fn assert_absent(objects: &[(PathBuf, Vec<u8>)], canaries: &[&str]) {
    for (p, bytes) in objects {
        for c in canaries {
            assert!(
                !bytes.windows(c.len()).any(|w| w == c.as_bytes()),
                "{c} appears in {}",
                p.display()
            );
        }
    }
}
