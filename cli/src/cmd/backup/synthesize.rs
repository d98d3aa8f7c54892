//! `btrsend backup synthesize`: one stored incremental snapshot made a
//! full stream from the repository alone (core
//! `btrsend::backup::synthesize`).

use std::io::Write;

use clap::Args;
use serde_json::json;

use super::{LockArg, RepoArg};
use crate::exit::json_error;
use crate::progress::backup::BackupReporter;
use crate::text::printable;

/// Arguments of `btrsend backup synthesize`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = SYNTHESIZE_HELP)]
pub struct SynthesizeArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Print what was made as one JSON object (id, path, from: the ids
    /// of the chain it was made from, replaced_bytes, stored_bytes,
    /// stream_bytes, paths, data_bytes).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    lock: LockArg,
    /// The stored snapshot, an incremental entry: its id, its uuid, its
    /// path, `latest`, a base name, a date/time prefix or a prefix of its
    /// name, as `backup restore` takes it.
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
}

const SYNTHESIZE_HELP: &str = "\
Replaces the incremental stream of SNAPSHOT by a synthetic full stream of
the same snapshot, made from the repository alone: its chain applied to
the snapshot's index, its file data read from the chain's streams (nothing
is read from the source, nothing is sent over a network but reads of the
repository). The entry keeps its id and becomes `full`, marked with the
entries it was made from (`backup list --json`: synthesized_from); the
chain's later incremental streams apply on top of it, in btrsend and in the
stock `btrfs receive`, as they did on the chain.

The stream carries every path, mode, owner, modification time, xattr,
hard link and hole of the snapshot; shared data (reflinks) is written once
per file, and each path's access time is its modification time. Before
it replaces anything it is proven: the tree it makes, its data read back
from the stored file, must equal the tree the chain makes, path for path
and byte for byte; otherwise it is deleted and the entry stays as it was.
A crash at any point leaves a repository that verifies.

The entries before SNAPSHOT stay: `backup forget` deletes those its
policy drops once no kept entry needs them (forget synthesizes such full
streams by itself, unless --no-synthesize). Reading the streams needs an
identity in an encrypted repository.

Examples:
  btrsend backup synthesize --repo /backup/home home.2026-11-20T024500Z
  btrsend backup synthesize --repo s3://bucket/home 42 --json";

/// Run `btrsend backup synthesize`.
pub fn run(a: &SynthesizeArgs) -> anyhow::Result<()> {
    let repo = a.repo.open()?;
    let progress = BackupReporter::bar(!a.json, "synthesizing");
    let res = repo.synthesize(&a.snapshot, a.lock.wait(), &progress);
    progress.finish();
    let s = res.map_err(|e| json_error(a.json, e.into()))?;
    let mut out = crate::exit::stdout();
    if a.json {
        let v = json!({
            "id": s.entry.id,
            "path": s.entry.path,
            "from": s.entry.synthesized_from,
            "replaced_bytes": s.old.stored_bytes,
            "stored_bytes": s.entry.stored_bytes,
            "stream_bytes": s.entry.stream_bytes,
            "paths": s.paths,
            "data_bytes": s.data_bytes,
        });
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "entry {} ({}) is now a full stream of {} bytes stored ({} paths, {} bytes of file data), made from entries {}; its incremental stream of {} bytes is deleted",
            s.entry.id,
            printable(&s.entry.path),
            s.entry.stored_bytes,
            s.paths,
            s.data_bytes,
            s.entry
                .synthesized_from
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            s.old.stored_bytes,
        )?;
    }
    Ok(())
}
