//! `btrsend backup run --dry-run`: what the run would store, printed as
//! text or JSON Lines; the plan itself is the core's
//! ([`Repository::dry_run`](btrsend::backup::Repository::dry_run)).

use btrsend::backup::{DryRunReport, RunOptions};
use std::io::Write;

use serde_json::json;

use super::RepoArg;
use super::run::RunArgs;
use crate::exit::{Exit, ExitWith, with_json_context};
use crate::text::{iec, printable};

/// Plan the run, print the plan, and refuse as the run would.
pub(super) fn run(a: &RunArgs, repo: &RepoArg, opts: RunOptions) -> anyhow::Result<()> {
    let repo = repo.open()?;
    let report = repo.dry_run(&a.snapshots, &opts)?;
    finish(a, report, repo.store().name(), "store")
}

/// `backup run --dry-run --target`: what the run would receive there.
pub(super) fn run_target(a: &RunArgs, target: &str, opts: RunOptions) -> anyhow::Result<()> {
    let mut end = btrsend::backup::target::open(target, &a.repo.ssh_options())?;
    let report = btrsend::backup::target::dry_run(end.as_mut(), &a.snapshots, &opts)?;
    finish(a, report, target, "receive")
}

/// Print the plan (`verb`: what the run does with each stream), then
/// refuse as the run would.
fn finish(a: &RunArgs, report: DryRunReport, name: &str, verb: &str) -> anyhow::Result<()> {
    let total = report.stream_bytes();
    // The limit counts stored bytes, which zstd makes fewer: the raw total
    // at the limit is the longest the transfer takes.
    let seconds = a.limit_rate.filter(|r| *r > 0).map(|r| total.div_ceil(r));
    let out = &mut crate::exit::stdout();
    if a.json {
        print_json(out, &report, a.limit_rate, seconds)?;
    } else {
        print_text(out, &report, name, verb, a.limit_rate, seconds)?;
    }
    for (path, err) in &report.failed {
        if a.json {
            crate::exit::json_snapshot_error(path, err);
        } else {
            eprintln!(
                "btrsend: error: {}: {}",
                printable(path),
                crate::text::error_text_of(err)
            );
        }
    }
    for (subvol, err) in &report.snapshot_failed {
        let path = subvol.display().to_string();
        if a.json {
            crate::exit::json_snapshot_error(&path, err);
        } else {
            eprintln!(
                "btrsend: error: {}: {}",
                printable(&path),
                crate::text::error_text_of(err)
            );
        }
    }
    if let Some(e) = report.no_room {
        return Err(e.into());
    }
    let failed = report.failed.len() + report.snapshot_failed.len();
    match (report.streams.len(), failed) {
        (_, 0) => Ok(()),
        (0, n) => Err(anyhow::Error::new(ExitWith::quiet(Exit::Failure))
            .context(format!("{n} snapshots cannot be planned"))),
        (ok, n) => Err(anyhow::Error::new(ExitWith::quiet(Exit::Partial))
            .context(format!("{n} snapshots cannot be planned, {ok} can"))),
    }
}

fn print_json(
    out: &mut dyn Write,
    report: &DryRunReport,
    rate: Option<u64>,
    seconds: Option<u64>,
) -> std::io::Result<()> {
    for s in &report.streams {
        writeln!(
            out,
            "{}",
            with_json_context(json!({
                "message_type": "dry_run",
                "snapshot": s.path,
                "uuid": s.uuid,
                "ctransid": s.ctransid,
                "kind": s.kind.as_str(),
                "parent": s.parent.as_ref().map(|p| &p.0),
                "parent_id": s.parent.as_ref().and_then(|p| p.1),
                "full_reason": s.full_reason.map(|r| r.as_str()),
                "stream_bytes": s.stream_bytes,
            }))
        )?;
    }
    for (path, id) in &report.skipped {
        writeln!(
            out,
            "{}",
            with_json_context(
                json!({"message_type": "status", "snapshot": path, "already_stored": id})
            )
        )?;
    }
    for (path, name) in &report.received {
        writeln!(
            out,
            "{}",
            with_json_context(
                json!({"message_type": "status", "snapshot": path, "already_received": name})
            )
        )?;
    }
    for (subvol, snap) in &report.unchanged {
        writeln!(
            out,
            "{}",
            with_json_context(json!({
                "message_type": "status",
                "subvolume": subvol.display().to_string(),
                "unchanged": true,
                "newest_snapshot": snap.display().to_string(),
            }))
        )?;
    }
    for subvol in &report.would_take {
        writeln!(
            out,
            "{}",
            with_json_context(
                json!({"message_type": "status", "would_take": subvol.display().to_string()})
            )
        )?;
    }
    writeln!(
        out,
        "{}",
        with_json_context(json!({
            "message_type": "dry_run_total",
            "streams": report.streams.len(),
            "stream_bytes": report.stream_bytes(),
            "stored_bytes": null,
            "already_stored": report.skipped.len(),
            "already_received": report.received.len(),
            "failed": report.failed.len() + report.snapshot_failed.len(),
            "snapshots_to_take": report.would_take.len(),
            "free_bytes": report.free_bytes,
            "limit_rate": rate,
            "seconds_at_limit_rate": seconds,
        }))
    )?;
    Ok(())
}

fn print_text(
    out: &mut dyn Write,
    report: &DryRunReport,
    repo: &str,
    verb: &str,
    rate: Option<u64>,
    seconds: Option<u64>,
) -> std::io::Result<()> {
    for subvol in &report.would_take {
        writeln!(
            out,
            "would take a snapshot of {} (its stream is not counted below: it has no size until it is taken)",
            printable(&subvol.display().to_string())
        )?;
    }
    for (subvol, snap) in &report.unchanged {
        writeln!(
            out,
            "no snapshot of {}: unchanged since {}",
            printable(&subvol.display().to_string()),
            printable(&snap.display().to_string())
        )?;
    }
    for (path, id) in &report.skipped {
        writeln!(out, "already stored: {} (entry {id})", printable(path))?;
    }
    for (path, name) in &report.received {
        writeln!(
            out,
            "already received: {} (as {})",
            printable(path),
            printable(name)
        )?;
    }
    for s in &report.streams {
        let how = match &s.parent {
            Some((p, Some(id))) => format!("incremental from {} (entry {id})", printable(p)),
            Some((p, None)) => format!("incremental from {}", printable(p)),
            None => match s.full_reason {
                Some(r) => format!("full ({})", r.as_str()),
                None => String::from("full"),
            },
        };
        writeln!(
            out,
            "would {verb} {}: {how}, {} bytes of raw stream",
            printable(&s.path),
            s.stream_bytes
        )?;
    }
    let total = report.stream_bytes();
    writeln!(
        out,
        "total: {} streams, {total} bytes ({}) of raw stream, exact; the stored size is unknown until compressed",
        report.streams.len(),
        iec(total)
    )?;
    if let Some(free) = report.free_bytes {
        writeln!(
            out,
            "free in {}: {free} bytes ({})",
            printable(repo),
            iec(free)
        )?;
    }
    if let (Some(rate), Some(secs)) = (rate, seconds) {
        writeln!(
            out,
            "at --limit-rate {rate} bytes/s: at most {} ({secs} s)",
            indicatif::HumanDuration(std::time::Duration::from_secs(secs))
        )?;
    }
    Ok(())
}
