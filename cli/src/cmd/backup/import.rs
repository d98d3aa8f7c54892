//! `btrsend backup import`: existing send-stream files stored as entries.
//!
//! Parsing and the exit status only: what a file holds is checked by the
//! core, never here.

use std::path::PathBuf;

use anyhow::Context;
use btrsend::backup::ImportOptions;
use clap::Args;

use super::{LockArg, RepoArg};
use crate::exit::stored_or_failed;
use crate::progress::backup::BackupReporter;

/// Arguments of `btrsend backup import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// The entries' time, RFC 3339 (default: each file's modification
    /// time).
    #[arg(long = "time", value_name = "RFC3339")]
    time: Option<String>,
    /// The origin the entries belong to, for retention (default:
    /// `imported`).
    #[arg(long = "origin", value_name = "NAME")]
    origin: Option<String>,
    #[command(flatten)]
    lock: LockArg,
    /// Send-stream files, raw or zstd-compressed (e.g. from `btrfs send
    /// -f`); an incremental one needs its parent in the repository or
    /// among the files.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
}

/// Run `btrsend backup import`.
pub fn run(a: &ImportArgs) -> anyhow::Result<()> {
    let repo = a.repo.open()?;
    let time = a
        .time
        .as_deref()
        .map(|t| {
            t.parse::<jiff::Timestamp>()
                .with_context(|| format!("--time {t}: not an RFC 3339 time"))
        })
        .transpose()?;
    let mut opts = ImportOptions::default();
    opts.time = time;
    opts.origin = a.origin.clone();
    opts.wait_lock = a.lock.wait();
    let progress = BackupReporter::new(false, "reading the files");
    let report = repo.import(&a.files, &opts, &progress)?;
    stored_or_failed(
        report.stored.len() + report.skipped.len(),
        report.failed.len(),
        "files",
    )
}
