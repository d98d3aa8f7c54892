//! `btrsend backup run`: its options, the run, and its summary (a JSON
//! line, or one line on a terminal) and exit status.
//!
//! Rendering while the run goes is [`crate::progress::backup`]'s and the
//! mapping of errors to exit statuses [`crate::exit`]'s; this module only
//! chooses among them.

use std::path::PathBuf;

use btrsend::backup::{self, RunOptions, SnapshotOptions};
use clap::Args;
use serde_json::json;

use super::config::{ConfigArg, Destination, Job, sources_agree};
use super::metrics::Metrics;
use super::target::TargetArg;
use super::{LockArg, MetricsArg, RepoArg};
use crate::exit::{Exit, ExitWith, exit_of, json_error, stored_or_failed};
use crate::progress::backup::BackupReporter;
use crate::text::iec;

/// Arguments of `btrsend backup run`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = RUN_HELP)]
pub struct RunArgs {
    #[command(flatten)]
    pub(super) repo: RepoArg,
    #[command(flatten)]
    pub(super) target: TargetArg,
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// A device or image file of the filesystem (repeat for multi-device
    /// filesystems). Without it, each SNAPSHOT is the path of a read-only
    /// snapshot in a mounted btrfs.
    #[arg(
        short = 'd',
        long = "device",
        value_name = "DEV",
        conflicts_with = "snapshot"
    )]
    devices: Vec<PathBuf>,
    /// Read a filesystem some of whose devices are missing from the
    /// remaining copies (RAID1, RAID10, DUP on the others; RAID5/6 from
    /// parity), as `mount -o degraded` does. Without it, a device the
    /// filesystem lists that is not given is an error naming its devid and
    /// uuid.
    #[arg(long)]
    degraded: bool,
    /// First take a read-only snapshot DIR/NAME.YYYY-MM-DDTHHMMSSZ (UTC) of
    /// the subvolume SUBVOL, a path in a mounted btrfs (as `btrfs subvolume
    /// snapshot -r` does; needs root), unless SUBVOL has not changed since
    /// its newest one, then store every snapshot of SUBVOL in DIR newer
    /// than the newest one stored (repeat for several subvolumes).
    #[arg(long = "snapshot", value_name = "SUBVOL")]
    snapshot: Vec<PathBuf>,
    /// Where --snapshot puts its snapshots: a directory on the same btrfs
    /// (DIR).
    #[arg(long = "snapshot-dir", value_name = "DIR")]
    snapshot_dir: Option<PathBuf>,
    /// After storing, delete the snapshots --snapshot took beyond the
    /// newest N (per subvolume); the newest stored one (the next
    /// incremental's parent), newer ones not stored yet and those another
    /// repository's hold names (DIR/.btrsend-holds) always stay, and a
    /// snapshot btrsend did not name is never deleted.
    #[arg(long = "keep-snapshots", value_name = "N")]
    keep_snapshots: Option<usize>,
    /// Make every N-th stream of a chain a full one (default 0: no limit by
    /// count; see --full-every-days).
    #[arg(long = "full-every", value_name = "N", conflicts_with = "target")]
    full_every: Option<u32>,
    /// Make a new full stream once the chain's full stream is D days older
    /// than the snapshot (entry times: the snapshots' creation times;
    /// within 12 hours, for a nightly job's drift). A chain ends only with
    /// a full stream and `backup forget` keeps every ancestor of a kept
    /// entry, so this is what lets retention free space: default 30, about
    /// one full stream per month --keep-monthly keeps; 0: never.
    #[arg(long = "full-every-days", value_name = "D", conflicts_with = "target")]
    full_every_days: Option<u32>,
    /// The zstd level of the stored streams (1-19, default 3).
    #[arg(long = "compression-level", value_name = "L", conflicts_with = "target",
          value_parser = clap::value_parser!(i32).range(1..=19))]
    level: Option<i32>,
    /// Write to the repository at most RATE bytes per second on average
    /// (stored bytes; with --target, stream bytes; K, M, G: times 1024,
    /// 1024², 1024³; e.g. 10M), so that a nightly job leaves room on an
    /// uplink. The progress bar's ETA
    /// follows the limit. S3 parts leave whole, at the link's speed, at
    /// the rate on average.
    #[arg(long = "limit-rate", value_name = "RATE", value_parser = crate::cmd::parse_rate)]
    pub(super) limit_rate: Option<u64>,
    /// Store nothing: print each stream the run would store (or, with
    /// --target, receive) with its exact raw size (as `btrfs send` would
    /// write it), the total, the free space of a local repository or
    /// target directory and, with --limit-rate, how long the
    /// transfer would take; take no snapshot (--snapshot: say which it
    /// would take), no lock, and write nothing (see DRY RUN below).
    #[arg(long = "dry-run", conflicts_with = "metrics_file")]
    dry_run: bool,
    /// Store even when a directory repository's (or a local target
    /// directory's) filesystem has less free space than the raw size of
    /// the streams (by default such a run is refused before anything is
    /// stored: zstd may not shrink them, nor a target's receive); for data
    /// known to compress well.
    #[arg(long = "no-space-check")]
    no_space_check: bool,
    /// Store the streams without indexing them (the index is what `backup
    /// ls`, `find`, `dump`, `diff`, `mount` and `restore --include`
    /// read; `backup index` builds what is missing later). By default each
    /// stream is indexed while it is stored, from the bytes being written.
    #[arg(long = "no-index", conflicts_with = "target")]
    no_index: bool,
    /// Print JSON Lines on standard output (message_type status, stored,
    /// then summary; a subvolume not snapshotted because it is unchanged
    /// is a status line with unchanged: true and newest_snapshot, counted
    /// in the summary's unchanged) and errors as JSON on standard error. A stream that
    /// continues an interrupted run's adds a status line with
    /// resumed_from_bytes (raw stream kept) and resumed_stored_bytes; every
    /// stored line has resumed_from_bytes and sent_bytes (the rest), and a
    /// full one full_reason: first, full_every, full_every_days,
    /// parent_gone (the parent's snapshot was deleted from the source) or
    /// chain_damaged. Warnings are status lines with a warning.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    lock: LockArg,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
    /// Raw bytes per zstd frame (for tests).
    #[arg(long = "frame-bytes", hide = true, value_name = "N")]
    frame_bytes: Option<usize>,
    /// The snapshots: with --device, paths from the top level as `btrsend
    /// list` prints them (a shell-style glob such as 'snaps/home.*' selects
    /// several) or id:N; without, paths of read-only snapshots in a mounted
    /// btrfs.
    #[arg(value_name = "SNAPSHOT")]
    pub(super) snapshots: Vec<String>,
}

impl RunArgs {
    /// These options for the destination `d` of the config file's job
    /// `job`: an option given on the command line wins over the file's
    /// key.
    pub(super) fn for_destination(&self, job: &Job, d: &Destination) -> RunArgs {
        let mut a = self.clone();
        a.repo = self.repo.for_destination(d);
        a.target = self.target.for_destination(d);
        if a.devices.is_empty() {
            a.devices.clone_from(&job.device.0);
        }
        a.degraded |= job.degraded;
        if a.snapshot.is_empty() {
            a.snapshot.clone_from(&job.snapshot.0);
        }
        if a.snapshot_dir.is_none() {
            a.snapshot_dir.clone_from(&job.snapshot_dir);
        }
        a.keep_snapshots = a.keep_snapshots.or(job.keep_snapshots);
        if a.snapshots.is_empty() {
            a.snapshots.clone_from(&job.snapshots.0);
        }
        a.full_every = a.full_every.or(d.full_every);
        a.full_every_days = a.full_every_days.or(d.full_every_days);
        a.level = a.level.or(d.compression_level.map(|l| l.0));
        a.limit_rate = a.limit_rate.or(d.limit_rate.map(|r| r.0));
        a.lock.retry_lock = a.lock.retry_lock.or(d.retry_lock.map(|r| r.0));
        a
    }
}

const RUN_HELP: &str = "\
Every selected snapshot not yet stored (same UUID and ctransid) is stored,
oldest first: as an incremental stream from the newest stored snapshot of
the same origin subvolume (the subvolume it was taken of) whose chain is
intact and which is still on the source, else as a full stream. A stream
becomes visible in the repository only once it is complete and durable:
a run that is killed leaves nothing half-written, and the next run
completes the work. In a directory repository it continues the stream
where the interrupted run stopped: the partial stream file in REPO/tmp/
(kept when a run is killed or fails) is checked frame by frame, cut back
to its last intact frame, and the rest of the stream is sent and appended,
if it is of the same snapshot and parent (else it is removed, with a
notice, and the stream sent again; see btrsend-repository(5)). In S3 the
parts of an unfinished upload cannot be read back: the run continues the
upload from what its marker in REPO/tmp/ recorded as the parts were stored.
An encrypted repository is continued the same way, with the write key
alone (the upload's payload key is kept sealed beside it until it is
complete). Silent on success unless standard error is a
terminal or --json is given. On a terminal a progress bar covers the whole
run: its total is the exact size of every stream the run stores (estimated
first from the snapshots' metadata, as `btrsend send --estimate` does), so
its ETA is the run's; it names the snapshot being stored and how many
there are ([2/5]).

With --snapshot the job takes its own snapshots (one cron line does
everything; needs root):
  btrsend backup run --repo /backup/home --snapshot /mnt/pool/home \
      --snapshot-dir /mnt/pool/snaps --keep-snapshots 7

Full streams: a chain ends only with a new full stream, and `backup forget`
keeps every ancestor of a kept entry, so without new full streams forget
frees nothing. A run stores a full stream when the chain's full one is 30
days older than the snapshot (--full-every-days; --full-every N also
counts streams), when the origin has none stored yet, or when the stored
snapshot its incremental stream needs was deleted from the source: then it
warns on standard error, cron or not.

Snapshot names: when DIR/NAME.TIME exists (two runs in one second), the
snapshot is named NAME.TIME_1, NAME.TIME_2, ... A subvolume that has not
changed since the newest snapshot btrsend took of it in DIR gets none (its
generation and ctransid, after a sync, are the snapshot's): the run stores
nothing new, and --json says unchanged.

Several repositories may store from one DIR (a local one and an S3 one):
each run records in DIR/.btrsend-holds/ID (ID: the repository's id, in
REPO/config) the snapshot its next incremental stream needs, and
--keep-snapshots of any of them never deletes a snapshot such a hold
names. Delete a repository's hold file to release what it holds (for a
repository no longer used: pruning warns about holds not updated for 30
days). A hold file that cannot be read is ignored with a warning.

A source snapshot that cannot be taken or deleted makes the exit status 3;
the other snapshots are stored all the same.

A local directory repository whose filesystem has less free space than the
raw size of the streams the run stores (zstd may not shrink them) is
refused before anything is stored, with exit status 1 and both figures
(--no-space-check stores all the same, for data known to compress).
Finding the sizes costs a pass over the snapshots' metadata, no file data.

TARGETS: with --target DIR or --target ssh://[USER@]HOST[:PORT]/DIR instead
of --repo, each selected snapshot the target does not have yet is received
into DIR (by btrsend receive here, or by btrsend serve on HOST) as DIR/NAME,
NAME the snapshot's own name: on btrfs as root a read-only subvolume with
the snapshot's UUID as its received UUID, exactly as btrfs receive leaves
it (so btrfs send -p and btrbk take it for their own), elsewhere a
directory with its record in DIR/.btrsend/. A snapshot is on the target
when a subvolume there received completely carries its UUID and ctransid.
Each stream is incremental from the newest snapshot of the same origin
that both sides have, else full (there are no chains on a target: every
received subvolume is whole). A run that is interrupted leaves DIR/NAME
partial with a resume point; the next run asks for its resume token and
sends only the rest of the stream (at most 48 MiB + 16 MiB again), or,
when the partial cannot be continued (no resume point yet, another parent),
removes it with a notice and sends the whole stream. A subvolume DIR/NAME
of another snapshot is an error for that snapshot, and is left alone.
The run holds the target directory's lock (flock(2) on DIR, taken by
btrsend serve for an ssh:// target; forget --target takes it too;
--retry-lock waits for it, else exit status 11).
--snapshot, --snapshot-dir and --keep-snapshots work as for a repository:
the hold record in DIR/.btrsend-holds/ names the newest snapshot the target
has, which --keep-snapshots never deletes. With --json: a received line
per snapshot (snapshot, name, uuid, ctransid, kind, parent, sent_bytes,
resumed_from_bytes: where a continued receive's resume point was, else
null), then a summary (received, already_received, failed, sent_bytes and
the --snapshot counts). The repository's options (--full-every*,
--compression-level, --limit-rate, --no-index, --no-space-check,
--dry-run) do not apply.

  btrsend backup run --target ssh://backup@nas.example/backup/host1 \
      --snapshot /mnt/pool/home --snapshot-dir /mnt/pool/snaps --keep-snapshots 7
  btrsend backup forget --target /backup/host1 --keep-daily 14   # on the backup host

DRY RUN: --dry-run plans as the run would (the same snapshots, parents and
full streams) and prints, for each stream, \"would store PATH: full|
incremental from PARENT, N bytes of raw stream\", then the total. The raw
figures are exact: the bytes `btrfs send` writes for the stream. What the
repository would store is unknown until compressed (smaller by zstd's
ratio, a little larger for incompressible data or encryption). With
--limit-rate it says how long the transfer would take at most (the limit
counts stored bytes). A local repository without room for the raw total
is refused as a run would be (exit 1, after the plan). With --target, the
plan is of the streams the target would receive (\"would receive PATH:
...\", incremental from the newest older snapshot of the same origin the
target has or receives first), already_received status lines name what
it has, and a local target directory without room for the raw total is
refused, by a real run too, before anything is received (an ssh:// target
is not asked for its free space). With --json: one
line per stream (message_type dry_run, with snapshot, uuid, ctransid,
kind, parent, parent_id, full_reason and stream_bytes), already_stored and
would_take status lines, then a dry_run_total line (streams,
stream_bytes, stored_bytes: null, free_bytes, limit_rate,
seconds_at_limit_rate). Exit status 3 (1 when no stream could be sized)
when a snapshot cannot be sized.";

/// The run the options describe.
fn run_options(a: &RunArgs) -> RunOptions {
    let mut opts = RunOptions::new()
        .with_devices(a.devices.clone())
        .with_degraded(a.degraded)
        .with_full_every(a.full_every.unwrap_or(0))
        .with_full_every_days(
            a.full_every_days
                .unwrap_or(backup::plan::DEFAULT_FULL_EVERY_DAYS),
        )
        .with_level(a.level.unwrap_or(3))
        .with_wait_lock(a.lock.wait())
        .with_space_check(!a.no_space_check)
        .with_index(!a.no_index)
        .with_target_rate(a.target.target.as_ref().and(a.limit_rate));
    if let Some(n) = a.frame_bytes {
        opts = opts.with_frame_bytes(n.max(1));
    }
    if let Some(dir) = &a.snapshot_dir {
        opts = opts.with_snapshots(SnapshotOptions {
            subvols: a.snapshot.clone(),
            dir: dir.clone(),
            keep: a.keep_snapshots,
        });
    }
    opts
}

/// The snapshots given agree with --device and --snapshot: a usage error
/// otherwise.
fn check_sources(a: &RunArgs) -> anyhow::Result<()> {
    sources_agree(
        &a.snapshots,
        &a.devices,
        &a.snapshot,
        a.snapshot_dir.is_some(),
        a.keep_snapshots.is_some(),
        true,
    )
    .map_err(|e| anyhow::Error::new(crate::exit::UsageError(e)))
}

/// Run `btrsend backup run`.
pub fn run(a: &RunArgs, m: &mut Metrics) -> anyhow::Result<()> {
    if let Some(target) = &a.target.target {
        if a.dry_run {
            return super::dry_run::run_target(a, target, run_options(a))
                .map_err(|e| json_error(a.json, e));
        }
        return run_target(a, target, m).map_err(|e| json_error(a.json, e));
    }
    if a.dry_run {
        return super::dry_run::run(a, &a.repo, run_options(a)).map_err(|e| json_error(a.json, e));
    }
    let go = |m: &mut Metrics| -> anyhow::Result<()> {
        check_sources(a)?;
        let repo = a.repo.open_limited(a.limit_rate)?;
        let opts = run_options(a);
        let progress = BackupReporter::new(a.json, "computing the streams' sizes");
        let start = jiff::Timestamp::now();
        let clock = std::time::Instant::now();
        let report = repo.run(&a.snapshots, &opts, &progress);
        progress.finish();
        let report = report?;
        let elapsed = clock.elapsed();
        let stream_bytes: u64 = report.stored.iter().map(|e| e.stream_bytes).sum();
        let stored_bytes: u64 = report.stored.iter().map(|e| e.stored_bytes).sum();
        let sent_bytes = stream_bytes.saturating_sub(progress.kept());
        m.int(
            "btrsend_sent_bytes",
            "Bytes of raw send stream the run sent (not counting what it continued).",
            None,
            sent_bytes,
        );
        let mut per_origin: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
        for e in &report.stored {
            let o = per_origin.entry(e.origin.as_str()).or_default();
            o.0 += 1;
            o.1 += e.stored_bytes;
        }
        for (origin, (n, bytes)) in per_origin {
            m.int(
                "btrsend_streams_stored",
                "Streams the run stored for the origin.",
                Some(origin),
                n,
            );
            m.int(
                "btrsend_stored_bytes",
                "Bytes of stream files the run stored for the origin.",
                Some(origin),
                bytes,
            );
        }
        m.catalog(&repo);
        if a.json {
            // The repository's size after the run: what its catalog's
            // entries store (null when the catalog cannot be read again).
            let repository_bytes = repo
                .list()
                .ok()
                .map(|es| es.iter().map(|e| e.stored_bytes).sum::<u64>());
            progress.line(json!({
                "message_type": "summary",
                "start": start.to_string(),
                "end": jiff::Timestamp::now().to_string(),
                "duration_seconds": elapsed.as_secs_f64(),
                "stored": report.stored.len(),
                "already_stored": report.skipped.len(),
                "failed": report.failed.len(),
                "snapshots_taken": report.taken.len(),
                "unchanged": report.unchanged.len(),
                "snapshots_deleted": report.pruned.len(),
                "snapshot_failures": report.snapshot_failed.len(),
                "stream_bytes": stream_bytes,
                "sent_bytes": sent_bytes,
                "stored_bytes": stored_bytes,
                "repository_bytes": repository_bytes,
            }));
        } else if progress.has_bar() {
            // On a terminal (never in cron): one line saying what was done.
            let mut line = format!(
                "btrsend: stored {} of {} snapshots: {} of stream sent, {} stored, in {}",
                report.stored.len(),
                report.stored.len() + report.skipped.len() + report.failed.len(),
                iec(sent_bytes),
                iec(stored_bytes),
                indicatif::HumanDuration(elapsed)
            );
            if !report.skipped.is_empty() {
                line.push_str(&format!("; {} stored before", report.skipped.len()));
            }
            if !report.failed.is_empty() {
                line.push_str(&format!("; {} failed", report.failed.len()));
            }
            eprintln!("{line}");
        }
        if !report.snapshot_failed.is_empty()
            && (report.failed.is_empty() || !report.stored.is_empty())
        {
            // A source snapshot not taken or not deleted: the others
            // proceeded.
            let n = report.snapshot_failed.len() + report.failed.len();
            return Err(anyhow::Error::new(ExitWith::quiet(Exit::Partial))
                .context(format!("{n} failed, {} stored", report.stored.len())));
        }
        if report.failed.len() == 1 && report.stored.is_empty() {
            // One snapshot, one error: its exit code.
            if let Some((_, e)) = report.failed.first() {
                return Err(anyhow::Error::new(ExitWith::quiet(exit_of(e))));
            }
        }
        stored_or_failed(report.stored.len(), report.failed.len(), "snapshots")
    };
    go(m).map_err(|e| json_error(a.json, e))
}

/// `backup run --target`: receive the snapshots into a target directory,
/// here or over ssh.
fn run_target(a: &RunArgs, target: &str, m: &mut Metrics) -> anyhow::Result<()> {
    check_sources(a)?;
    let mut end = backup::target::open(target, &a.repo.ssh_options())?;
    let opts = run_options(a);
    let progress = BackupReporter::new(a.json, "listing the target");
    let start = jiff::Timestamp::now();
    let clock = std::time::Instant::now();
    let holder_id = backup::target::hold_id(target);
    let report = backup::target::run(
        end.as_mut(),
        (&holder_id, target),
        &a.snapshots,
        &opts,
        &progress,
    );
    progress.finish();
    let report = report?;
    let elapsed = clock.elapsed();
    let sent_bytes: u64 = report.received.iter().map(|r| r.sent_bytes).sum();
    m.int(
        "btrsend_sent_bytes",
        "Bytes of raw send stream the run sent (not counting what it continued).",
        None,
        sent_bytes,
    );
    if a.json {
        for r in &report.received {
            progress.line(json!({
                "message_type": "received",
                "snapshot": r.path,
                "name": r.name,
                "uuid": r.uuid,
                "ctransid": r.ctransid,
                "kind": r.kind.as_str(),
                "parent": r.parent,
                "sent_bytes": r.sent_bytes,
                "resumed_from_bytes": r.resumed_from,
            }));
        }
        progress.line(json!({
            "message_type": "summary",
            "start": start.to_string(),
            "end": jiff::Timestamp::now().to_string(),
            "duration_seconds": elapsed.as_secs_f64(),
            "received": report.received.len(),
            "already_received": report.skipped.len(),
            "failed": report.failed.len(),
            "snapshots_taken": report.source.taken.len(),
            "unchanged": report.source.unchanged.len(),
            "snapshots_deleted": report.source.pruned.len(),
            "snapshot_failures": report.source.snapshot_failed.len(),
            "sent_bytes": sent_bytes,
        }));
    } else if progress.has_bar() {
        eprintln!(
            "btrsend: received {} of {} snapshots into {}: {} of stream sent, in {}",
            report.received.len(),
            report.received.len() + report.skipped.len() + report.failed.len(),
            crate::text::printable(target),
            iec(sent_bytes),
            indicatif::HumanDuration(elapsed)
        );
    }
    let failed = report.failed.len() + report.source.snapshot_failed.len();
    if !report.source.snapshot_failed.is_empty()
        && (report.failed.is_empty() || !report.received.is_empty())
    {
        return Err(
            anyhow::Error::new(ExitWith::quiet(Exit::Partial)).context(format!(
                "{failed} failed, {} received",
                report.received.len()
            )),
        );
    }
    if report.failed.len() == 1
        && report.received.is_empty()
        && let Some((_, e)) = report.failed.first()
    {
        return Err(anyhow::Error::new(ExitWith::quiet(exit_of(e))));
    }
    stored_or_failed(report.received.len(), report.failed.len(), "snapshots")
}
