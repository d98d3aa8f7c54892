//! `--target` of `backup run`, `list` and `forget`: a received-subvolume
//! target (core `btrsend::backup::target`) in place of a repository.
//! `run` is in [`super::run`]; this module has the option and what
//! `list` and `forget` print for a target.

use std::io::{IsTerminal, Write};

use btrsend::backup::ForgetOptions;
use btrsend::backup::retention::Policy;
use btrsend::backup::target;
use clap::Args;
use serde_json::json;

use crate::exit::{Exit, ExitWith};
use crate::text::{local_time, printable};

/// The target option.
#[derive(Debug, Clone, Default, Args)]
pub struct TargetArg {
    /// Receive into (list, prune) a received-subvolume target instead of
    /// a repository: a directory, or ssh://USER@HOST:PORT/DIR (USER@ and
    /// :PORT optional; `btrsend serve` on the far end, as for an ssh://
    /// repository). Each snapshot becomes DIR/NAME, a read-only btrfs
    /// subvolume with its received UUID (on btrfs as root), as btrbk's
    /// send-receive makes them (see TARGETS in btrsend-backup-run(1)).
    #[arg(long = "target", value_name = "TARGET", conflicts_with = "repo")]
    pub target: Option<String>,
}

impl TargetArg {
    /// The target of the config file's destination `d`, unless one is
    /// given on the command line.
    pub(super) fn for_destination(&self, d: &super::config::Destination) -> TargetArg {
        TargetArg {
            target: self
                .target
                .clone()
                .or_else(|| d.target.as_ref().map(|t| t.get_ref().clone())),
        }
    }
}

/// `backup list --target`: the subvolumes in the target directory.
pub fn list(
    spec: &str,
    ssh: &btrsend::backup::remote::ssh::SshOptions,
    json: bool,
) -> anyhow::Result<()> {
    let mut end = target::open(spec, ssh)?;
    let list = end.list()?;
    let mut out = crate::exit::stdout();
    if json {
        serde_json::to_writer_pretty(&mut out, &list)?;
        writeln!(out)?;
        return Ok(());
    }
    let rows: Vec<[String; 5]> = list
        .iter()
        .map(|r| {
            [
                state(r).to_owned(),
                target::time_of(r).map_or_else(|| "-".into(), |t| local_time(&t.to_string())),
                r.received_uuid.clone().unwrap_or_else(|| "-".into()),
                r.stransid.to_string(),
                printable(&r.name).into_owned(),
            ]
        })
        .collect();
    let head = ["state", "time", "received uuid", "stransid", "name"];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |out: &mut dyn Write, c: [&str; 5]| -> std::io::Result<()> {
        let [w0, w1, w2, w3, _] = width;
        writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {}",
            c[0], c[1], c[2], c[3], c[4]
        )
    };
    line(&mut out, head)?;
    for r in &rows {
        line(&mut out, r.each_ref().map(String::as_str))?;
    }
    Ok(())
}

fn state(r: &target::Received) -> &'static str {
    match (r.complete, r.partial) {
        (true, _) => "complete",
        (false, true) => "partial",
        (false, false) => "incomplete",
    }
}

/// `backup forget --target`: apply `policy` to the target's subvolumes.
pub fn forget(
    spec: &str,
    ssh: &btrsend::backup::remote::ssh::SshOptions,
    policy: &Policy,
    dry_run: bool,
    json: bool,
    wait: std::time::Duration,
) -> anyhow::Result<()> {
    let mut end = target::open(spec, ssh)?;
    let opts = ForgetOptions::new()
        .with_dry_run(dry_run)
        .with_wait_lock(wait);
    let report = target::forget(end.as_mut(), policy, &opts)?;
    let mut out = crate::exit::stdout();
    if json {
        let rows: Vec<_> = report
            .verdicts
            .iter()
            .map(|v| {
                json!({
                    "name": v.received.name,
                    "group": v.group,
                    "time": v.time.map(|t| t.to_string()),
                    "received_uuid": v.received.received_uuid,
                    "stransid": v.received.stransid,
                    "action": if v.keep { "keep" } else { "delete" },
                    "reasons": v.reasons,
                    "deleted": !v.keep && !dry_run && !report.failed.iter().any(|(n, _)| *n == v.received.name),
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else if dry_run || std::io::stdout().is_terminal() {
        let deleted = if dry_run { "would delete" } else { "deleted" };
        for v in &report.verdicts {
            let action = if v.keep { "keep" } else { deleted };
            let time = v
                .time
                .map_or_else(|| "-".into(), |t| local_time(&t.to_string()));
            let why = if v.keep {
                format!("  ({})", v.reasons.join(", "))
            } else {
                String::new()
            };
            writeln!(
                out,
                "{action:<12}  {time:<25}  {}{why}",
                printable(&v.received.name)
            )?;
        }
        let kept = report.verdicts.iter().filter(|v| v.keep).count();
        writeln!(
            out,
            "{kept} kept, {} {deleted}",
            report.verdicts.len() - kept
        )?;
    }
    for (name, e) in &report.failed {
        eprintln!(
            "btrsend: error: cannot delete {}: {}",
            printable(name),
            printable(&e.to_string())
        );
    }
    if !report.failed.is_empty() {
        return Err(
            anyhow::Error::new(ExitWith::quiet(Exit::Failure)).context(format!(
                "{} subvolumes could not be deleted",
                report.failed.len()
            )),
        );
    }
    Ok(())
}
