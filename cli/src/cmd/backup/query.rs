//! `btrsend backup find` and `diff`: questions across stored snapshots,
//! answered from their indexes (core `btrsend::backup::index::{glob,
//! diff}`), never by restoring a chain.
//!
//! Output follows restic's `find` and `diff`: paths escaped for the
//! terminal, or one JSON object per line.

use std::io::Write;

use btrsend::backup::index::IndexError;
use btrsend::backup::index::diff::{Change, Side, diff};
use btrsend::backup::index::glob::Glob;
use btrsend::backup::{BackupError, LockKind, NoProgress};
use clap::Args;
use serde_json::json;

use super::RepoArg;
use super::browse::{index_err, json_of};
use crate::text::printable_bytes;

/// Arguments of `btrsend backup find`.
#[derive(Debug, Args)]
pub struct FindArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Search only this stored snapshot (as `backup restore` takes it);
    /// repeat for several. Default: every stored snapshot.
    #[arg(long = "snapshot", value_name = "SNAPSHOT")]
    snapshots: Vec<String>,
    /// One JSON object per line and match, with the key snapshot (the
    /// entry's uuid) and the keys of `ls --json`.
    #[arg(long)]
    json: bool,
    /// Shell-style patterns, with restic's rules: without / a pattern
    /// matches a name at any depth, with / it is anchored at the
    /// snapshot's root; * and ? do not match /, a whole component **
    /// matches any number of names, [...] a set of bytes, \ quotes.
    #[arg(value_name = "PATTERN", required = true)]
    patterns: Vec<String>,
}

/// Arguments of `btrsend backup diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// One JSON object per line, with the keys path (from the root,
    /// starting with /) and change (added, removed or modified).
    #[arg(long)]
    json: bool,
    /// The older stored snapshot (as `backup restore` takes it).
    #[arg(value_name = "SNAPSHOT1")]
    old: String,
    /// The newer stored snapshot, of the same origin.
    #[arg(value_name = "SNAPSHOT2")]
    new: String,
}

fn rooted(path: &[u8]) -> Vec<u8> {
    let mut p = b"/".to_vec();
    p.extend_from_slice(path);
    p
}

fn io_err(e: std::io::Error) -> IndexError {
    IndexError::Store(e.to_string())
}

/// The shell-style patterns of `find` and `restore --include/--exclude`.
pub(super) fn globs(patterns: &[String]) -> anyhow::Result<Vec<Glob>> {
    Ok(patterns
        .iter()
        .map(|p| Glob::new(p.as_bytes()))
        .collect::<Result<_, _>>()?)
}

/// Run `btrsend backup find`.
pub fn find(a: &FindArgs) -> anyhow::Result<()> {
    let globs = globs(&a.patterns)?;
    let repo = a.repo.open()?;
    let _lock = repo.lock(LockKind::Shared, std::time::Duration::ZERO, &NoProgress)?;
    let cat = repo.catalog()?;
    let entries: Vec<_> = if a.snapshots.is_empty() {
        cat.entries.iter().collect()
    } else {
        a.snapshots
            .iter()
            .map(|s| repo.find(&cat, s))
            .collect::<Result<_, _>>()?
    };
    let mut out = std::io::BufWriter::new(crate::exit::stdout());
    for e in entries {
        let mut header = false;
        let mut result = Ok(());
        repo.with_index(&cat, e, |snap, _| {
            result = snap
                .walk(&mut |path, _, inode| {
                    if !globs.iter().any(|g| g.is_match(path)) {
                        return Ok(());
                    }
                    let shown = rooted(path);
                    if a.json {
                        let mut v = json_of(&shown, inode);
                        v["snapshot"] = json!(e.uuid);
                        return writeln!(out, "{v}").map_err(io_err);
                    }
                    if !header {
                        header = true;
                        writeln!(
                            out,
                            "Found matching entries in snapshot {} ({}):",
                            e.id,
                            String::from_utf8_lossy(&printable_bytes(e.path.as_bytes()))
                        )
                        .map_err(io_err)?;
                    }
                    out.write_all(&printable_bytes(&shown)).map_err(io_err)?;
                    writeln!(out).map_err(io_err)
                })
                .map_err(index_err);
            Ok::<(), BackupError>(())
        })?;
        result?;
        if header {
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Run `btrsend backup diff`.
pub fn diff_cmd(a: &DiffArgs) -> anyhow::Result<()> {
    let repo = a.repo.open()?;
    let _lock = repo.lock(LockKind::Shared, std::time::Duration::ZERO, &NoProgress)?;
    let cat = repo.catalog()?;
    let (old, new) = (repo.find(&cat, &a.old)?, repo.find(&cat, &a.new)?);
    if old.origin != new.origin {
        anyhow::bail!(
            "entry {} and entry {} come from different origins ({} and {}): diff compares snapshots of one origin",
            old.id,
            new.id,
            old.origin,
            new.origin
        );
    }
    let mut out = std::io::BufWriter::new(crate::exit::stdout());
    let mut result = Ok(());
    repo.with_index(&cat, old, |sa, da| {
        repo.with_index(&cat, new, |sb, db| {
            let (x, y) = (Side { snap: sa, data: da }, Side { snap: sb, data: db });
            result = diff(&x, &y, &mut |path, change| {
                let shown = rooted(path);
                if a.json {
                    let v = json!({
                        "path": String::from_utf8_lossy(&shown),
                        "change": change.name(),
                    });
                    return writeln!(out, "{v}").map_err(io_err);
                }
                let mark = match change {
                    Change::Added => '+',
                    Change::Removed => '-',
                    Change::Modified => 'M',
                };
                write!(out, "{mark}    ").map_err(io_err)?;
                out.write_all(&printable_bytes(&shown)).map_err(io_err)?;
                writeln!(out).map_err(io_err)
            })
            .map_err(index_err);
            Ok::<(), BackupError>(())
        })
    })?;
    result?;
    out.flush()?;
    Ok(())
}
