//! Test support shared by the integration tests of every crate (feature
//! `testing`): live btrfs scratch filesystems on loop devices that run the
//! stock `btrfs receive`, the skip-or-fail policy of root-only tests, and the
//! locations and `meta.txt` format of the fixtures.
//!
//! Not part of the tool: nothing in `btrsend` proper uses it.
//!
//! # Policy for live tests
//!
//! A live test needs root, a kernel with btrfs, loop devices and btrfs-progs.
//! When something is missing, [`require_live`] fails the test if the
//! environment variable `CI` is set (to anything but empty, `0` or `false`),
//! so CI can never pass by skipping; elsewhere it prints
//! `=== SKIPPED live test NAME: REASON ===` to stderr and the test returns.

pub mod compare;
mod fixtures;
mod live;
mod tmpfs;
pub mod workload;

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

pub use fixtures::{FixtureMeta, Pair};
pub use live::{LiveBtrfs, open_stream, run};
pub use tmpfs::Tmpfs;

/// A fresh temporary directory named `PREFIX…` in the system's temporary
/// directory (removed when dropped).
fn temp_dir(prefix: &str) -> Result<tempfile::TempDir, HarnessError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|source| HarnessError::Io {
            op: "mkdtemp",
            path: std::env::temp_dir(),
            source,
        })
}

/// A failure of the harness itself (not of the code under test).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// An external command could not be started.
    #[error("cannot run {cmd}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// An external command failed.
    #[error("{cmd} failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// A file operation failed.
    #[error("{op} failed on {path}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A `meta.txt` line could not be understood.
    #[error("bad meta.txt line {line} in {path}: {text}")]
    Meta {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// Taking a manifest failed.
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
}

/// Whether we run in CI (`CI` set to anything but empty, `0` or `false`),
/// where skipping a live test is a failure.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Skip (loudly) or, in CI, fail the calling test.
///
/// # Panics
///
/// In CI, always: that is the point.
pub fn skip_or_fail(test: &str, reason: &str) {
    if in_ci() {
        panic!("live test {test} cannot run in CI: {reason}");
    }
    eprintln!("=== SKIPPED live test {test}: {reason} ===");
}

/// What a live test lacks on this machine, or `None` if it can run.
pub fn live_unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (run as root or in CI)".to_owned());
    }
    for tool in ["btrfs", "mkfs.btrfs", "mount", "umount", "losetup"] {
        if find_in_path(tool).is_none() {
            return Some(format!("needs {tool} in PATH"));
        }
    }
    let listed = std::fs::read_to_string("/proc/filesystems").is_ok_and(|s| {
        s.lines()
            .any(|l| l.split_whitespace().any(|w| w == "btrfs"))
    });
    if !listed && !Path::new("/sys/fs/btrfs").exists() && !Path::new("/sys/module/btrfs").exists() {
        // The module may still load on first mount; try that before giving up.
        let loaded = std::process::Command::new("modprobe")
            .arg("btrfs")
            .status()
            .is_ok_and(|s| s.success());
        if !loaded {
            return Some("kernel has no btrfs".to_owned());
        }
    }
    None
}

/// Call first in every live test: `if !require_live("name") { return; }`.
///
/// # Panics
///
/// In CI when a prerequisite is missing.
pub fn require_live(test: &str) -> bool {
    match live_unavailable() {
        None => true,
        Some(reason) => {
            skip_or_fail(test, &reason);
            false
        }
    }
}

fn find_in_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/sbin".into(), "/usr/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// The repository root (this crate's manifest directory).
pub fn repo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The project's kernel-made fixtures: `tests/fixtures/` of the repository.
pub fn fixtures_dir() -> PathBuf {
    repo_dir().join("tests/fixtures")
}

/// The kernel-made research streams: `tests/fixtures/send-streams/`
/// (streams with their `btrfs receive --dump` output; see its README).
pub fn send_streams_dir() -> PathBuf {
    fixtures_dir().join("send-streams")
}
