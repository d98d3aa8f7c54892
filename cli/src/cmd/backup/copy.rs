//! `btrsend backup copy --from R1 --to R2`: its options, the copy (the
//! core's [`Repository::copy_from`](btrsend::backup::Repository::copy_from)),
//! its summary and exit status.

use btrsend::backup::CopyOptions;
use clap::Args;
use serde_json::json;

use super::LockArg;
use super::compare::{open_from, open_to};
use super::secrets::{FromKeyArgs, KeyArgs};
use crate::exit::{Exit, ExitWith, exit_of, json_error, stored_or_failed};
use crate::progress::backup::BackupReporter;
use crate::text::iec;

/// Arguments of `btrsend backup copy`.
#[derive(Debug, Args)]
#[command(after_long_help = COPY_HELP)]
pub struct CopyArgs {
    /// The repository to copy from: a directory or s3://BUCKET[/PREFIX]
    /// (opened with the --from-* secrets).
    #[arg(long = "from", value_name = "R1")]
    from: String,
    /// The repository to copy into (default: the environment variable
    /// BTRSEND_REPOSITORY; opened with --password-file, --identity,
    /// --write-key as every other command opens its --repo).
    #[arg(long = "to", value_name = "R2")]
    to: Option<String>,
    #[command(flatten)]
    from_keys: FromKeyArgs,
    #[command(flatten)]
    keys: KeyArgs,
    /// The zstd level of the stream files written to R2 (1-19, default 3).
    #[arg(long = "compression-level", value_name = "L", default_value_t = 3,
          value_parser = clap::value_parser!(i32).range(1..=19))]
    level: i32,
    /// Read from R1 and write to R2 at most RATE bytes per second each, on
    /// average (stored bytes; K, M, G: times 1024, 1024², 1024³).
    #[arg(long = "limit-rate", value_name = "RATE", value_parser = crate::cmd::parse_rate)]
    limit_rate: Option<u64>,
    /// Print JSON Lines on standard output (as run: status, stored, then a
    /// summary with copied, already_present, failed, stream_bytes and
    /// stored_bytes) and errors as JSON on standard error.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    lock: LockArg,
    /// Raw bytes per zstd frame (for tests).
    #[arg(long = "frame-bytes", hide = true, value_name = "N")]
    frame_bytes: Option<usize>,
    /// The entries of R1 to copy, as restore names them (id, uuid, path,
    /// latest...), each with its whole chain; default: every entry of R1.
    #[arg(value_name = "SNAPSHOT")]
    snapshots: Vec<String>,
}

const COPY_HELP: &str = "\
Copies the entries R1 holds and R2 lacks (found by snapshot: uuid and
ctransid), each with every entry its chain needs, parents first: an
off-site copy made from the local repository (3-2-1). Each stream is read
from R1 with every frame's hash and the whole stream's BLAKE3 checked (as
restore checks them), written to R2 as a new stream file (compressed and,
when R2 is encrypted, encrypted with R2's keys: R1 and R2 may be
directories or S3, encrypted alike, differently or not at all), and
listed in R2's catalog only when its own hash is the one R1's catalog
records. An entry R2 holds already must record the same stream, else it
is an error (and nothing of its chain is copied on top of it).

A second copy does nothing. An interrupted copy is continued by the next:
the entries copied are listed, and the stream being copied, left as an
unfinished upload in R2 (as an interrupted run leaves it), is continued
after its kept part is checked against R1's bytes.

Reading R1's streams needs its passphrase (--from-password-file,
--from-password-command, BTRSEND_FROM_PASSWORD_FILE,
BTRSEND_FROM_PASSWORD) or an identity of its recipients (--from-identity,
BTRSEND_FROM_IDENTITY_FILE); writing R2 needs its passphrase or its write
key, given as for run. Afterwards `btrsend backup verify --compare R1 R2`
checks that the two agree, from their catalogs alone.

Exit status: 0 when every entry is copied or present, 3 when some were
copied and some failed, else that of the failure (1; 10, 11, 13 as for
run; 12 when R1's stream is damaged).";

/// Run `btrsend backup copy`.
pub fn run(a: &CopyArgs) -> anyhow::Result<()> {
    let go = || -> anyhow::Result<()> {
        let to = match &a.to {
            Some(t) => t.clone(),
            None => super::RepoSpec {
                repo: None,
                ssh_command: None,
                remote_path: None,
            }
            .spec()?,
        };
        let from = open_from(&a.from, &a.from_keys, a.limit_rate)?;
        let into = open_to(&to, &a.keys, a.limit_rate)?;
        let mut opts = CopyOptions::new()
            .with_level(a.level)
            .with_wait_lock(a.lock.wait());
        if let Some(n) = a.frame_bytes {
            opts = opts.with_frame_bytes(n);
        }
        let progress = BackupReporter::new(a.json, "reading the catalogs");
        let clock = std::time::Instant::now();
        let report = into.copy_from(&from, &a.snapshots, &opts, &progress);
        progress.finish();
        let report = report?;
        let stream_bytes: u64 = report.copied.iter().map(|e| e.stream_bytes).sum();
        let stored_bytes: u64 = report.copied.iter().map(|e| e.stored_bytes).sum();
        if a.json {
            progress.line(json!({
                "message_type": "summary",
                "duration_seconds": clock.elapsed().as_secs_f64(),
                "copied": report.copied.len(),
                "already_present": report.present.len(),
                "failed": report.failed.len(),
                "stream_bytes": stream_bytes,
                "stored_bytes": stored_bytes,
            }));
        } else if progress.has_bar() {
            eprintln!(
                "btrsend: copied {} entries ({} of stream, {} stored) in {}; {} present before",
                report.copied.len(),
                iec(stream_bytes),
                iec(stored_bytes),
                indicatif::HumanDuration(clock.elapsed()),
                report.present.len()
            );
        }
        if report.copied.is_empty()
            && let [(_, e)] = report.failed.as_slice()
        {
            // One entry, one error: its exit status (12 for damage).
            let code = if matches!(e, btrsend::backup::BackupError::Damage { .. }) {
                Exit::Damage
            } else {
                exit_of(e)
            };
            return Err(anyhow::Error::new(ExitWith::quiet(code)));
        }
        stored_or_failed(report.copied.len(), report.failed.len(), "entries")
    };
    go().map_err(|e| json_error(a.json, e))
}
