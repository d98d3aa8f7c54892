//! `btrsend backup`: the subcommands of the backup repository (core
//! `btrsend::backup`), one module each (init is here, it is one call);
//! this module holds what they share: the `--repo`, `--retry-lock` and
//! `--metrics-file` options, and the dispatch (which writes the metrics
//! file, module `metrics`, whatever the command's outcome).
//!
//! Exit statuses and JSON error lines are not made here but in
//! [`crate::exit`]; progress is rendered by [`crate::progress::backup`].

mod against;
mod browse;
mod btrbk;
mod compare;
mod config;
mod config_check;
mod copy;
mod dry_run;
mod forget;
mod import;
mod init;
mod jobs;
mod key;
mod list;
mod metrics;
mod mount;
mod query;
mod repair;
mod restore;
mod run;
mod secrets;
mod status;
mod synthesize;
mod tar;
mod target;
mod verify;

use std::path::{Path, PathBuf};
use std::time::Duration;

use btrsend::backup::{self, Repository};
use clap::{Args, Subcommand};

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

Encryption (init --encryption): passphrase (every command needs the
passphrase: --password-file FILE, --password-command CMD,
BTRSEND_PASSWORD_FILE, BTRSEND_PASSWORD, or a prompt on a terminal),
recipients (age public keys: run and import need only the write key init
wrote, --write-key FILE, BTRSEND_WRITE_KEY_FILE or the one under
~/.config/btrsend/keys/; verify and restore need an identity, --identity
FILE or BTRSEND_IDENTITY_FILE; the write key reads the catalog: names,
times, sizes), or none.

Each stored stream is a zstd file whose frames hold the raw btrfs send
stream (in an encrypted repository, an age file of it): `zstd -dc FILE |
btrfs receive DIR` (encrypted: `age -d -i KEY FILE | zstd -d | btrfs
receive DIR`) restores it without btrsend (full stream first, then each
incremental of the chain, as `btrsend backup list` shows them). The
layout, the keys and what each can do are described in
btrsend-repository(5).

Nightly, from cron or the systemd units in contrib/: `backup run` (with
--snapshot to take and prune the source snapshots too), then `backup
forget`; silent on success. With a config file (--config FILE, default
/etc/btrsend/btrsend.toml; see btrsend-backup-config(1)) one `backup run`
and one `backup forget` do every job and destination it names. The crontab lines are in the EXAMPLES of
btrsend-backup(1) and in the README.

Exit status:
  0    success
  1    error
  2    usage error
  3    some snapshots were stored and some failed, or a source snapshot
       could not be taken or deleted; with --config, some jobs or
       destinations failed and others did not
  10   repository missing or unreachable
  11   the repository's lock is held (see --retry-lock)
  12   verify found damage (verify --compare: the repositories disagree;
       copy: a stream of --from is damaged)
  13   a passphrase, identity or write key is missing or wrong
  14   status: a backup is older than --max-age (or there is none), or
       its chain does not resolve
  130  interrupted";

/// The repository option every subcommand takes.
#[derive(Debug, Clone, Args)]
pub struct RepoSpec {
    /// The repository: a directory, s3://BUCKET/PREFIX (PREFIX optional)
    /// or ssh://USER@HOST:PORT/PATH (USER@ and :PORT optional) (default:
    /// the environment variable BTRSEND_REPOSITORY).
    #[arg(long = "repo", value_name = "REPO")]
    pub repo: Option<String>,
    /// With an ssh:// repository: the ssh command and its options, split
    /// on whitespace (default: the environment variable BTRSEND_SSH, else
    /// ssh), e.g. "ssh -i /root/.ssh/backup_key".
    #[arg(long = "ssh-command", value_name = "COMMAND")]
    pub ssh_command: Option<String>,
    /// With an ssh:// repository: the btrsend program on the far end
    /// (default: the environment variable BTRSEND_REMOTE_PATH, else
    /// btrsend found on the far end's PATH).
    #[arg(long = "remote-path", value_name = "PROGRAM")]
    pub remote_path: Option<String>,
}

/// The repository and the secrets that open it, which every subcommand
/// but init takes.
#[derive(Debug, Clone, Args)]
pub struct RepoArg {
    #[command(flatten)]
    spec: RepoSpec,
    #[command(flatten)]
    keys: secrets::KeyArgs,
}

impl RepoArg {
    pub(crate) fn spec(&self) -> anyhow::Result<String> {
        self.spec.spec()
    }

    /// Whether a repository is given (`--repo` or BTRSEND_REPOSITORY), so
    /// that no config file is read unless asked for.
    pub(crate) fn given(&self) -> bool {
        self.spec.repo.is_some()
            || std::env::var_os(backup::REPO_ENV).is_some_and(|v| !v.is_empty())
    }

    /// The repository of the config file's destination `d`, with its
    /// secrets; a secret option given on the command line wins.
    pub(crate) fn for_destination(&self, d: &config::Destination) -> RepoArg {
        let mut keys = self.keys.clone();
        if keys.pass.password_file.is_none() && keys.pass.password_command.is_none() {
            keys.pass.password_file = d.password_file.as_ref().map(|p| p.get_ref().0.clone());
            keys.pass.password_command.clone_from(&d.password_command);
        }
        if keys.identity.is_empty() {
            keys.identity = d
                .identity
                .as_ref()
                .map(|i| i.get_ref().0.clone())
                .unwrap_or_default();
        }
        if keys.write_key.is_none() {
            keys.write_key = d.write_key.as_ref().map(|w| w.get_ref().0.clone());
        }
        RepoArg {
            spec: RepoSpec {
                repo: d.repo.as_ref().map(|r| r.get_ref().clone()),
                ssh_command: self
                    .spec
                    .ssh_command
                    .clone()
                    .or_else(|| d.ssh_command.clone()),
                remote_path: self
                    .spec
                    .remote_path
                    .clone()
                    .or_else(|| d.remote_path.clone()),
            },
            keys,
        }
    }

    /// How to reach an ssh:// repository or target.
    pub(crate) fn ssh_options(&self) -> backup::remote::ssh::SshOptions {
        self.spec.ssh_options()
    }

    /// The secrets' options.
    pub(crate) fn keys(&self) -> &secrets::KeyArgs {
        &self.keys
    }

    /// Open the repository with the secrets given.
    pub(crate) fn open(&self) -> anyhow::Result<Repository> {
        self.open_limited(None)
    }

    /// [`RepoArg::open`], its reads and writes at most `rate` bytes per
    /// second (`--limit-rate`).
    pub(crate) fn open_limited(&self, rate: Option<u64>) -> anyhow::Result<Repository> {
        let spec = self.spec()?;
        let name = crate::text::printable(&spec);
        let ask = move || secrets::prompt(&format!("Passphrase of {name}"), false);
        let secrets = self.keys.secrets(&ask)?;
        let mut store = self.spec.store(&spec)?;
        if let Some(rate) = rate {
            let limit = std::sync::Arc::new(btrsend::rate::RateLimit::new(rate));
            store = std::sync::Arc::new(backup::store::LimitedStore::new(store, limit));
        }
        Ok(Repository::open_with(store, &secrets)?)
    }
}

impl RepoSpec {
    /// The store `spec` (what [`RepoSpec::spec`] gave) names, an ssh://
    /// one reached as --ssh-command and --remote-path say.
    pub(crate) fn store(&self, spec: &str) -> anyhow::Result<std::sync::Arc<dyn backup::Store>> {
        Ok(backup::store_with(spec, &self.ssh_options())?)
    }

    /// How to reach an ssh:// repository or target.
    pub(crate) fn ssh_options(&self) -> backup::remote::ssh::SshOptions {
        backup::remote::ssh::SshOptions {
            command: self.ssh_command.clone(),
            remote_path: self.remote_path.clone(),
        }
    }

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

/// `--metrics-file`, on the commands a monitoring system watches.
#[derive(Debug, Clone, Args)]
pub struct MetricsArg {
    /// Write what the command did to FILE for Prometheus (node_exporter's
    /// textfile collector).
    ///
    /// FILE, in the Prometheus text format, is e.g.
    /// /var/lib/prometheus/node-exporter/btrsend-run.prom (one file per
    /// command and repository); it is replaced atomically, on success and
    /// on failure alike. Labels: job (the config file's job, empty
    /// without --config), destination (REPO as given), command, and origin
    /// where a value is per origin. With --config FILE one file holds
    /// every job and destination (default: metrics_file in the file's
    /// table named after the command, e.g. run). Every command
    /// writes btrsend_last_attempt_timestamp_seconds,
    /// btrsend_last_attempt_exit_status, btrsend_duration_seconds and
    /// btrsend_last_success_timestamp_seconds (after a failure, the one
    /// FILE held), and from the catalog btrsend_repository_size_bytes and,
    /// per origin, btrsend_snapshots_kept, btrsend_snapshots_kept_bytes and
    /// btrsend_newest_snapshot_timestamp_seconds. run adds btrsend_sent_bytes
    /// and per origin btrsend_streams_stored and btrsend_stored_bytes;
    /// forget per origin btrsend_snapshots_deleted; verify
    /// btrsend_verify_problems, btrsend_verify_unrestorable_snapshots and
    /// btrsend_verify_read_bytes (with --against-source
    /// btrsend_verify_problems and btrsend_verify_against_source_proven,
    /// _differing and _skipped); repair btrsend_repair_damaged,
    /// btrsend_repair_repaired and btrsend_repair_failed; status per origin
    /// btrsend_newest_snapshot_age_seconds, btrsend_chain_healthy (1 or
    /// 0) and with --max-age btrsend_stale (1 or 0).
    #[arg(long = "metrics-file", value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
}

impl MetricsArg {
    fn file(&self) -> Option<&Path> {
        self.metrics_file.as_deref()
    }
}

/// Waiting for a held lock.
#[derive(Debug, Clone, Args)]
pub struct LockArg {
    /// Wait up to DURATION for a lock another btrsend holds (e.g. 30s, 10m,
    /// 1h; default 0: fail at once with exit status 11).
    #[arg(long = "retry-lock", value_name = "DURATION", value_parser = parse_duration)]
    pub retry_lock: Option<Duration>,
}

impl LockArg {
    /// How long to wait for a held lock.
    pub fn wait(&self) -> Duration {
        self.retry_lock.unwrap_or_default()
    }
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
    /// Make a new, empty repository: encrypted with a passphrase, for age
    /// recipients, or not at all.
    Init(init::InitArgs),
    /// Store snapshots: each one not yet stored, incremental when a
    /// parent is stored and still on the source.
    Run(run::RunArgs),
    /// List the stored streams.
    List(list::BackupListArgs),
    /// Check the repository: the catalog, every file and chain, and with
    /// --read-data every byte.
    Verify(verify::VerifyArgs),
    /// Restore a stored snapshot: its whole chain, into a directory or to
    /// standard output, or only the paths --include picks, from its index.
    Restore(restore::RestoreArgs),
    /// Store existing send-stream files (raw or zstd) as repository
    /// entries.
    Import(import::ImportArgs),
    /// Delete old entries by a retention policy (restic's --keep-*
    /// options), never one a kept entry's chain needs.
    Forget(forget::ForgetArgs),
    /// Replace a stored incremental snapshot's stream by a full stream
    /// made from the repository alone (a synthetic full), so the entries
    /// before it can go.
    Synthesize(synthesize::SynthesizeArgs),
    /// Per origin, the newest stored snapshot, its age and its chain's
    /// health, from the catalog alone; exit status 14 when one is older
    /// than --max-age.
    Status(status::StatusArgs),
    /// Manage an encrypted repository's passphrases: list, add, remove,
    /// passwd.
    Key(key::KeyCmdArgs),
    /// Build the browsing index of every stored snapshot that has none
    /// (what ls and dump read).
    Index(browse::IndexArgs),
    /// List the files of a stored snapshot from its index, without
    /// restoring it.
    Ls(browse::LsArgs),
    /// Write one file of a stored snapshot to standard output, reading
    /// only the stream frames that hold its data (a directory: as tar).
    Dump(browse::DumpArgs),
    /// Mount every stored snapshot read-only (FUSE) on MOUNTPOINT, from
    /// the browsing index, until it is unmounted or interrupted.
    ///
    /// The mount shows each stored snapshot's root as MOUNTPOINT/uuid/UUID
    /// (once, from its newest entry, if it is stored more than once), with links
    /// to it by origin and path (MOUNTPOINT/snapshots/ORIGIN/PATH, the
    /// slashes of PATH written %2F) and by time (MOUNTPOINT/time/TIME, UTC);
    /// names from the catalog have /, %, ~ and control characters written as
    /// %XX, and a name taken twice gets ~ID (the entry's id). Files show their
    /// stored mode, owner, size, modification time (as atime and ctime too),
    /// link count, xattrs, symlink targets and holes; every name of a hard
    /// link has one inode number. Every snapshot needs its index (`btrsend
    /// backup index`). A damaged index fails the operation that meets it with
    /// EIO and says so on standard error.
    ///
    /// It runs in the foreground until unmounted (umount MOUNTPOINT, or
    /// fusermount3 -u MOUNTPOINT as another user) or interrupted (SIGINT,
    /// SIGTERM: it unmounts and exits with status 0). The repository's shared
    /// lock is held while mounted, so backup run, import and forget wait (with
    /// --retry-lock) or fail meanwhile.
    Mount(mount::MountArgs),
    /// Find the paths of stored snapshots that match shell-style
    /// patterns, from their indexes.
    Find(query::FindArgs),
    /// The paths added, removed and modified between two stored
    /// snapshots of one origin, from their indexes.
    Diff(query::DiffArgs),
    /// The config file of run, forget, verify, status and list --config:
    /// check it, or make one from a btrbk.conf.
    Config(config_check::ConfigCmdArgs),
    /// Copy the entries one repository holds and another lacks, with their
    /// chains, every hash checked (3-2-1 copies).
    Copy(copy::CopyArgs),
    /// Store again the damaged or missing stream files verify finds,
    /// byte-identical, from the source or a second repository.
    Repair(repair::RepairArgs),
}

/// A header naming the job and destination before a table, when a config
/// file's jobs print several.
fn header(job: &str, d: &config::Destination) {
    use std::io::Write;
    let _ = writeln!(
        crate::exit::stdout(),
        "job {}: {}",
        crate::text::printable(job),
        crate::text::printable(d.location())
    );
}

/// Run `command` over the config file's jobs when one is to be read (see
/// [`config::ConfigArg::path`]), else `single` on the one repository.
fn per_job(
    cfg: &config::ConfigArg,
    repo_given: bool,
    each: jobs::Each<'_>,
    skip: &dyn Fn(&config::Job, &config::Destination) -> bool,
    f: &mut dyn FnMut(
        &str,
        &config::Job,
        &config::Destination,
        &mut metrics::Metrics,
    ) -> anyhow::Result<()>,
    single: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match cfg.path(repo_given) {
        Some(path) => jobs::each_destination(&path, &each, skip, f),
        None => single(),
    }
}

/// Run `btrsend backup`.
pub fn run(args: &BackupArgs) -> anyhow::Result<()> {
    let no_skip = |_: &config::Job, _: &config::Destination| false;
    match &args.command {
        BackupCommand::Init(a) => init::run(a),
        BackupCommand::Run(a) => per_job(
            &a.config,
            a.repo.given() || a.target.target.is_some(),
            jobs::Each {
                command: "run",
                json: a.json,
                metrics_file: a.metrics.file(),
                names: &a.config.job,
            },
            &no_skip,
            &mut |_, job, d, m| run::run(&a.for_destination(job, d), m),
            || {
                metrics::with_metrics(a.metrics.file(), "run", a.repo.spec().ok(), |m| {
                    run::run(a, m)
                })
            },
        ),
        BackupCommand::List(a) => per_job(
            &a.config,
            a.repo.given() || a.target.target.is_some(),
            jobs::Each {
                command: "list",
                json: a.json,
                metrics_file: None,
                names: &a.config.job,
            },
            &no_skip,
            &mut |name, _, d, _| {
                if !a.json {
                    header(name, d);
                }
                list::run(&a.for_destination(d))
            },
            || list::run(a),
        ),
        BackupCommand::Verify(a) => per_job(
            &a.config,
            a.repo.given(),
            jobs::Each {
                command: "verify",
                json: a.json,
                metrics_file: a.metrics.file(),
                names: &a.config.job,
            },
            // A target has no streams to verify.
            &|_, d| d.target.is_some(),
            &mut |_, job, d, m| verify::run(&a.for_destination(job, d), m),
            || {
                metrics::with_metrics(a.metrics.file(), "verify", a.repo.spec().ok(), |m| {
                    verify::run(a, m)
                })
            },
        ),
        BackupCommand::Restore(a) => restore::run(a),
        BackupCommand::Import(a) => import::run(a),
        BackupCommand::Forget(a) => {
            // A destination without any keep_* key (nor --keep-* option)
            // is left alone; with none at all, forget refuses as it does
            // for one repository.
            let skip =
                |_: &config::Job, d: &config::Destination| a.for_destination(d).policy().is_empty();
            per_job(
                &a.config,
                a.repo.given() || a.target.target.is_some(),
                jobs::Each {
                    command: "forget",
                    json: a.json,
                    metrics_file: a.metrics.file(),
                    names: &a.config.job,
                },
                &skip,
                &mut |name, _, d, m| {
                    if !a.json
                        && (a.dry_run || std::io::IsTerminal::is_terminal(&std::io::stdout()))
                    {
                        header(name, d);
                    }
                    forget::run(&a.for_destination(d), m)
                },
                || {
                    metrics::with_metrics(a.metrics.file(), "forget", a.repo.spec().ok(), |m| {
                        forget::run(a, m)
                    })
                },
            )
        }
        BackupCommand::Synthesize(a) => synthesize::run(a),
        BackupCommand::Key(a) => key::run(a),
        BackupCommand::Index(a) => browse::index(a),
        BackupCommand::Ls(a) => browse::ls(a),
        BackupCommand::Dump(a) => browse::dump(a),
        BackupCommand::Mount(a) => mount::run(a),
        BackupCommand::Find(a) => query::find(a),
        BackupCommand::Diff(a) => query::diff_cmd(a),
        BackupCommand::Status(a) => per_job(
            &a.config,
            a.repo.given() || a.target.target.is_some(),
            jobs::Each {
                command: "status",
                json: a.json,
                metrics_file: a.metrics.file(),
                names: &a.config.job,
            },
            &no_skip,
            &mut |name, _, d, m| {
                if !a.json && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                    header(name, d);
                }
                status::run(&a.for_destination(d), m)
            },
            || {
                metrics::with_metrics(a.metrics.file(), "status", a.repo.spec().ok(), |m| {
                    status::run(a, m)
                })
            },
        ),
        BackupCommand::Config(a) => config_check::run(a),
        BackupCommand::Copy(a) => copy::run(a),
        BackupCommand::Repair(a) => per_job(
            &a.config,
            a.repo.given(),
            jobs::Each {
                command: "repair",
                json: a.json,
                metrics_file: a.metrics.file(),
                names: &a.config.job,
            },
            // A target has no stream files to repair.
            &|_, d| d.target.is_some(),
            &mut |_, job, d, m| repair::run(&a.for_destination(job, d), m),
            || {
                metrics::with_metrics(a.metrics.file(), "repair", a.repo.spec().ok(), |m| {
                    repair::run(a, m)
                })
            },
        ),
    }
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
