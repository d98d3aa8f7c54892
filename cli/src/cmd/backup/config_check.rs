//! `btrsend backup config check`: read the config file as `--config` does,
//! check what can be checked without acting (every referenced file
//! readable, every repository spec and its S3 settings well formed) and
//! print a summary of the jobs. Nothing is snapshotted, opened or written.
//! `btrsend backup config import-btrbk` writes one from a btrbk.conf
//! (module `btrbk`).

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
    /// Write the config file equivalent to a btrbk.conf, and report the
    /// lines it cannot carry over.
    #[command(after_long_help = IMPORT_BTRBK_HELP)]
    ImportBtrbk(ImportBtrbkArgs),
}

/// Arguments of `btrsend backup config import-btrbk`.
#[derive(Debug, Args)]
pub struct ImportBtrbkArgs {
    /// The btrbk config file to read.
    #[arg(value_name = "FILE", default_value = super::btrbk::DEFAULT_BTRBK_CONF)]
    file: PathBuf,
    /// Write the btrsend config file to OUT instead of standard output
    /// (an existing OUT is refused unless --force is given).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: Option<PathBuf>,
    /// Replace OUT if it exists.
    #[arg(long, requires = "output")]
    force: bool,
}

const IMPORT_BTRBK_HELP: &str = "\
import-btrbk reads a btrbk.conf as btrbk does (volume, subvolume and
target sections, each option applying to the last section opened and
inherited by the sections below it; a target given globally or per volume
applies to every subvolume below it) and writes the btrsend config file
that does the same, on standard output or to -o OUT:

  - each local subvolume with a target becomes a job [job.NAME] (NAME:
    its base name, made of letters, digits, _ and -; the volume's name is
    put in front when two subvolumes share one) that snapshots it:
    snapshot, snapshot_dir (btrbk's snapshot_dir, else the volume's
    directory);
  - snapshot_preserve_min all (btrbk's default) keeps every snapshot (no
    keep_snapshots); latest with snapshot_preserve no is keep_snapshots =
    1; other snapshot retention is reported (btrsend keeps a count);
  - target [send-receive] DIR or URL is a destination target = ...; target
    raw DIR or URL (a directory of stream files) a repository repo = ...,
    which must be made with backup init first (a comment in the output
    says so);
  - ssh://HOST[:PORT]/DIR and HOST:DIR are ssh://USER@HOST[:PORT]/DIR
    (USER: ssh_user, default root as in btrbk; ssh_user no: none);
    ssh_identity, ssh_compression yes and ssh_cipher_spec are ssh_command
    = \"ssh -i FILE -c SPEC -C\";
  - target_preserve_min all (btrbk's default) writes no keep_* key (forget
    leaves the destination alone); latest is keep_last = 1; N{h,d,w,m,y}
    is keep_within (weeks as 7 days); target_preserve Nh Nd Nw Nm Ny is
    keep_hourly, keep_daily, keep_weekly, keep_monthly, keep_yearly (*:
    \"unlimited\", 0: left out). btrbk keeps the first backup of each period
    counted back from now, forget the newest of each of the N most recent
    periods holding one: a comment in the output says so;
  - incremental no on a raw target is full_every = 1; raw_target_compress
    zstd with raw_target_compress_level N is compression_level; rate_limit
    is limit_rate (the same units: k, m, g, t are powers of 1024; into a
    send-receive target both count the raw stream; on a raw target
    limit_rate counts the stored zstd bytes, as a comment in the output
    says).

Everything else is reported on standard error, one line each: FILE:LINE,
the line (control characters escaped) and why it was not carried over:
options with no equivalent (group, noauto, timestamp_format,
preserve_day_of_week, preserve_hour_of_day, lockfile, backend,
stream_buffer, stream_compress, raw_target_encrypt and the gpg_ and
openssl_ options: btrsend encrypts with age, chosen at backup init...),
unknown options, malformed lines, and subvolumes left out (on another
host, with wildcards, without a target, or with snapshot_create no). Where
a retention setting cannot be carried over, no keep_* key is written, so
that forget deletes nothing btrbk would keep. Check the output with
`btrsend backup config check --config OUT`.

Exit status 0 when a config file was written (even with lines
reported), 1 when FILE cannot be read, is not UTF-8 text or is larger
than 1 MiB, when no job could be made, or when OUT exists without
--force.";

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
`run`, `forget`, `verify`, `status`, `list` and `repair` act on the jobs of a config
file with --config FILE (--job NAME: only that job, repeatable). Without
--config, and without --repo or BTRSEND_REPOSITORY, they read the default
file if it exists: the one BTRSEND_CONFIG names, else
/etc/btrsend/btrsend.toml. The file is TOML:

  # Per command: the --metrics-file of run, forget, verify, status, repair.
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
list, forget and status use it, verify and repair skip it; the keys that only a
repository takes are refused there: secrets, full_every, full_every_days,
compression_level, read_data) and everything per repository:
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
        ConfigCommand::ImportBtrbk(a) => import_btrbk(a),
    }
}

fn import_btrbk(a: &ImportBtrbkArgs) -> anyhow::Result<()> {
    use std::io::Read;
    let name = printable(&a.file.display().to_string()).into_owned();
    let file = std::fs::File::open(&a.file)
        .map_err(|e| anyhow::anyhow!("cannot read the btrbk config {name}: {e}"))?;
    let mut bytes = Vec::new();
    file.take(super::btrbk::MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot read the btrbk config {name}: {e}"))?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > super::btrbk::MAX_BYTES) {
        anyhow::bail!("{name}: larger than 1 MiB, which no btrbk.conf is: is it the right file?");
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e
            .as_bytes()
            .get(..at)
            .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
            + 1;
        anyhow::anyhow!("{name}:{line}: not UTF-8 text (byte {at}): is it a btrbk.conf?")
    })?;
    let imported = super::btrbk::convert(&a.file.display().to_string(), &text);
    let mut err = std::io::stderr().lock();
    for u in &imported.unmapped {
        writeln!(
            err,
            "{name}:{}: `{}`: not carried over: {}",
            u.line,
            printable(&u.text),
            printable(&u.why)
        )?;
    }
    if imported.jobs == 0 {
        anyhow::bail!(
            "{name}: no job could be made: no local subvolume with a target was carried over"
        );
    }
    match &a.output {
        None => crate::exit::stdout().write_all(imported.toml.as_bytes())?,
        Some(out) => {
            let shown = printable(&out.display().to_string()).into_owned();
            let mut open = std::fs::OpenOptions::new();
            open.write(true);
            if a.force {
                open.create(true).truncate(true);
            } else {
                open.create_new(true);
            }
            let mut f = open.open(out).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    anyhow::anyhow!("{shown} exists: give --force to replace it")
                } else {
                    anyhow::anyhow!("cannot write {shown}: {e}")
                }
            })?;
            f.write_all(imported.toml.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| anyhow::anyhow!("cannot write {shown}: {e}"))?;
        }
    }
    let mut lines: Vec<usize> = imported.unmapped.iter().map(|u| u.line).collect();
    lines.dedup();
    writeln!(
        err,
        "{name}: {} job{} written, {} line{} not carried over",
        imported.jobs,
        if imported.jobs == 1 { "" } else { "s" },
        lines.len(),
        if lines.len() == 1 { "" } else { "s" },
    )?;
    Ok(())
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
