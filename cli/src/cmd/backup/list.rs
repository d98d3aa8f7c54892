//! `btrsend backup list`: the catalog's entries as a table or JSON.
//!
//! It reads the newest catalog and takes no lock: a list never waits for a
//! run, and never writes.

use std::io::Write;
use std::time::Duration;

use clap::Args;

use super::config::{ConfigArg, Destination};
use super::{RepoArg, parse_duration};
use crate::text::{iec, local_time, printable};

/// Arguments of `btrsend backup list`.
#[derive(Debug, Clone, Args)]
pub struct BackupListArgs {
    #[command(flatten)]
    pub(super) repo: RepoArg,
    #[command(flatten)]
    pub(super) target: super::target::TargetArg,
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Print a JSON array, one object per stored stream (id, path, uuid,
    /// ctransid, parent_uuid, parent_id, kind, time, origin, stream_bytes,
    /// stored_bytes, …; times in UTC, sizes in bytes). Without it, a table
    /// with times in the local time zone and sizes in IEC units (KiB,
    /// MiB, GiB). With --target: one object per subvolume of the target
    /// (name, received_uuid, stransid, complete, subvolume, partial: a
    /// resume point names it, made: when it was made there); the table
    /// says complete, partial or incomplete.
    #[arg(long)]
    pub(super) json: bool,
    /// Accepted for scripts written for older versions: `list` takes no
    /// lock (it reads the newest catalog, which is replaced atomically), so
    /// it never waits.
    #[arg(long = "retry-lock", value_name = "DURATION", value_parser = parse_duration, hide = true)]
    _retry_lock: Option<Duration>,
}

impl BackupListArgs {
    /// These options for the config file's destination `d`.
    pub(super) fn for_destination(&self, d: &Destination) -> BackupListArgs {
        let mut a = self.clone();
        a.repo = self.repo.for_destination(d);
        a.target = self.target.for_destination(d);
        a
    }
}

/// Run `btrsend backup list`.
pub fn run(a: &BackupListArgs) -> anyhow::Result<()> {
    if let Some(t) = &a.target.target {
        return super::target::list(t, &a.repo.ssh_options(), a.json);
    }
    let repo = a.repo.open()?;
    let entries = repo.list()?;
    let mut out = crate::exit::stdout();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &entries)?;
        writeln!(out)?;
        return Ok(());
    }
    // Times in the local time zone, sizes in IEC units: for people. The
    // JSON form keeps the exact values.
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            [
                e.id.to_string(),
                e.kind.as_str().to_owned(),
                local_time(&e.time),
                iec(e.stream_bytes),
                iec(e.stored_bytes),
                e.parent_id
                    .map_or_else(|| String::from("-"), |p| p.to_string()),
                printable(&e.path).into_owned(),
            ]
        })
        .collect();
    let head = ["id", "kind", "time", "stream", "stored", "parent", "path"];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |out: &mut dyn Write, c: [&str; 7]| -> std::io::Result<()> {
        let [w0, w1, w2, w3, w4, w5, _] = width;
        writeln!(
            out,
            "{:>w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}  {:>w5$}  {}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6]
        )
    };
    line(&mut out, head)?;
    for r in &rows {
        line(&mut out, r.each_ref().map(String::as_str))?;
    }
    Ok(())
}
