//! The project's kernel-made fixtures: `tests/fixtures/NNN-name/meta.txt`
//! and the file names of the streams and manifests beside it (written by
//! `tests/fixtures/generate`, described in `tests/fixtures/README.md`).
//!
//! `meta.txt` has one `KEY VALUE…` per line. The keys read here:
//! `description`, `mkfs`, `mount`, `remount`, `features` (space-separated,
//! lowercase superblock flag names such as `no_holes`), `snapshot PATH`
//! (relative to the mount; one line each) and `pair PARENT CHILD`. Other
//! keys are kept in [`FixtureMeta::other`].

use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::{HarnessError, fixtures_dir, open_stream};

type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// A parent → child snapshot pair with incremental streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// The parent snapshot's path (as in `snapshot` lines).
    pub parent: String,
    /// The child snapshot's path.
    pub child: String,
}

/// One fixture directory and its `meta.txt`.
#[derive(Debug, Clone, Default)]
pub struct FixtureMeta {
    /// The directory.
    pub dir: PathBuf,
    /// `description`.
    pub description: String,
    /// `mkfs` (the mkfs.btrfs arguments used).
    pub mkfs: String,
    /// `mount` options, then each `remount` in order.
    pub mount: Vec<String>,
    /// `features` of the superblock.
    pub features: Vec<String>,
    /// `snapshot` paths in order.
    pub snapshots: Vec<String>,
    /// `pair` lines in order.
    pub pairs: Vec<Pair>,
    /// All other `KEY VALUE` lines.
    pub other: Vec<(String, String)>,
}

impl FixtureMeta {
    /// Read `dir/meta.txt`.
    ///
    /// # Errors
    ///
    /// Unreadable file or a malformed `snapshot`/`pair` line.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("meta.txt");
        let text = fs::read_to_string(&path).map_err(|source| HarnessError::Io {
            op: "read",
            path: path.clone(),
            source,
        })?;
        let mut meta = FixtureMeta {
            dir: dir.to_path_buf(),
            ..Default::default()
        };
        for (i, line) in text.lines().enumerate() {
            let bad = || HarnessError::Meta {
                path: path.clone(),
                line: i + 1,
                text: line.to_owned(),
            };
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "description" => meta.description = value.to_owned(),
                "mkfs" => meta.mkfs = value.trim().to_owned(),
                "mount" | "remount" => meta.mount.push(value.to_owned()),
                "features" => meta.features = value.split_whitespace().map(str::to_owned).collect(),
                "snapshot" if !value.is_empty() && !value.contains(' ') => {
                    meta.snapshots.push(value.to_owned());
                }
                "pair" => match value.split_whitespace().collect::<Vec<_>>()[..] {
                    [parent, child] => meta.pairs.push(Pair {
                        parent: parent.to_owned(),
                        child: child.to_owned(),
                    }),
                    _ => return Err(bad()),
                },
                "snapshot" => return Err(bad()),
                _ => meta.other.push((key.to_owned(), value.to_owned())),
            }
        }
        Ok(meta)
    }

    /// Every `tests/fixtures/*/meta.txt`, sorted by directory name.
    ///
    /// # Errors
    ///
    /// See [`load`](Self::load).
    pub fn all() -> Result<Vec<Self>> {
        let root = fixtures_dir();
        let mut dirs: Vec<PathBuf> = match fs::read_dir(&root) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("meta.txt").is_file())
                .collect(),
            Err(_) => Vec::new(),
        };
        dirs.sort();
        dirs.iter().map(|d| Self::load(d)).collect()
    }

    /// The directory's name, e.g. `001-basic`.
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Whether the superblock has the feature (e.g. `no_holes`).
    pub fn has_feature(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }

    /// The file-name stem of a snapshot: the last component of its path
    /// (also the name `btrfs receive` gives it).
    pub fn snap_name(snapshot: &str) -> &str {
        snapshot.rsplit('/').next().unwrap_or(snapshot)
    }

    /// `<snap>.full.<version>.stream.zst` (`version`: `v1` or `v2c`).
    pub fn full_stream(&self, snapshot: &str, version: &str) -> PathBuf {
        self.dir.join(format!(
            "{}.full.{version}.stream.zst",
            Self::snap_name(snapshot)
        ))
    }

    /// `<parent>--<child>.inc.<version>.stream.zst`.
    pub fn inc_stream(&self, pair: &Pair, version: &str) -> PathBuf {
        self.dir.join(format!(
            "{}--{}.inc.{version}.stream.zst",
            Self::snap_name(&pair.parent),
            Self::snap_name(&pair.child)
        ))
    }

    /// The stored manifest of a snapshot (`<snap>.manifest`, or `.manifest.zst`
    /// when large).
    ///
    /// # Errors
    ///
    /// Neither file is readable.
    pub fn manifest(&self, snapshot: &str) -> Result<String> {
        let plain = self
            .dir
            .join(format!("{}.manifest", Self::snap_name(snapshot)));
        let path = if plain.is_file() {
            plain
        } else {
            plain.with_extension("manifest.zst")
        };
        let mut text = String::new();
        open_stream(&path)?
            .read_to_string(&mut text)
            .map_err(|source| HarnessError::Io {
                op: "read",
                path,
                source,
            })?;
        Ok(text)
    }
}
