//! `btrsend backup`: parsing and rendering for the backup repository (core
//! `btrsend::backup`): init, run, list, verify, restore, import.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use btrsend::backup::{
    self, BackupError, Entry, ImportOptions, Kind, Progress, Repository, RestoreTarget, RunOptions,
    SnapshotOptions,
};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::exit::{Exit, ExitWith};
use crate::text::{error_text_of, iec, local_time, printable};

/// Arguments of `btrsend backup`.
#[derive(Debug, Args)]
#[command(after_long_help = BACKUP_HELP)]
pub struct BackupArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: BackupCommand,
}

const BACKUP_HELP: &str = "\
A repository is a directory, or s3://BUCKET[/PREFIX] in an S3-compatible
object store (AWS, MinIO, Ceph RGW, Garage...). --repo falls back to the
environment variable BTRSEND_REPOSITORY.

S3 settings are found as the AWS tools find them. Credentials:
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), else
the profile AWS_PROFILE (default: default) in ~/.aws/credentials
(AWS_SHARED_CREDENTIALS_FILE) or ~/.aws/config (AWS_CONFIG_FILE); web
identity and container credentials when their AWS_* variables are set;
the instance metadata service only with BTRSEND_S3_INSTANCE_METADATA=1.
Profiles with role_arn, credential_process or sso_* are not supported.
Region: AWS_REGION, AWS_DEFAULT_REGION or the profile's region (default
us-east-1). Endpoint: AWS_ENDPOINT_URL (an http:// endpoint is allowed)
or the profile's endpoint_url (default: AWS). A request that cannot
connect, is cut or gets a 5xx answer is retried for 120 seconds, so a
network blip of a minute passes; BTRSEND_S3_RETRY_TIMEOUT sets how long
(e.g. 30s, 5m; at most 10m; 0: no retry). Every upload carries its
x-amz-checksum-sha256, as buckets with Object Lock require. A missing
bucket or a server unreachable after the retries is exit status 10; no
credentials, or a key or secret the server refuses, is 1.

Each stored stream is a zstd file whose frames hold the raw btrfs send
stream: `zstd -dc FILE | btrfs receive DIR` restores it without btrsend
(full stream first, then each incremental of the chain, as `btrsend
backup list` shows them). The layout is described in btrsend-repository(5).

Nightly, from cron or the systemd units in contrib/: `backup run` (with
--snapshot to take and prune the source snapshots too), then `backup
forget`; silent on success. The crontab lines are in the EXAMPLES of
btrsend-backup(1) and in the README.

Exit status:
  0    success
  1    error
  2    usage error
  3    some snapshots were stored and some failed, or a source snapshot
       could not be taken or deleted
  10   repository missing or unreachable
  11   the repository's lock is held (see --retry-lock)
  12   verify found damage
  130  interrupted";

/// The repository option every subcommand takes.
#[derive(Debug, Args)]
pub struct RepoArg {
    /// The repository directory (default: the environment variable
    /// BTRSEND_REPOSITORY).
    #[arg(long = "repo", value_name = "REPO")]
    pub repo: Option<String>,
}

impl RepoArg {
    pub(crate) fn spec(&self) -> anyhow::Result<String> {
        match &self.repo {
            Some(r) => Ok(r.clone()),
            None => match std::env::var(backup::REPO_ENV) {
                Ok(r) if !r.is_empty() => Ok(r),
                // A missing option: a usage error (exit 2).
                _ => Err(anyhow::Error::new(crate::exit::UsageError(format!(
                    "no repository given: use --repo REPO or set {}",
                    backup::REPO_ENV
                )))),
            },
        }
    }
}

/// Waiting for a held lock.
#[derive(Debug, Args)]
pub struct LockArg {
    /// Wait up to DURATION for a lock another btrsend holds (e.g. 30s, 10m,
    /// 1h; default 0: fail at once with exit status 11).
    #[arg(long = "retry-lock", value_name = "DURATION", value_parser = parse_duration, default_value = "0")]
    pub retry_lock: Duration,
}

/// `30`, `30s`, `10m`, `2h`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s}: not a duration (e.g. 30s, 10m, 2h)"))?;
    Ok(Duration::from_secs(n.saturating_mul(mult)))
}

/// The subcommands of `btrsend backup`.
#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Make a new, empty repository.
    Init(InitArgs),
    /// Store snapshots: each one not yet stored, incremental when a
    /// parent is stored and still on the source.
    Run(RunArgs),
    /// List the stored streams.
    List(ListArgs),
    /// Check the repository: the catalog, every file and chain, and with
    /// --read-data every byte.
    Verify(VerifyArgs),
    /// Restore a stored snapshot: its whole chain, into a directory or to
    /// standard output.
    Restore(RestoreArgs),
    /// Store existing send-stream files (raw or zstd) as repository
    /// entries.
    Import(ImportArgs),
    /// Delete old entries by a retention policy (restic's --keep-*
    /// options), never one a kept entry's chain needs.
    Forget(super::forget::ForgetArgs),
}

/// Arguments of `btrsend backup init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    repo: RepoArg,
}

/// Arguments of `btrsend backup run`.
#[derive(Debug, Args)]
#[command(after_long_help = RUN_HELP)]
pub struct RunArgs {
    #[command(flatten)]
    repo: RepoArg,
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
    #[arg(long = "snapshot", value_name = "SUBVOL", requires = "snapshot_dir")]
    snapshot: Vec<PathBuf>,
    /// Where --snapshot puts its snapshots: a directory on the same btrfs
    /// (DIR).
    #[arg(long = "snapshot-dir", value_name = "DIR", requires = "snapshot")]
    snapshot_dir: Option<PathBuf>,
    /// After storing, delete the snapshots --snapshot took beyond the
    /// newest N (per subvolume); the newest stored one (the next
    /// incremental's parent), newer ones not stored yet and those another
    /// repository's hold names (DIR/.btrsend-holds) always stay, and a
    /// snapshot btrsend did not name is never deleted.
    #[arg(long = "keep-snapshots", value_name = "N", requires = "snapshot")]
    keep_snapshots: Option<usize>,
    /// Make every N-th stream of a chain a full one (default 0: no limit by
    /// count; see --full-every-days).
    #[arg(long = "full-every", value_name = "N", default_value_t = 0)]
    full_every: u32,
    /// Make a new full stream once the chain's full stream is D days older
    /// than the snapshot (entry times: the snapshots' creation times;
    /// within 12 hours, for a nightly job's drift). A chain ends only with
    /// a full stream and `backup forget` keeps every ancestor of a kept
    /// entry, so this is what lets retention free space: default 30, about
    /// one full stream per month --keep-monthly keeps; 0: never.
    #[arg(long = "full-every-days", value_name = "D", default_value_t = backup::plan::DEFAULT_FULL_EVERY_DAYS)]
    full_every_days: u32,
    /// The zstd level of the stored streams (1-19, default 3).
    #[arg(long = "compression-level", value_name = "L", default_value_t = 3,
          value_parser = clap::value_parser!(i32).range(1..=19))]
    level: i32,
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
    json: bool,
    #[command(flatten)]
    lock: LockArg,
    /// Raw bytes per zstd frame (for tests).
    #[arg(long = "frame-bytes", hide = true, value_name = "N")]
    frame_bytes: Option<usize>,
    /// The snapshots: with --device, paths from the top level as `btrsend
    /// list` prints them (a shell-style glob such as 'snaps/home.*' selects
    /// several) or id:N; without, paths of read-only snapshots in a mounted
    /// btrfs.
    #[arg(value_name = "SNAPSHOT", required_unless_present = "snapshot")]
    snapshots: Vec<String>,
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
Silent on success unless standard error is a
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
the other snapshots are stored all the same.";

/// Arguments of `btrsend backup list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Print a JSON array, one object per stored stream (id, path, uuid,
    /// ctransid, parent_uuid, parent_id, kind, time, origin, stream_bytes,
    /// stored_bytes, …; times in UTC, sizes in bytes). Without it, a table
    /// with times in the local time zone and sizes in IEC units (KiB,
    /// MiB, GiB).
    #[arg(long)]
    json: bool,
    /// Accepted for scripts written for older versions: `list` takes no
    /// lock (it reads the newest catalog, which is replaced atomically), so
    /// it never waits.
    #[arg(long = "retry-lock", value_name = "DURATION", value_parser = parse_duration, hide = true)]
    _retry_lock: Option<Duration>,
}

/// Arguments of `btrsend backup verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Also read every stored byte: every frame's BLAKE3, every command's
    /// CRC, every stream's BLAKE3 (under the shared lock, so that no
    /// forget deletes what is being read; without --read-data verify takes
    /// no lock and never waits for a run).
    #[arg(long = "read-data")]
    read_data: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    lock: LockArg,
}

/// Arguments of `btrsend backup restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Receive the chain into DIR with btrsend's receiver (DIR/NAME appears
    /// for each stream of the chain, as `btrsend receive` makes it). Each
    /// frame is checked before it is applied, each stream's hash before its
    /// END; on damage what the restore received is deleted again. No resume
    /// checkpoints are taken (the stream is in the repository): an
    /// interrupted restore leaves a partial DIR/NAME; delete it and run the
    /// restore again.
    #[arg(
        long = "to",
        value_name = "DIR",
        required_unless_present = "stdout",
        conflicts_with = "stdout"
    )]
    to: Option<PathBuf>,
    /// Write the chain's raw send streams, full first, to standard output
    /// (for `btrfs receive DIR`). The chain is read twice: every frame and
    /// every stream's hash is checked before the first byte is written.
    #[arg(long)]
    stdout: bool,
    #[command(flatten)]
    lock: LockArg,
    /// The stored snapshot: its id, its uuid, its path, `latest` (the
    /// newest, when the repository holds one origin), a base name (`home`:
    /// the newest of home.DATE…), a date/time prefix in the local time zone
    /// or UTC (`2026-11-20`, `2026-11-20T03`), or a prefix of its name. The
    /// newest match is taken; matches in several origins are refused with
    /// the newest of each, and no match names the nearest snapshots.
    #[arg(value_name = "SNAPSHOT")]
    snapshot: String,
}

/// Arguments of `btrsend backup import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// The entries' time, RFC 3339 (default: each file's modification
    /// time).
    #[arg(long = "time", value_name = "RFC3339")]
    time: Option<String>,
    /// The origin the entries belong to, for retention (default:
    /// `imported`).
    #[arg(long = "origin", value_name = "NAME")]
    origin: Option<String>,
    #[command(flatten)]
    lock: LockArg,
    /// Send-stream files, raw or zstd-compressed (e.g. from `btrfs send
    /// -f`); an incremental one needs its parent in the repository or
    /// among the files.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
}

/// Run `btrsend backup`.
pub fn run(args: &BackupArgs) -> anyhow::Result<()> {
    match &args.command {
        BackupCommand::Init(a) => {
            let spec = a.repo.spec()?;
            let repo = Repository::init(&spec).map_err(anyhow::Error::new)?;
            writeln!(
                crate::exit::stdout(),
                "made the empty repository {}",
                printable(repo.store().name())
            )?;
            Ok(())
        }
        BackupCommand::Run(a) => run_run(a),
        BackupCommand::List(a) => run_list(a),
        BackupCommand::Verify(a) => run_verify(a),
        BackupCommand::Restore(a) => run_restore(a),
        BackupCommand::Import(a) => run_import(a),
        BackupCommand::Forget(a) => super::forget::run(a),
    }
}

/// The exit code for a backup error.
pub fn exit_of(e: &BackupError) -> Exit {
    if e.is_repo_missing() {
        Exit::RepoMissing
    } else if e.is_lock_held() {
        Exit::LockHeld
    } else {
        Exit::Failure
    }
}

/// With `--json`: print the error as JSON on stderr and exit quietly.
pub(crate) fn json_error(json: bool, e: anyhow::Error) -> anyhow::Error {
    if !json {
        return e;
    }
    let code = Exit::from_error(&e);
    let line = json!({"message_type": "error", "message": crate::text::error_text(&e), "exit_code": code.code()});
    eprintln!("{line}");
    anyhow::Error::new(ExitWith::quiet(code))
}

/// Progress of `run` / `import`: JSON Lines, a bar on a terminal, or
/// nothing.
///
/// The bar covers the whole run: its total is the size of every stream the
/// run stores (exact estimates made first), its message names the snapshot
/// being stored and how many of them there are, so its ETA is the run's.
struct RunProgress {
    json: bool,
    bar: Option<ProgressBar>,
    out: Mutex<crate::exit::Watch<std::io::Stdout>>,
    /// Snapshots the run stores, and the number of the current one.
    count: std::sync::atomic::AtomicUsize,
    current: std::sync::atomic::AtomicUsize,
    /// The stream bytes kept from an interrupted run for the snapshot
    /// being stored (for its `stored` message).
    resumed: Mutex<Option<u64>>,
    /// Why the snapshot being stored is full (for its `stored` message).
    full: Mutex<Option<backup::plan::FullReason>>,
    /// A test hook (`BTRSEND_TEST_PAUSE_AT`): stop the run's sender for
    /// good once this many stream bytes are stored, so that a test can kill
    /// it at a known point.
    pause_at: Option<u64>,
    streamed: std::sync::atomic::AtomicU64,
    /// Stream bytes kept from interrupted runs, over the whole run.
    kept: std::sync::atomic::AtomicU64,
}

impl RunProgress {
    /// Progress for `--json` (lines on stdout), a bar on a terminal, or
    /// nothing. Until the total is known (the run's estimates) the bar is a
    /// spinner saying `waiting` (no empty `0 B/0 B` bar).
    fn new(json: bool, waiting: &str) -> RunProgress {
        let mut p = RunProgress::bar(!json, waiting);
        p.json = json;
        p
    }

    /// A bar on a terminal when `show`, and nothing else.
    fn bar(show: bool, waiting: &str) -> RunProgress {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.set_message(waiting.to_owned());
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        RunProgress {
            json: false,
            bar,
            out: Mutex::new(crate::exit::Watch(std::io::stdout())),
            count: std::sync::atomic::AtomicUsize::new(0),
            current: std::sync::atomic::AtomicUsize::new(0),
            resumed: Mutex::new(None),
            full: Mutex::new(None),
            pause_at: std::env::var("BTRSEND_TEST_PAUSE_AT")
                .ok()
                .and_then(|v| v.parse().ok()),
            streamed: std::sync::atomic::AtomicU64::new(0),
            kept: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Stream bytes kept from interrupted runs (not sent again).
    fn kept(&self) -> u64 {
        self.kept.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn line(&self, v: serde_json::Value) {
        if let Ok(mut out) = self.out.lock() {
            let _ = writeln!(out, "{v}");
            let _ = out.flush();
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl Progress for RunProgress {
    fn notice(&self, msg: &str) {
        if self.json {
            self.line(json!({"message_type": "status", "notice": msg}));
        } else if let Some(b) = &self.bar {
            b.println(format!("btrsend: notice: {}", printable(msg)));
        }
    }

    fn warning(&self, msg: &str) {
        if self.json {
            self.line(json!({"message_type": "status", "warning": msg}));
        } else {
            // Cron mails what reaches stderr: this is printed without a
            // terminal too.
            let line = format!("btrsend: warning: {}", printable(msg));
            match &self.bar {
                Some(b) => b.println(line),
                None => eprintln!("{line}"),
            }
        }
    }

    fn full(&self, _path: &str, why: backup::plan::FullReason) {
        if let Ok(mut f) = self.full.lock() {
            *f = Some(why);
        }
    }

    fn plan(&self, snapshots: usize, stream_bytes: u64) {
        use std::sync::atomic::Ordering;
        self.count.store(snapshots, Ordering::Relaxed);
        if let Some(b) = self.bar.as_ref().filter(|_| snapshots > 0) {
            b.disable_steady_tick();
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} {msg} {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.set_length(stream_bytes);
            b.set_position(0);
            b.reset_eta();
        }
    }

    fn start(&self, path: &str, kind: Kind, stream_total: u64) {
        use std::sync::atomic::Ordering;
        if self.json {
            let mut v = json!({"message_type": "status", "snapshot": path, "kind": kind.as_str()});
            if stream_total > 0 {
                v["stream_bytes"] = stream_total.into();
            }
            self.line(v);
        }
        let n = self.current.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(b) = &self.bar {
            let count = self.count.load(Ordering::Relaxed).max(n);
            b.set_message(format!(
                "[{n}/{count}] {} ({})",
                printable(path),
                kind.as_str()
            ));
        }
    }

    fn stream(&self, bytes: u64) {
        if let Some(at) = self.pause_at {
            use std::sync::atomic::Ordering;
            let now = self.streamed.fetch_add(bytes, Ordering::Relaxed) + bytes;
            if now >= at {
                eprintln!("btrsend: test: paused after {now} stream bytes");
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
        if let Some(b) = &self.bar {
            b.inc(bytes);
            // An estimate is exact, but never let the bar run past its end
            // (a snapshot stored full against the plan).
            if b.length().is_some_and(|l| b.position() > l) {
                b.set_length(b.position());
            }
        }
    }

    fn resumed(&self, path: &str, stream_bytes: u64, stored_bytes: u64) {
        if let Ok(mut r) = self.resumed.lock() {
            *r = Some(stream_bytes);
        }
        if self.json {
            self.line(json!({
                "message_type": "status",
                "snapshot": path,
                "resumed_from_bytes": stream_bytes,
                "resumed_stored_bytes": stored_bytes,
            }));
        } else if let Some(b) = &self.bar {
            b.println(format!(
                "btrsend: continuing {} where an interrupted run stopped: {stream_bytes} bytes of its stream kept",
                printable(path)
            ));
        }
    }

    fn stored(&self, e: &Entry) {
        let resumed = self.resumed.lock().ok().and_then(|mut r| r.take());
        self.kept
            .fetch_add(resumed.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
        let full = self.full.lock().ok().and_then(|mut f| f.take());
        if self.json {
            let mut v = serde_json::to_value(e).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("message_type".into(), "stored".into());
                // What this run sent of the stream, and what an interrupted
                // run had stored already.
                let kept = resumed.unwrap_or(0);
                o.insert("resumed_from_bytes".into(), kept.into());
                o.insert(
                    "sent_bytes".into(),
                    e.stream_bytes.saturating_sub(kept).into(),
                );
                if let Some(why) = full.filter(|_| e.kind == Kind::Full) {
                    o.insert("full_reason".into(), why.as_str().into());
                }
            }
            self.line(v);
        }
    }

    fn unchanged(&self, subvol: &std::path::Path, snapshot: &std::path::Path) {
        if self.json {
            self.line(json!({
                "message_type": "status",
                "subvolume": subvol.display().to_string(),
                "unchanged": true,
                "newest_snapshot": snapshot.display().to_string(),
            }));
        } else if let Some(b) = &self.bar {
            b.println(format!(
                "btrsend: {} has not changed since {}: no snapshot taken",
                printable(&subvol.display().to_string()),
                printable(&snapshot.display().to_string())
            ));
        }
    }

    fn skipped(&self, path: &str, e: &Entry) {
        if self.json {
            self.line(json!({"message_type": "status", "snapshot": path, "already_stored": e.id}));
        }
    }

    fn failed(&self, path: &str, err: &BackupError) {
        if let Ok(mut r) = self.resumed.lock() {
            *r = None;
        }
        if let Ok(mut f) = self.full.lock() {
            *f = None;
        }
        if self.json {
            let v =
                json!({"message_type": "error", "snapshot": path, "message": error_text_of(err)});
            eprintln!("{v}");
        } else {
            if let Some(b) = &self.bar {
                b.suspend(|| ());
            }
            // Most errors name the snapshot already.
            let text = error_text_of(err);
            if text.contains(path) {
                eprintln!("btrsend: error: {}", printable(&text));
            } else {
                eprintln!("btrsend: error: {}: {}", printable(path), printable(&text));
            }
        }
    }

    fn wants_total(&self) -> bool {
        self.bar.is_some()
    }
}

/// The exit for a run that stored `ok` and failed `failed` snapshots.
fn partial(ok: usize, failed: usize, what: &str) -> anyhow::Result<()> {
    match (ok, failed) {
        (_, 0) => Ok(()),
        (0, n) => Err(anyhow::Error::new(ExitWith::quiet(Exit::Failure))
            .context(format!("{n} {what} failed"))),
        (_, n) => Err(anyhow::Error::new(ExitWith::quiet(Exit::Partial))
            .context(format!("{n} {what} failed, {ok} stored"))),
    }
}

fn run_run(a: &RunArgs) -> anyhow::Result<()> {
    let go = || -> anyhow::Result<()> {
        let repo = Repository::open(&a.repo.spec()?)?;
        let mut opts = RunOptions::new()
            .with_devices(a.devices.clone())
            .with_degraded(a.degraded)
            .with_full_every(a.full_every)
            .with_full_every_days(a.full_every_days)
            .with_level(a.level)
            .with_wait_lock(a.lock.retry_lock);
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
        let progress = RunProgress::new(a.json, "computing the streams' sizes");
        let start = jiff::Timestamp::now();
        let clock = std::time::Instant::now();
        let report = repo.run(&a.snapshots, &opts, &progress);
        progress.finish();
        let report = report?;
        let elapsed = clock.elapsed();
        let stream_bytes: u64 = report.stored.iter().map(|e| e.stream_bytes).sum();
        let stored_bytes: u64 = report.stored.iter().map(|e| e.stored_bytes).sum();
        let sent_bytes = stream_bytes.saturating_sub(progress.kept());
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
        } else if progress.bar.is_some() {
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
        partial(report.stored.len(), report.failed.len(), "snapshots")
    };
    go().map_err(|e| json_error(a.json, e))
}

fn run_list(a: &ListArgs) -> anyhow::Result<()> {
    let repo = Repository::open(&a.repo.spec()?)?;
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

fn run_verify(a: &VerifyArgs) -> anyhow::Result<()> {
    let repo = Repository::open(&a.repo.spec()?)?;
    let start = jiff::Timestamp::now();
    let clock = std::time::Instant::now();
    // A bar only for the long form (every byte read).
    let progress = RunProgress::bar(a.read_data && !a.json, "");
    let rep = repo.verify(a.read_data, a.lock.retry_lock, &progress);
    progress.finish();
    let rep = rep?;
    if a.json {
        let mut v = serde_json::to_value(&rep)?;
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

/// A restore's receive, told to the user: what an interruption would leave
/// (said if one comes), and the receiver's notes.
struct RestoreWatch<'a> {
    dir: Option<&'a std::path::Path>,
}

impl btrsend::receive::Progress for RestoreWatch<'_> {
    fn subvol_start(&self, name: &[u8], _incremental: bool) {
        if let Some(dir) = self.dir {
            let path = dir.join(String::from_utf8_lossy(name).as_ref());
            crate::signal::on_interrupt_say(Some(format!(
                "the restore left {} incomplete: remove it (`btrfs subvolume delete` for a subvolume, else `rm -r`) and restore again",
                path.display()
            )));
        }
    }

    fn note(&self, msg: &str) {
        eprintln!("btrsend: notice: {}", printable(msg));
    }
}

fn run_restore(a: &RestoreArgs) -> anyhow::Result<()> {
    let repo = Repository::open(&a.repo.spec()?)?;
    let mut progress = RestoreWatch {
        dir: a.to.as_deref(),
    };
    let watch = RunProgress::bar(true, "");
    let res = if a.stdout {
        if std::io::stdout().is_terminal() {
            anyhow::bail!(
                "not writing binary send streams to a terminal: redirect standard output"
            );
        }
        let mut out = crate::exit::stdout();
        repo.restore(
            &a.snapshot,
            RestoreTarget::Writer(&mut out),
            a.lock.retry_lock,
            &mut progress,
            &watch,
        )
    } else if let Some(dir) = &a.to {
        repo.restore(
            &a.snapshot,
            RestoreTarget::Dir(dir),
            a.lock.retry_lock,
            &mut progress,
            &watch,
        )
    } else {
        return Ok(());
    };
    watch.finish();
    crate::signal::on_interrupt_say(None);
    res?;
    Ok(())
}

fn run_import(a: &ImportArgs) -> anyhow::Result<()> {
    let repo = Repository::open(&a.repo.spec()?)?;
    let time = a
        .time
        .as_deref()
        .map(|t| {
            t.parse::<jiff::Timestamp>()
                .with_context(|| format!("--time {t}: not an RFC 3339 time"))
        })
        .transpose()?;
    let mut opts = ImportOptions::default();
    opts.time = time;
    opts.origin = a.origin.clone();
    opts.wait_lock = a.lock.retry_lock;
    let progress = RunProgress::new(false, "reading the files");
    let report = repo.import(&a.files, &opts, &progress)?;
    partial(
        report.stored.len() + report.skipped.len(),
        report.failed.len(),
        "files",
    )
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("x").is_err());
    }
}
