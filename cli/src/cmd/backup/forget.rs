//! `btrsend backup forget`: parsing and rendering for the retention policy
//! (core `btrsend::backup::forget`).

use std::io::{IsTerminal, Write};

use btrsend::backup::ForgetOptions;
use btrsend::backup::retention::{Keep, Policy, Within};
use clap::Args;
use serde_json::json;

use super::config::{ConfigArg, Destination};
use super::metrics::Metrics;
use super::{LockArg, MetricsArg, RepoArg};
use crate::exit::{UsageError, json_error};
use crate::progress::backup::BackupReporter;
use crate::text::printable;

/// Arguments of `btrsend backup forget`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = FORGET_HELP)]
pub struct ForgetArgs {
    #[command(flatten)]
    pub(super) repo: RepoArg,
    #[command(flatten)]
    pub(super) target: super::target::TargetArg,
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Keep the N newest entries (-1: all).
    #[arg(long = "keep-last", value_name = "N", allow_negative_numbers = true)]
    keep_last: Option<Keep>,
    /// Keep the newest entry of each of the N most recent hours that have
    /// one (-1: every hour).
    #[arg(long = "keep-hourly", value_name = "N", allow_negative_numbers = true)]
    keep_hourly: Option<Keep>,
    /// Keep the newest entry of each of the N most recent days that have
    /// one (-1: every day).
    #[arg(long = "keep-daily", value_name = "N", allow_negative_numbers = true)]
    keep_daily: Option<Keep>,
    /// Keep the newest entry of each of the N most recent ISO weeks
    /// (Monday to Sunday) that have one (-1: every week).
    #[arg(long = "keep-weekly", value_name = "N", allow_negative_numbers = true)]
    keep_weekly: Option<Keep>,
    /// Keep the newest entry of each of the N most recent months that have
    /// one (-1: every month).
    #[arg(long = "keep-monthly", value_name = "N", allow_negative_numbers = true)]
    keep_monthly: Option<Keep>,
    /// Keep the newest entry of each of the N most recent years that have
    /// one (-1: every year).
    #[arg(long = "keep-yearly", value_name = "N", allow_negative_numbers = true)]
    keep_yearly: Option<Keep>,
    /// Keep every entry newer than the newest entry's time minus DURATION:
    /// years, months, days and hours, e.g. 1y6m, 30d, 2d12h.
    #[arg(long = "keep-within", value_name = "DURATION")]
    keep_within: Option<Within>,
    /// Delete nothing: print, for every entry, keep or delete and why. A
    /// dry run takes no lock, so it never waits for a run.
    #[arg(long = "dry-run", short = 'n')]
    pub(super) dry_run: bool,
    /// Keep the ancestors kept entries need instead of replacing the
    /// oldest kept entry of each such chain by a synthetic full stream
    /// (see SYNTHETIC FULL STREAMS below).
    #[arg(long = "no-synthesize")]
    no_synthesize: bool,
    /// Print the decisions as a JSON array, one object per entry (id, path,
    /// uuid, time, origin, kind, action: "keep" or "delete", reasons,
    /// stored_bytes, kept_for_chain: true when the entry is kept only
    /// because kept entries' chains need it, and synthesize: true when its
    /// stream is replaced by a synthetic full stream).
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    lock: LockArg,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
}

const FORGET_HELP: &str = "\
The policy is restic's `forget`, applied to each origin (the subvolume the
snapshots were taken of, or the --origin of an import) apart, on the
entries' times in the local time zone (TZ). An entry is kept when any
option keeps it; while an option's count is not used up, the oldest entry
is kept too. Then every ancestor of a kept entry (the base of its
incremental stream, and so on down to its full stream) is kept as well
(\"parent of ID\"), so that every kept entry stays restorable; entries whose
time is in the future are never deleted. The catalog is replaced
atomically before any stream file is deleted.

SYNTHETIC FULL STREAMS: where the policy keeps an entry whose ancestors it
drops, the oldest kept entry of each such chain gets a synthetic full
stream of its snapshot, made from the repository alone (see
btrsend-backup-synthesize(1): proven equal to what the chain restores
before anything is replaced), and its ancestors are deleted; the chain's
later entries stay incremental on top of it. So `--keep-last 3` over a
chain of 12 leaves about one full stream and two incremental ones, and
no periodic full send from the source is needed to free space. The
listing marks such an entry \"synthetic full\" and ends with the bytes the
stream files deleted held; --dry-run says what would be synthesized. A
synthesis that fails keeps its chain as it was (a warning says why).
Synthesis reads the streams: with only the write key of an encrypted
repository, or with --no-synthesize, a chain is freed only once a newer
full stream starts the next one (`backup run` makes one when the chain's
full stream is 30 days old (--full-every-days)), and the listing ends with
how many entries, and how many bytes, the policy would drop but kept
chains still need; --json marks them kept_for_chain.

Without any --keep-* option (or with only zeros) nothing is deleted and the
exit status is 2.

With --target (a received-subvolume target: see TARGETS in
btrsend-backup-run(1)) the policy applies to the subvolumes received
completely into the target directory, per group: the name without the
time or number at its end (home.2026-11-20T024500Z, btrbk's
home.20261120T0245, home.7 and home7 are in group home), else the whole
name. Their time is the one in a name that
backup run --snapshot gave, else when the subvolume was received. There are
no chains, but the newest of each group is always kept (\"newest: the next
incremental's parent\"), as are partial receives (backup run continues
them) and subvolumes whose time is unknown. An append-only server (btrsend
serve --append-only) refuses: prune on the backup host with --target DIR.
--json gives name, group, time, received_uuid, stransid, action, reasons
and deleted.

Examples:
  btrsend backup forget --repo /backup/home --keep-daily 7 --keep-weekly 4 --keep-monthly 12
  btrsend backup forget --repo s3://bucket/home --keep-within 30d --dry-run
  btrsend backup forget --target /backup/host1 --keep-daily 14 --keep-monthly 6";

impl ForgetArgs {
    pub(super) fn policy(&self) -> Policy {
        Policy {
            last: self.keep_last.unwrap_or_default(),
            hourly: self.keep_hourly.unwrap_or_default(),
            daily: self.keep_daily.unwrap_or_default(),
            weekly: self.keep_weekly.unwrap_or_default(),
            monthly: self.keep_monthly.unwrap_or_default(),
            yearly: self.keep_yearly.unwrap_or_default(),
            within: self.keep_within,
        }
    }

    /// These options for the config file's destination `d`: each
    /// `--keep-*` given on the command line wins over the file's key.
    pub(super) fn for_destination(&self, d: &Destination) -> ForgetArgs {
        let mut a = self.clone();
        a.repo = self.repo.for_destination(d);
        a.target = self.target.for_destination(d);
        let [last, hourly, daily, weekly, monthly, yearly] = d.keeps();
        a.keep_last = a.keep_last.or(last);
        a.keep_hourly = a.keep_hourly.or(hourly);
        a.keep_daily = a.keep_daily.or(daily);
        a.keep_weekly = a.keep_weekly.or(weekly);
        a.keep_monthly = a.keep_monthly.or(monthly);
        a.keep_yearly = a.keep_yearly.or(yearly);
        a.keep_within = a.keep_within.or(d.keep_within.map(|w| w.0));
        a.lock.retry_lock = a.lock.retry_lock.or(d.retry_lock.map(|r| r.0));
        a
    }
}

/// Run `btrsend backup forget`.
pub fn run(a: &ForgetArgs, m: &mut Metrics) -> anyhow::Result<()> {
    let policy = a.policy();
    if policy.is_empty() {
        return Err(UsageError(String::from(
            "refusing an empty policy, which would delete every backup: give at least one --keep-* option",
        ))
        .into());
    }
    if let Some(t) = &a.target.target {
        return super::target::forget(
            t,
            &a.repo.ssh_options(),
            &policy,
            a.dry_run,
            a.json,
            a.lock.wait(),
        )
        .map_err(|e| json_error(a.json, e));
    }
    let repo = a.repo.open()?;
    let opts = ForgetOptions::new()
        .with_dry_run(a.dry_run)
        .with_wait_lock(a.lock.wait())
        .with_synthesize(!a.no_synthesize);
    let progress = BackupReporter::bar(!a.json, "forgetting");
    let report = repo.forget(&policy, &opts, &progress);
    progress.finish();
    let report = report.map_err(|e| json_error(a.json, e.into()))?;
    let mut deleted: std::collections::BTreeMap<&str, u64> = Default::default();
    for v in &report.verdicts {
        *deleted.entry(v.entry.origin.as_str()).or_default() += u64::from(!v.keep && !a.dry_run);
    }
    for (origin, n) in deleted {
        m.int(
            "btrsend_snapshots_deleted",
            "Snapshots of the origin forget deleted (0 in a dry run).",
            Some(origin),
            n,
        );
    }
    m.catalog(&repo);
    let mut out = crate::exit::stdout();
    if a.json {
        let rows: Vec<_> = report
            .verdicts
            .iter()
            .map(|v| {
                json!({
                    "id": v.entry.id,
                    "path": v.entry.path,
                    "uuid": v.entry.uuid,
                    "time": v.entry.time,
                    "origin": v.entry.origin,
                    "kind": v.entry.kind.as_str(),
                    "parent_id": v.entry.parent_id,
                    "action": if v.keep { "keep" } else { "delete" },
                    "reasons": v.reasons,
                    "stored_bytes": v.entry.stored_bytes,
                    "kept_for_chain": v.kept_for_chain,
                    "synthesize": v.synthesize,
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else if a.dry_run || std::io::stdout().is_terminal() {
        let deleted = if a.dry_run { "would delete" } else { "deleted" };
        for v in &report.verdicts {
            let action = if v.keep { "keep" } else { deleted };
            let mut reasons = v.reasons.clone();
            if v.synthesize {
                reasons.push(String::from("synthetic full"));
            }
            writeln!(
                out,
                "{action:<12}  {:>5}  {:<25}  {}{}{}",
                v.entry.id,
                printable(&v.entry.time),
                printable(&v.entry.path),
                if v.keep { "  (" } else { "" },
                reasons.join(", ") + if v.keep { ")" } else { "" },
            )?;
        }
        let kept = report.verdicts.iter().filter(|v| v.keep).count();
        let synthesized = if report.synthesized.is_empty() {
            String::new()
        } else {
            format!(
                ", {} {} a synthetic full stream",
                report.synthesized.len(),
                if a.dry_run { "would get" } else { "got" }
            )
        };
        writeln!(
            out,
            "{kept} kept, {} {deleted}{synthesized}; {} bytes of stream files {}",
            report.verdicts.len() - kept,
            report.freed_bytes,
            if a.dry_run { "to delete" } else { "deleted" },
        )?;
        for why in &report.synthesis_skipped {
            writeln!(out, "no synthetic full stream: {}", printable(why))?;
        }
        let why = report
            .chain_held
            .explain(!a.no_synthesize && report.synthesis_skipped.is_empty());
        if !why.is_empty() {
            writeln!(out, "{why}")?;
        }
    }
    Ok(())
}
