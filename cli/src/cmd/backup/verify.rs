//! `btrsend backup verify`: its report on standard error (or as JSON), and
//! exit status 12 for damage.
//!
//! It renders what the core found; it never checks anything itself.

use std::io::Write;

use clap::Args;

use super::config::{ConfigArg, Destination, Job};
use super::metrics::Metrics;
use super::secrets::FromKeyArgs;
use super::{LockArg, MetricsArg, RepoArg};
use crate::exit::{Exit, ExitWith};
use crate::progress::backup::BackupReporter;
use crate::text::{iec, printable};

/// Arguments of `btrsend backup verify`.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub(super) repo: RepoArg,
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Also read every stored byte: every frame's BLAKE3, every command's
    /// CRC, every stream's BLAKE3 (under the shared lock, so that no
    /// forget deletes what is being read; without --read-data verify takes
    /// no lock and never waits for a run).
    #[arg(long = "read-data")]
    read_data: bool,
    /// Instead, check that the repositories R1 and R2 agree, from their
    /// catalogs alone (no stream read): every snapshot both store must
    /// record the same stream (kind, parent, raw size, BLAKE3 of the raw
    /// stream, commands, protocol; stored sizes differ with compression
    /// and keys), else exit status 12, unless one of them is a synthetic
    /// full stream (listed as another stream, not damage); entries only in
    /// one are listed. R1
    /// opens with the --from-* secrets, R2 with the others (as copy --from
    /// R1 --to R2).
    #[arg(
        long = "compare",
        num_args = 2,
        value_names = ["R1", "R2"],
        conflicts_with_all = ["read_data", "repo"]
    )]
    compare: Vec<String>,
    #[command(flatten)]
    from_keys: FromKeyArgs,
    /// Instead, prove each stored snapshot still on the source (--device)
    /// equal to it: its stream is sent again as `run` sent it (same
    /// parent, same protocol) and only hashed, and its length and BLAKE3
    /// compared with the catalog's, reading nothing of the repository but
    /// the catalog. Where the stream differs (a balance since may change
    /// clone choices), the snapshot's manifest is compared with that of
    /// the entry's index (which reads its data from the repository).
    /// Entries whose snapshot or parent's snapshot is gone are skipped.
    /// Exit status 12 when any differs. With --config, each job's device
    /// (and degraded) is its source unless --device is given.
    #[arg(
        long = "against-source",
        conflicts_with_all = ["read_data", "compare"]
    )]
    against_source: bool,
    /// With --against-source: a device or image file of the source
    /// filesystem, mounted or not (repeat for multi-device filesystems;
    /// needed unless a config file's job gives its device).
    #[arg(
        short = 'd',
        long = "device",
        value_name = "DEV",
        requires = "against_source"
    )]
    devices: Vec<std::path::PathBuf>,
    /// With --against-source: read a source filesystem some of whose
    /// devices are missing from the remaining copies, as `mount -o
    /// degraded` does.
    #[arg(long, requires = "against_source")]
    degraded: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    lock: LockArg,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
}

impl VerifyArgs {
    /// These options for the config file's destination `d` of `job` (the
    /// command line wins).
    pub(super) fn for_destination(&self, job: &Job, d: &Destination) -> VerifyArgs {
        let mut a = self.clone();
        a.repo = self.repo.for_destination(d);
        job.source_unless_given(&mut a.devices, &mut a.degraded);
        a.read_data |= d.read_data.unwrap_or(false);
        a.lock.retry_lock = a.lock.retry_lock.or(d.retry_lock.map(|r| r.0));
        a
    }
}

/// Run `btrsend backup verify`.
pub fn run(a: &VerifyArgs, m: &mut Metrics) -> anyhow::Result<()> {
    if let [first, second] = a.compare.as_slice() {
        return super::compare::run(first, second, &a.from_keys, a.repo.keys(), a.json);
    }
    if a.against_source && a.devices.is_empty() {
        return Err(anyhow::Error::new(crate::exit::UsageError(String::from(
            "--against-source needs the source: --device DEV (with --config: the job's device key)",
        ))));
    }
    let repo = a.repo.open()?;
    if a.against_source {
        return super::against::run(&repo, &a.devices, a.degraded, a.lock.wait(), a.json, m);
    }
    let start = jiff::Timestamp::now();
    let clock = std::time::Instant::now();
    // A bar only for the long form (every byte read).
    let progress = BackupReporter::bar(a.read_data && !a.json, "");
    let rep = repo.verify(a.read_data, a.lock.wait(), &progress);
    progress.finish();
    let rep = rep?;
    m.int(
        "btrsend_verify_problems",
        "Problems verify found (0: no damage).",
        None,
        rep.problems.len() as u64,
    );
    m.int(
        "btrsend_verify_unrestorable_snapshots",
        "Stored snapshots the damage verify found makes unrestorable.",
        None,
        rep.unrestorable.len() as u64,
    );
    m.int(
        "btrsend_verify_read_bytes",
        "Stored bytes verify read (with --read-data).",
        None,
        rep.bytes_read,
    );
    m.catalog(&repo);
    if a.json {
        let mut v = crate::exit::with_json_context(serde_json::to_value(&rep)?);
        if let Some(o) = v.as_object_mut() {
            o.insert("start".into(), start.to_string().into());
            o.insert("end".into(), jiff::Timestamp::now().to_string().into());
            o.insert(
                "duration_seconds".into(),
                clock.elapsed().as_secs_f64().into(),
            );
            o.insert("read_data".into(), a.read_data.into());
        }
        writeln!(
            crate::exit::stdout(),
            "{}",
            serde_json::to_string_pretty(&v)?
        )?;
    } else {
        for n in &rep.notices {
            eprintln!("btrsend: notice: {}", printable(n));
        }
        for p in &rep.problems {
            eprintln!("btrsend: damage: {}", printable(&p.message));
        }
        for (id, path) in &rep.unrestorable {
            eprintln!("btrsend: unrestorable: entry {id} ({})", printable(path));
        }
        if rep.problems.iter().any(|p| p.entry.is_some()) {
            eprintln!(
                "btrsend: hint: `btrsend backup repair --repo {} --device DEV` stores a damaged or missing stream file again, byte-identical, while its snapshot and its parent's are on the source; `--from R2` takes it from another repository that holds it",
                printable(repo.store().name())
            );
        }
    }
    if rep.problems.is_empty() {
        if !a.json {
            let what = if a.read_data {
                format!(
                    "the catalog, every chain and every byte ({} read)",
                    iec(rep.bytes_read)
                )
            } else {
                String::from(
                    "the catalog, every chain, and each stream file's size, trailer and first command (--read-data reads every byte)",
                )
            };
            writeln!(
                crate::exit::stdout(),
                "verified {} stored snapshot{} in {}: {what}; no damage found",
                rep.entries,
                if rep.entries == 1 { "" } else { "s" },
                printable(repo.store().name())
            )?;
        }
        Ok(())
    } else {
        let msg = format!(
            "verify found damage in {}: {} problems, {} of {} stored snapshots cannot be restored",
            repo.store().name(),
            rep.problems.len(),
            rep.unrestorable.len(),
            rep.entries
        );
        Err(anyhow::Error::new(ExitWith::new(Exit::Damage, msg)))
    }
}
