//! `btrsend backup config check`: read the config file as `--config` does,
//! check what can be checked without acting (every referenced file
//! readable, every repository spec and its S3 settings well formed) and
//! print a summary of the jobs. Nothing is snapshotted, opened or written.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use toml::Spanned;

use super::config::{self, Config};
use crate::text::printable;

/// Arguments of `btrsend backup config`.
#[derive(Debug, Args)]
#[command(after_long_help = CONFIG_HELP)]
pub struct ConfigCmdArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// The subcommands of `btrsend backup config`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check the config file without doing anything, and print its jobs.
    Check(CheckArgs),
}

/// Arguments of `btrsend backup config check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The config file (default: the file BTRSEND_CONFIG names, else
    /// /etc/btrsend/btrsend.toml).
    #[arg(long = "config", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print nothing on success.
    #[arg(long, short = 'q')]
    quiet: bool,
}

const CONFIG_HELP: &str = "\
`run`, `forget`, `verify`, `status` and `list` act on the jobs of a config
file with --config FILE (--job NAME: only that job, repeatable). Without
--config, and without --repo or BTRSEND_REPOSITORY, they read the default
file if it exists: the one BTRSEND_CONFIG names, else
/etc/btrsend/btrsend.toml. The file is TOML:

  # Per command: the --metrics-file of run, forget, verify, status.
  [run]
  metrics_file = \"/var/lib/prometheus/node-exporter/btrsend-run.prom\"

  [job.home]                       # a job named home
  snapshot = \"/mnt/pool/home\"      # --snapshot (a path or an array)
  snapshot_dir = \"/mnt/pool/snaps\" # --snapshot-dir
  keep_snapshots = 7               # --keep-snapshots
  before = \"mount /backup\"         # hooks, run with sh -c
  after = \"umount /backup\"
  on_error = \"mail -s \\\"backup $BTRSEND_JOB failed\\\" root < /dev/null\"

  [[job.home.destination]]         # one table per repository
  repo = \"/backup/home\"
  full_every_days = 30             # run: --full-every-days
  keep_daily = 7                   # forget: --keep-daily
  keep_weekly = 4
  keep_monthly = 12
  max_age = \"26h\"                  # status: --max-age

  [[job.home.destination]]
  repo = \"s3://offsite/home\"
  limit_rate = \"5M\"
  password_file = \"/etc/btrsend/offsite.pass\"
  keep_within = \"90d\"

  [job.media]
  device = [\"/dev/sdb1\"]           # --device
  snapshots = [\"snaps/media.*\"]    # the SNAPSHOTs
  [[job.media.destination]]
  repo = \"/backup/media\"
  [[job.media.destination]]         # a received-subvolume target
  target = \"ssh://backup@nas.example/backup/media\"
  keep_daily = 14

Keys: every option has one, named as the option with _ for -. A job
([job.NAME]) holds the sources: snapshots, device, degraded, snapshot,
snapshot_dir, keep_snapshots, and the hooks before, after, on_error. A
destination ([[job.NAME.destination]]) holds repo (or target: a
received-subvolume target, see TARGETS in btrsend-backup-run(1); run,
list, forget and status use it, verify skips it; the keys that only a
repository takes are refused there) and everything per repository:
password_file, password_command, identity (or identity_file;
a path or an array), write_key, ssh_command, remote_path, full_every,
full_every_days,
compression_level, limit_rate, retry_lock, keep_last, keep_hourly,
keep_daily, keep_weekly, keep_monthly, keep_yearly, keep_within (forget),
max_age (status), read_data (verify). Durations and rates are strings as
the options read them (\"10m\", \"10M\") or integers (seconds, bytes per
second). --json, --dry-run, --config and --job are the command line's
only. An option given on the command line overrides the file's key for
every destination.

Secrets are given by reference only: a password or passphrase key, or an
identity written as a value, is refused. Unknown keys are errors, and
every error names the file, the line and the key (exit status 2).

Jobs run in the file's order, each destination after the other; a
failure does not stop the next one. The exit status covers them all: 0
when all succeeded, the one status they all failed with, 12 (damage) or
14 (stale) when that is all that went wrong, else 3 when some succeeded
and 1 when none did. --json adds job and destination to every line and
object, and ends with a line of message_type jobs_summary (per job its
exit_code, hook_failed and per destination exit_code and error). The
metrics file holds every job's destinations, labelled job and
destination. forget leaves out the destinations without a keep_* key.

Hooks: before runs first; when it fails, the job is not run and counts as
failed. after runs once the job's destinations are done, whatever the
outcome; on_error runs last when the job (or its after hook) failed. A
hook that fails makes the job fail. Hooks run for every command that uses
the file (BTRSEND_COMMAND says which), inherit standard error, and their
standard output too unless --json is given (then it goes to standard
error). Their environment: BTRSEND_HOOK (before, after, on_error),
BTRSEND_JOB, BTRSEND_COMMAND, BTRSEND_CONFIG, BTRSEND_DESTINATIONS (the
job's repositories, one per line); for after and on_error also
BTRSEND_RESULT (success or failure), BTRSEND_EXIT_STATUS (the job's),
BTRSEND_FAILED_DESTINATIONS (one per line), BTRSEND_DESTINATION (the
first that failed) and BTRSEND_ERROR (the first error's message).

config check reads the file, checks every key, that every file it names
(password_file, identity, write_key) can be read and every repo is a
well-formed repository (and, for s3://, that the S3 settings resolve),
without opening any repository; then prints each job, its sources and
destinations. Exit status 0 when the file is good, 2 when it is not
(the error names the file, line and key), 1 when it cannot be read.";

/// Run `btrsend backup config`.
pub fn run(a: &ConfigCmdArgs) -> anyhow::Result<()> {
    match &a.command {
        ConfigCommand::Check(c) => check(c),
    }
}

fn check(a: &CheckArgs) -> anyhow::Result<()> {
    let path = a.config.clone().unwrap_or_else(config::default_path);
    let cfg = Config::load(&path)?;
    let readable = |p: &Spanned<PathBuf>, key: &str, file: &Path| -> anyhow::Result<()> {
        std::fs::File::open(file).map(drop).map_err(|e| {
            cfg.error_at(
                p.span(),
                key,
                format!("cannot read {}: {e}", file.display()),
            )
        })
    };
    let mut out = crate::exit::stdout();
    let jobs = cfg.jobs(&[])?;
    for (name, job) in &jobs {
        for d in &job.destination {
            let d = d.get_ref();
            if let Some(p) = &d.password_file {
                let file = Spanned::new(p.span(), p.get_ref().0.clone());
                readable(&file, "password_file", &p.get_ref().0)?;
            }
            if let Some(ids) = &d.identity {
                for f in &ids.get_ref().0 {
                    readable(&Spanned::new(ids.span(), f.clone()), "identity", f)?;
                }
            }
            if let Some(w) = &d.write_key {
                readable(
                    &Spanned::new(w.span(), w.get_ref().0.clone()),
                    "write_key",
                    &w.get_ref().0,
                )?;
            }
            // An ssh:// repository or target is only parsed: opening it
            // would start ssh, and config check opens nothing.
            let (key, loc) = match (&d.repo, &d.target) {
                (Some(r), _) => ("repo", r),
                (None, Some(t)) => ("target", t),
                (None, None) => continue,
            };
            match btrsend::backup::remote::spec::SshSpec::parse(loc.get_ref()) {
                Some(parsed) => parsed
                    .map(drop)
                    .map_err(|e| cfg.error_at(loc.span(), key, e)),
                None if key == "target" => Ok(()),
                None => btrsend::backup::store_for(loc.get_ref())
                    .map(drop)
                    .map_err(|e| cfg.error_at(loc.span(), key, e.to_string())),
            }?;
        }
        if a.quiet {
            continue;
        }
        writeln!(out, "job {}", printable(name))?;
        let list = |v: &[PathBuf]| {
            v.iter()
                .map(|p| printable(&p.display().to_string()).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        if !job.device.0.is_empty() {
            writeln!(out, "  device: {}", list(&job.device.0))?;
        }
        if !job.snapshot.0.is_empty() {
            writeln!(out, "  snapshot: {}", list(&job.snapshot.0))?;
        }
        if let Some(dir) = &job.snapshot_dir {
            writeln!(
                out,
                "  snapshot_dir: {}",
                printable(&dir.display().to_string())
            )?;
        }
        if let Some(n) = job.keep_snapshots {
            writeln!(out, "  keep_snapshots: {n}")?;
        }
        if !job.snapshots.0.is_empty() {
            let s: Vec<_> = job
                .snapshots
                .0
                .iter()
                .map(|s| printable(s).into_owned())
                .collect();
            writeln!(out, "  snapshots: {}", s.join(" "))?;
        }
        for (hook, cmd) in [
            ("before", &job.before),
            ("after", &job.after),
            ("on_error", &job.on_error),
        ] {
            if let Some(c) = cmd {
                writeln!(out, "  {hook}: {}", printable(c))?;
            }
        }
        for d in &job.destination {
            let d = d.get_ref();
            let mut what = Vec::new();
            if d.keeps().iter().any(Option::is_some) || d.keep_within.is_some() {
                what.push("retention policy");
            } else {
                what.push("no retention policy (forget leaves it alone)");
            }
            if d.password_file.is_some() || d.password_command.is_some() {
                what.push("passphrase");
            }
            if d.identity.is_some() {
                what.push("identity");
            }
            if d.write_key.is_some() {
                what.push("write key");
            }
            writeln!(
                out,
                "  destination {}{}: {}",
                if d.target.is_some() { "target " } else { "" },
                printable(d.location()),
                what.join(", ")
            )?;
        }
    }
    if !a.quiet {
        writeln!(
            out,
            "{}: {} job{}, no error",
            printable(&cfg.path.display().to_string()),
            jobs.len(),
            if jobs.len() == 1 { "" } else { "s" }
        )?;
    }
    Ok(())
}
