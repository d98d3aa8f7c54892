//! `btrsend backup repair`: its options, the repair (the core's
//! [`Repository::repair`](btrsend::backup::Repository::repair)), its
//! report and exit status.

use std::io::Write;
use std::path::PathBuf;

use btrsend::backup::{RepairOptions, SourceOptions};
use clap::Args;

use super::compare::open_from;
use super::config::{ConfigArg, Destination, Job};
use super::metrics::Metrics;
use super::secrets::FromKeyArgs;
use super::{LockArg, MetricsArg, RepoArg};
use crate::exit::{Exit, ExitWith, json_error};
use crate::progress::backup::BackupReporter;
use crate::text::printable;

/// Arguments of `btrsend backup repair`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = REPAIR_HELP)]
pub struct RepairArgs {
    #[command(flatten)]
    pub(super) repo: RepoArg,
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// A device or image file of the source filesystem, mounted or not
    /// (repeat for multi-device filesystems): damaged streams whose
    /// snapshot (and parent's snapshot) are still there are sent again.
    /// With --config, each job's device (and degraded) unless given.
    #[arg(short = 'd', long = "device", value_name = "DEV")]
    devices: Vec<PathBuf>,
    /// Read a source filesystem some of whose devices are missing from the
    /// remaining copies, as `mount -o degraded` does.
    #[arg(long, requires = "devices")]
    degraded: bool,
    /// Take damaged streams from this second repository (a directory or
    /// s3://BUCKET[/PREFIX], opened with the --from-* secrets) when its
    /// entry for the same snapshot records the same stream.
    #[arg(long = "from", value_name = "R2")]
    from: Option<String>,
    #[command(flatten)]
    from_keys: FromKeyArgs,
    /// The zstd level of the stream files written (1-19, default 3).
    #[arg(long = "compression-level", value_name = "L", default_value_t = 3,
          value_parser = clap::value_parser!(i32).range(1..=19))]
    level: i32,
    /// Print the report as JSON.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    lock: LockArg,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
    /// The entries to repair, as restore names them (id, uuid, path,
    /// latest...); default: every damaged one.
    #[arg(value_name = "SNAPSHOT")]
    snapshots: Vec<String>,
}

const REPAIR_HELP: &str = "\
Reads every stored byte (as verify --read-data) and stores again each
stream file that is missing or damaged: sent again from the source
(--device) when the entry's snapshot, and the snapshot of its parent
entry, are still there, else taken from a second repository (--from)
whose entry for the same snapshot records the same stream. The new file
is kept only when its raw stream hashes to the BLAKE3 the catalog
records: the repaired repository holds the very bytes it held. It gets a
new name; the catalog is switched to it in one new generation, then the
damaged file is deleted. Takes the repository's exclusive lock (and the
shared lock of --from). With --config FILE, every repository of the
file's jobs (or those --job names) is repaired, each from its job's
device unless --device is given; targets are left out.

Exit status: 0 when nothing is left damaged (or nothing was), 12 when
some stream could not be repaired, else that of the failure (1; 10, 11,
13 as for run).";

impl RepairArgs {
    /// These options for the config file's destination `d` of `job` (the
    /// command line wins).
    pub(super) fn for_destination(&self, job: &Job, d: &Destination) -> RepairArgs {
        let mut a = self.clone();
        a.repo = self.repo.for_destination(d);
        job.source_unless_given(&mut a.devices, &mut a.degraded);
        a.lock.retry_lock = a.lock.retry_lock.or(d.retry_lock.map(|r| r.0));
        a
    }
}

/// Run `btrsend backup repair`; its counts go to the metrics `m`.
pub fn run(a: &RepairArgs, m: &mut Metrics) -> anyhow::Result<()> {
    let mut go = || -> anyhow::Result<()> {
        let repo = a.repo.open()?;
        let from = a
            .from
            .as_deref()
            .map(|f| open_from(f, &a.from_keys, None))
            .transpose()?;
        let mut opts = RepairOptions::new().with_wait_lock(a.lock.wait());
        opts.level = a.level;
        if !a.devices.is_empty() {
            opts =
                opts.with_source(SourceOptions::new(a.devices.clone()).with_degraded(a.degraded));
        }
        let progress = BackupReporter::bar(!a.json, "");
        let rep = repo.repair(from.as_ref(), &a.snapshots, &opts, &progress);
        progress.finish();
        let rep = rep?;
        m.int(
            "btrsend_repair_damaged",
            "Damaged or missing stream files repair found.",
            None,
            rep.damaged as u64,
        );
        m.int(
            "btrsend_repair_repaired",
            "Stream files repair stored again, byte-identical.",
            None,
            rep.repaired.len() as u64,
        );
        m.int(
            "btrsend_repair_failed",
            "Damaged stream files repair could not store again.",
            None,
            rep.failed.len() as u64,
        );
        m.catalog(&repo);
        if a.json {
            let v = crate::exit::with_json_context(serde_json::to_value(&rep)?);
            writeln!(
                crate::exit::stdout(),
                "{}",
                serde_json::to_string_pretty(&v)?
            )?;
        } else {
            for w in &rep.warnings {
                eprintln!("btrsend: warning: {}", printable(w));
            }
            let mut out = crate::exit::stdout();
            for r in &rep.repaired {
                writeln!(
                    out,
                    "entry {} ({}): repaired from {}: {}",
                    r.entry,
                    printable(&r.path),
                    printable(&r.from),
                    printable(&r.file)
                )?;
            }
            for f in &rep.failed {
                writeln!(
                    out,
                    "entry {} ({}): NOT repaired: {}",
                    f.entry,
                    printable(&f.path),
                    printable(&f.why)
                )?;
            }
            writeln!(
                out,
                "{} damaged stream files, {} repaired",
                rep.damaged,
                rep.repaired.len()
            )?;
        }
        if rep.failed.is_empty() {
            return Ok(());
        }
        let msg = format!(
            "repair: {} of {} damaged stream files in {} could not be repaired",
            rep.failed.len(),
            rep.damaged,
            repo.store().name()
        );
        Err(anyhow::Error::new(ExitWith::new(Exit::Damage, msg)))
    };
    go().map_err(|e| json_error(a.json, e))
}
