//! `btrsend backup restore`: a chain into a directory or to standard
//! output, with a bar, the receiver's notes, and what an interruption
//! would leave; or, with --include/--exclude, the picked paths from the
//! snapshot's index (core `btrsend::backup::index::extract`).
//!
//! It refuses to write binary streams to a terminal; checking and
//! receiving are the core's.

use std::io::IsTerminal;
use std::path::PathBuf;

use btrsend::backup::index::synth::Selection;
use btrsend::backup::{Entry, Kind, RestoreTarget};
use btrsend::progress::Progress;
use clap::Args;

use super::query::globs;
use super::{LockArg, RepoArg};
use crate::progress::backup::BackupReporter;
use crate::text::printable;

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
    /// Read from the repository at most RATE bytes per second on average
    /// (stored bytes; K, M, G: times 1024, 1024², 1024³; e.g. 10M). With
    /// --stdout the chain is read twice, so it takes twice as long.
    #[arg(long = "limit-rate", value_name = "RATE", value_parser = crate::cmd::parse_rate)]
    limit_rate: Option<u64>,
    /// Restore only the paths that match PATTERN, with everything below
    /// them and the directories leading to them (with their attributes),
    /// each at its path inside the snapshot: DIR/PATH. Read from the
    /// snapshot's index (`backup index`), not by receiving the chain: a
    /// file costs the frames that hold its data. Shell-style, with
    /// restic's rules (as `backup find`): without / a pattern matches a
    /// name at any depth, with / it is anchored at the snapshot's root.
    /// Repeat for several. DIR may exist: a name already in it is never
    /// replaced (a directory there is restored into; anything else stops
    /// the restore before it moves anything in). Access times are set to
    /// the modification time (the index keeps no other).
    #[arg(long = "include", value_name = "PATTERN", conflicts_with = "stdout")]
    include: Vec<String>,
    /// Leave out the paths that match PATTERN and everything below them
    /// (with or without --include; alone: every other path). Repeat for
    /// several.
    #[arg(long = "exclude", value_name = "PATTERN", conflicts_with = "stdout")]
    exclude: Vec<String>,
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

/// A restore's progress: the bar over the chain's streams, and from its
/// receive, what an interruption would leave (said if one comes) and the
/// receiver's notes.
struct RestoreProgress<'a> {
    dir: Option<&'a std::path::Path>,
    bar: BackupReporter,
}

impl Progress for RestoreProgress<'_> {
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

    fn notice(&self, msg: &str) {
        self.bar.notice(msg);
    }

    fn warning(&self, msg: &str) {
        self.bar.warning(msg);
    }

    fn plan(&self, snapshots: usize, stream_bytes: u64) {
        self.bar.plan(snapshots, stream_bytes);
    }

    fn start(&self, path: &str, kind: Kind, stream_total: u64) {
        self.bar.start(path, kind, stream_total);
    }

    fn stream(&self, bytes: u64) {
        self.bar.stream(bytes);
    }

    fn stored(&self, entry: &Entry) {
        self.bar.stored(entry);
    }

    fn wants_total(&self) -> bool {
        self.bar.wants_total()
    }
}

/// Run `btrsend backup restore`.
pub fn run(a: &RestoreArgs) -> anyhow::Result<()> {
    if !a.include.is_empty() || !a.exclude.is_empty() {
        return selected(a);
    }
    let repo = a.repo.open_limited(a.limit_rate)?;
    let progress = RestoreProgress {
        dir: a.to.as_deref(),
        bar: BackupReporter::bar(true, ""),
    };
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
            a.lock.wait(),
            &progress,
        )
    } else if let Some(dir) = &a.to {
        repo.restore(
            &a.snapshot,
            RestoreTarget::Dir(dir),
            a.lock.wait(),
            &progress,
        )
    } else {
        return Ok(());
    };
    progress.bar.finish();
    crate::signal::on_interrupt_say(None);
    res?;
    Ok(())
}

/// `restore --include/--exclude`: the picked paths, from the index.
fn selected(a: &RestoreArgs) -> anyhow::Result<()> {
    let sel = Selection::new(globs(&a.include)?, globs(&a.exclude)?);
    let Some(dir) = &a.to else {
        anyhow::bail!("--include and --exclude restore into a directory: give --to DIR");
    };
    let repo = a.repo.open_limited(a.limit_rate)?;
    // The receive runs on a thread of its own and reports no subvolume
    // here: what an interruption leaves is said now.
    let progress = RestoreProgress {
        dir: None,
        bar: BackupReporter::bar(true, ""),
    };
    crate::signal::on_interrupt_say(Some(format!(
        "the restore left {}/.btrsend-restore.{}: remove it and restore again",
        dir.display(),
        std::process::id()
    )));
    let res = repo.restore_selected(&a.snapshot, dir, &sel, a.lock.wait(), &progress);
    progress.bar.finish();
    crate::signal::on_interrupt_say(None);
    let (entry, written) = res?;
    if std::io::stderr().is_terminal() {
        eprintln!(
            "btrsend: restored {} path(s), {} byte(s) of file data, of entry {} ({}) into {}",
            written.paths,
            written.bytes,
            entry.id,
            printable(&entry.path),
            dir.display()
        );
    }
    Ok(())
}
