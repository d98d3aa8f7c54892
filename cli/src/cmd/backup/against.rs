//! `btrsend backup verify --against-source`: one line per stored entry
//! (or the report as JSON), and exit status 12 when any differs.
//!
//! It renders what the core found; it compares nothing itself.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use btrsend::backup::{Comparison, Outcome, Repository, SourceOptions};

use super::metrics::Metrics;
use crate::exit::{Exit, ExitWith};
use crate::progress::backup::BackupReporter;
use crate::text::printable;

/// Run `verify --against-source` on `repo` with the source on `devices`;
/// its counts go to the metrics `m`.
pub(super) fn run(
    repo: &Repository,
    devices: &[PathBuf],
    degraded: bool,
    wait: Duration,
    json: bool,
    m: &mut Metrics,
) -> anyhow::Result<()> {
    let opts = SourceOptions::new(devices.to_vec())
        .with_degraded(degraded)
        .with_wait_lock(wait);
    let start = jiff::Timestamp::now();
    let progress = BackupReporter::bar(!json, "");
    let rep = repo.verify_against_source(&opts, &progress);
    progress.finish();
    let rep = rep?;
    let differs = rep.count(Outcome::Differs);
    // A snapshot that differs from its source is damage, as verify counts
    // it; the three outcomes say what was proven.
    m.int(
        "btrsend_verify_problems",
        "Problems verify found (0: no damage).",
        None,
        differs as u64,
    );
    for (name, help, outcome) in [
        (
            "btrsend_verify_against_source_proven",
            "Stored snapshots verify --against-source proved equal to the source.",
            Outcome::Proven,
        ),
        (
            "btrsend_verify_against_source_differing",
            "Stored snapshots verify --against-source found to differ from the source.",
            Outcome::Differs,
        ),
        (
            "btrsend_verify_against_source_skipped",
            "Stored snapshots verify --against-source skipped (snapshot or parent gone from the source).",
            Outcome::Skipped,
        ),
    ] {
        m.int(name, help, None, rep.count(outcome) as u64);
    }
    m.catalog(repo);
    if json {
        let mut v = crate::exit::with_json_context(serde_json::to_value(&rep)?);
        if let Some(o) = v.as_object_mut() {
            o.insert("start".into(), start.to_string().into());
            o.insert("end".into(), jiff::Timestamp::now().to_string().into());
            o.insert("proven".into(), rep.count(Outcome::Proven).into());
            o.insert("differs".into(), differs.into());
            o.insert("skipped".into(), rep.count(Outcome::Skipped).into());
        }
        writeln!(
            crate::exit::stdout(),
            "{}",
            serde_json::to_string_pretty(&v)?
        )?;
    } else {
        let mut out = crate::exit::stdout();
        for c in &rep.checks {
            let how = match (c.outcome, c.comparison) {
                (Outcome::Proven, Some(Comparison::Stream)) => "proven: the stream is identical",
                (Outcome::Proven, _) => "proven: the content is identical (the stream differs)",
                (Outcome::Differs, Some(Comparison::Content)) => "DIFFERS: the content differs",
                (Outcome::Differs, _) => "DIFFERS: the stream differs",
                (Outcome::Skipped, _) => "skipped",
            };
            write!(out, "entry {} ({}): {how}", c.entry, printable(&c.path))?;
            match &c.detail {
                Some(d) => writeln!(out, ": {}", printable(d))?,
                None => writeln!(out)?,
            }
        }
        writeln!(
            out,
            "{} of {} stored snapshots proven equal to the source, {differs} differ, {} skipped",
            rep.count(Outcome::Proven),
            rep.entries,
            rep.count(Outcome::Skipped)
        )?;
    }
    if differs == 0 {
        return Ok(());
    }
    let msg = format!(
        "verify --against-source: {differs} of {} stored snapshots in {} differ from the source",
        rep.entries,
        repo.store().name()
    );
    Err(anyhow::Error::new(ExitWith::new(Exit::Damage, msg)))
}
