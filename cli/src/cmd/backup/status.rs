//! `btrsend backup status`: per origin, the newest stored snapshot, its
//! age and its chain's health (core `btrsend::backup::status`), as a table
//! or one JSON object, and exit status 14 when a backup is stale.
//!
//! It reads the newest catalog and takes no lock, like `list`.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::config::{ConfigArg, Destination};
use super::metrics::Metrics;
use super::{MetricsArg, RepoArg, parse_duration};
use crate::exit::{Exit, ExitWith, json_error};
use crate::text::{iec, local_time, printable};

/// Arguments of `btrsend backup status`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = STATUS_HELP)]
pub struct StatusArgs {
    #[command(flatten)]
    pub(super) repo: RepoArg,
    #[command(flatten)]
    pub(super) target: super::target::TargetArg,
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Exit with status 14 unless every origin's newest stored snapshot is
    /// younger than DURATION (e.g. 90m, 26h; a number alone is seconds);
    /// an empty repository is then stale too.
    #[arg(long = "max-age", value_name = "DURATION", value_parser = parse_duration)]
    max_age: Option<Duration>,
    /// Print one JSON object (see below) instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
}

const STATUS_HELP: &str = "\
For each origin (the subvolume the snapshots were taken of, or the
--origin of an import): its newest stored snapshot (by the snapshot's
time), its age (from that time to now), how many snapshots are stored and
the health of the newest one's chain. Only the catalog is read, never a
stream file: it takes no lock, is cheap enough for a check every few
minutes, and the write key of an encrypted repository suffices. The
catalog's own checks (every incremental entry's parent present, with the
uuid and ctransid it records; full entries without one) run whenever it is
read, so a catalog that fails them is an error (exit status 1); `backup
verify` checks the stream files too.

Output: on a terminal a table, with times in the local time zone; when
standard output is not a terminal (cron) nothing on success, and with
--max-age one line per stale or unhealthy origin on standard error, so that
cron mails only a problem. --json prints one object with the keys
repository, generation, checked_at, max_age_seconds (null without
--max-age), stale, entries, stored_bytes and origins: an array, by origin,
of objects with origin, entries, stored_bytes, newest (id, path, uuid,
kind, time, stored_at), age_seconds, chain_length, healthy, problem and
stale (times RFC 3339 in UTC, ages in seconds, sizes in bytes; null where
unknown).

Exit status 14 when, with --max-age, some origin's newest snapshot is that
old or older (or its time is unreadable), or the repository holds none;
and when an origin's newest chain does not resolve. For example, in cron
or a Nagios check:
  btrsend backup status --repo /backup/home --max-age 26h || echo stale

With --target (a received-subvolume target: see TARGETS in
btrsend-backup-run(1)) the same per group of received subvolumes (the
groups of backup forget --target): the newest one received completely,
its time (in its name when backup run --snapshot named it, else when it was
received), its age, and how many are complete and partial. The JSON object
has target, checked_at, max_age_seconds, stale and groups: an array of
objects with group, complete, partial, newest (name, received_uuid,
stransid, or null), time, age_seconds and stale. A group with nothing
complete, and with --max-age an empty target, is stale.";

impl StatusArgs {
    /// These options for the config file's destination `d` (the command
    /// line wins).
    pub(super) fn for_destination(&self, d: &Destination) -> StatusArgs {
        let mut a = self.clone();
        a.repo = self.repo.for_destination(d);
        a.target = self.target.for_destination(d);
        a.max_age = a.max_age.or(d.max_age.map(|m| m.0));
        a
    }
}

/// Run `btrsend backup status`.
pub fn run(a: &StatusArgs, m: &mut Metrics) -> anyhow::Result<()> {
    if let Some(t) = &a.target.target {
        return target_status(a, t).map_err(|e| json_error(a.json, e));
    }
    let go = |m: &mut Metrics| -> anyhow::Result<()> {
        let repo = a.repo.open()?;
        let now = jiff::Timestamp::now();
        let rep = repo.status(now, a.max_age)?;
        let name = repo.store().name().to_owned();
        m.catalog_of(&rep);
        for o in &rep.origins {
            let origin = Some(o.origin.as_str());
            if let Some(age) = o.age_seconds {
                m.signed(
                    "btrsend_newest_snapshot_age_seconds",
                    "Age of the origin's newest stored snapshot when status ran.",
                    origin,
                    age,
                );
            }
            m.int(
                "btrsend_chain_healthy",
                "1 when the chain of the origin's newest stored snapshot resolves, else 0.",
                origin,
                u64::from(o.healthy),
            );
            if a.max_age.is_some() {
                m.int(
                    "btrsend_stale",
                    "1 when the origin's newest stored snapshot is older than --max-age, else 0.",
                    origin,
                    u64::from(o.stale),
                );
            }
        }
        let unhealthy = rep.origins.iter().any(|o| !o.healthy);
        let mut out = crate::exit::stdout();
        if a.json {
            let origins: Vec<_> = rep
                .origins
                .iter()
                .map(|o| {
                    json!({
                        "origin": o.origin,
                        "entries": o.entries,
                        "stored_bytes": o.stored_bytes,
                        "newest": {
                            "id": o.newest.id,
                            "path": o.newest.path,
                            "uuid": o.newest.uuid,
                            "kind": o.newest.kind.as_str(),
                            "time": o.newest.time,
                            "stored_at": o.newest.stored_at,
                        },
                        "age_seconds": o.age_seconds,
                        "chain_length": o.chain_length,
                        "healthy": o.healthy,
                        "problem": o.problem,
                        "stale": o.stale,
                    })
                })
                .collect();
            let v = crate::exit::with_json_context(json!({
                "repository": name,
                "generation": rep.generation,
                "checked_at": now.to_string(),
                "max_age_seconds": a.max_age.map(|d| d.as_secs()),
                "stale": rep.stale,
                "entries": rep.entries,
                "stored_bytes": rep.stored_bytes,
                "origins": origins,
            }));
            serde_json::to_writer_pretty(&mut out, &v)?;
            writeln!(out)?;
        } else if std::io::stdout().is_terminal() {
            table(&mut out, &rep)?;
        } else if a.max_age.is_some() || unhealthy {
            // Cron: silent unless something is wrong, and then on standard
            // error, one line per origin.
            for o in rep.origins.iter().filter(|o| o.stale || !o.healthy) {
                let age = o.age_seconds.map_or_else(|| String::from("unknown"), age);
                let why = o
                    .problem
                    .as_deref()
                    .map_or_else(String::new, |p| format!(" ({})", printable(p)));
                eprintln!(
                    "btrsend: {}: origin {}: newest snapshot {} of {}, {age} old{why}",
                    if o.healthy { "stale" } else { "unhealthy" },
                    printable(&o.origin),
                    printable(&o.newest.path),
                    printable(&o.newest.time),
                );
            }
        }
        if rep.stale || unhealthy {
            let what = if rep.origins.is_empty() {
                format!("{}: no backup stored", printable(&name))
            } else {
                let n = rep.origins.iter().filter(|o| o.stale || !o.healthy).count();
                format!(
                    "{}: {n} of {} origins stale or unhealthy",
                    printable(&name),
                    rep.origins.len()
                )
            };
            return Err(anyhow::Error::new(ExitWith::new(Exit::Stale, what)));
        }
        Ok(())
    };
    go(m).map_err(|e| json_error(a.json, e))
}

/// `backup status --target`.
fn target_status(a: &StatusArgs, spec: &str) -> anyhow::Result<()> {
    let mut end = btrsend::backup::target::open(spec, &a.repo.ssh_options())?;
    let list = end.list()?;
    let now = jiff::Timestamp::now();
    let st = btrsend::backup::target::status(&list, now, a.max_age);
    let mut out = crate::exit::stdout();
    if a.json {
        let groups: Vec<_> = st
            .groups
            .iter()
            .map(|g| {
                json!({
                    "group": g.group,
                    "complete": g.complete,
                    "partial": g.partial,
                    "newest": g.newest.as_ref().map(|r| json!({
                        "name": r.name,
                        "received_uuid": r.received_uuid,
                        "stransid": r.stransid,
                    })),
                    "time": g.time.map(|t| t.to_string()),
                    "age_seconds": g.age_seconds,
                    "stale": g.stale,
                })
            })
            .collect();
        let v = crate::exit::with_json_context(json!({
            "target": spec,
            "checked_at": now.to_string(),
            "max_age_seconds": a.max_age.map(|d| d.as_secs()),
            "stale": st.stale,
            "groups": groups,
        }));
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else if std::io::stdout().is_terminal() {
        let rows: Vec<[String; 6]> = st
            .groups
            .iter()
            .map(|g| {
                [
                    if g.stale { "stale" } else { "ok" }.to_owned(),
                    g.time
                        .map_or_else(|| "-".into(), |t| local_time(&t.to_string())),
                    g.age_seconds.map_or_else(|| String::from("?"), age),
                    format!("{}+{}", g.complete, g.partial),
                    g.newest
                        .as_ref()
                        .map_or_else(|| "-".into(), |r| printable(&r.name).into_owned()),
                    printable(&g.group).into_owned(),
                ]
            })
            .collect();
        let head = [
            "state",
            "newest",
            "age",
            "complete+partial",
            "name",
            "group",
        ];
        let mut width = head.map(str::len);
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let [w0, w1, w2, w3, w4, _] = width;
        for r in std::iter::once(head.map(String::from)).chain(rows) {
            writeln!(
                out,
                "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:<w4$}  {}",
                r[0], r[1], r[2], r[3], r[4], r[5]
            )?;
        }
        if st.groups.is_empty() {
            writeln!(out, "nothing received")?;
        }
    } else {
        for g in st.groups.iter().filter(|g| g.stale) {
            eprintln!(
                "btrsend: stale: {}: group {}: newest {}, {} old",
                printable(spec),
                printable(&g.group),
                g.newest.as_ref().map_or_else(
                    || "none received completely".into(),
                    |r| printable(&r.name).into_owned()
                ),
                g.age_seconds.map_or_else(|| String::from("unknown"), age),
            );
        }
    }
    if st.stale {
        let n = st.groups.iter().filter(|g| g.stale).count();
        let what = if st.groups.is_empty() {
            format!("{}: nothing received", printable(spec))
        } else {
            format!(
                "{}: {n} of {} groups stale",
                printable(spec),
                st.groups.len()
            )
        };
        return Err(anyhow::Error::new(ExitWith::new(Exit::Stale, what)));
    }
    Ok(())
}

/// An age as people read it: `3d 4h`, `2h 5m`, `40s`.
fn age(secs: i64) -> String {
    if secs < 0 {
        return format!("{} in the future", age(secs.saturating_neg()));
    }
    let (d, h, m) = (secs / 86400, secs % 86400 / 3600, secs % 3600 / 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

fn table(out: &mut dyn Write, rep: &btrsend::backup::StatusReport) -> std::io::Result<()> {
    let rows: Vec<[String; 7]> = rep
        .origins
        .iter()
        .map(|o| {
            let state = match (o.healthy, o.stale) {
                (false, _) => "unhealthy",
                (true, true) => "stale",
                (true, false) => "ok",
            };
            [
                state.to_owned(),
                local_time(&o.newest.time),
                o.age_seconds.map_or_else(|| String::from("?"), age),
                o.entries.to_string(),
                iec(o.stored_bytes),
                printable(&o.newest.path).into_owned(),
                printable(&o.origin).into_owned(),
            ]
        })
        .collect();
    let head = ["state", "newest", "age", "stored", "size", "path", "origin"];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let [w0, w1, w2, w3, w4, w5, _] = width;
    for r in std::iter::once(head.map(String::from)).chain(rows) {
        writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:>w4$}  {:<w5$}  {}",
            r[0], r[1], r[2], r[3], r[4], r[5], r[6]
        )?;
    }
    if rep.origins.is_empty() {
        writeln!(out, "no snapshot stored")?;
    }
    for o in rep.origins.iter().filter_map(|o| o.problem.as_ref()) {
        writeln!(out, "problem: {}", printable(o))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages() {
        assert_eq!(super::age(40), "40s");
        assert_eq!(super::age(3 * 60), "3m");
        assert_eq!(super::age(2 * 3600 + 5 * 60), "2h 5m");
        assert_eq!(super::age(3 * 86400 + 4 * 3600 + 9), "3d 4h");
        assert_eq!(super::age(-40), "40s in the future");
        assert_eq!(super::age(i64::MIN), "106751991167300d 15h in the future");
    }
}
