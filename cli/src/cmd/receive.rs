//! `btrsend receive`: apply send streams to a directory (core
//! `btrsend::receive`), or `--dump` them.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context;
use btrsend::progress::Progress;
use btrsend::receive::{self, ReceiveOptions};
use clap::{Args, ValueHint};
use stream_format::{Command, verbose};

use super::dump::{self, DumpArgs};
use crate::progress::{Mode, Op, Reporter};

/// Arguments of `btrsend receive`.
#[derive(Debug, Args)]
#[command(after_long_help = RECORDS_HELP)]
pub struct ReceiveArgs {
    /// Do not receive: print the stream's commands like `btrfs receive --dump`
    /// (the same as `btrsend dump`).
    #[arg(
        long,
        conflicts_with_all = ["dir", "directories", "root_mount", "force_decompress", "threads", "stop_at_end", "max_errors", "checkpoint_interval"]
    )]
    pub dump: bool,
    /// Read the stream from FILE instead of standard input.
    #[arg(short = 'f', long = "file", value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub file: Option<PathBuf>,
    /// Stop after the first END command, as `btrfs receive -e` (default: read
    /// every stream concatenated in the input until its end).
    #[arg(short = 'e')]
    pub stop_at_end: bool,
    /// Stop at the N-th error; 0 means never stop (default 1). Every error is
    /// printed; a subvolume with an error is marked incomplete.
    #[arg(
        short = 'E',
        long = "max-errors",
        value_name = "N",
        default_value_t = 1,
        value_hint = ValueHint::Other
    )]
    pub max_errors: u64,
    /// Decompress the data of a --compressed-data stream and write it, as
    /// `btrfs receive --force-decompress`. By default, when DIR is on btrfs
    /// and btrsend runs as root, compressed extents are written as they are
    /// (BTRFS_IOC_ENCODED_WRITE); elsewhere they are always decompressed.
    #[arg(long)]
    pub force_decompress: bool,
    /// Write file data on N worker threads, one queue per file, while the
    /// stream is read and checked in order (default: the number of CPUs, 2
    /// to 4); 0 or 1 applies every command on one thread. At most 64 MiB of
    /// data is queued at once.
    #[arg(long, value_name = "N", value_hint = ValueHint::Other)]
    pub threads: Option<usize>,
    /// Take a resume checkpoint of each subvolume every MIB mebibytes of
    /// stream (default 48; see RESUMING below): after an interruption, at
    /// most MIB + 16 MiB of stream is sent again. 0 takes none, for a
    /// one-shot receive that is a little faster (no undo journal; on btrfs
    /// no durable snapshot checkpoints either): an interrupted receive then
    /// leaves an
    /// incomplete subvolume that cannot be resumed (delete it and receive
    /// the whole stream again).
    #[arg(long, value_name = "MIB", default_value_t = 48, value_hint = ValueHint::Other)]
    pub checkpoint_interval: u64,
    /// Show progress on standard error: a bar on a terminal (bytes of the
    /// stream file's size, or from a pipe bytes, rate and elapsed time),
    /// otherwise a line every few seconds and a summary (default: a bar
    /// when standard error is a terminal, else nothing).
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long, overrides_with = "progress")]
    pub no_progress: bool,
    /// Receive each subvolume as a plain directory with a record in
    /// DIR/.btrsend/, even where it could be a real btrfs subvolume (DIR on
    /// btrfs, running as root).
    #[arg(long)]
    pub directories: bool,
    /// The root mount point of DIR's btrfs, as `btrfs receive -m`: the paths
    /// of parent and clone-source subvolumes found by UUID are taken
    /// relative to it (default: the mount point of DIR, from
    /// /proc/self/mountinfo). Mount the top level (subvolid=5) there to let
    /// every subvolume be found.
    #[arg(short = 'm', value_name = "ROOTMOUNT")]
    pub root_mount: Option<PathBuf>,
    /// Accepted for `btrfs receive -C` compatibility: btrsend always
    /// confines every path of the stream beneath DIR (no chroot needed).
    #[arg(short = 'C', long = "chroot")]
    pub chroot: bool,
    /// Print nothing but errors and notes: no "At subvol NAME" (stderr) or
    /// "At snapshot NAME" (stdout) lines, which are printed by default when
    /// receiving real subvolumes, as `btrfs receive` prints them.
    #[arg(short = 'q', long = "quiet", conflicts_with = "verbose")]
    pub quiet: bool,
    /// Print more, as btrfs receive -v does (on standard error): "At subvol
    /// NAME" / "At snapshot NAME" for every subvolume in either mode, then
    /// "receiving subvol|snapshot NAME" with the received UUID and transids
    /// (and the parent's), a line for each write and clone
    /// ("write PATH - offset=N length=N"), and at the end of each
    /// subvolume "BTRFS_IOC_SET_RECEIVED_SUBVOL uuid=UUID, stransid=N"
    /// (directory mode: "NAME received completely"), or "NAME left
    /// incomplete". Repeat (-vv) for a line for every command, with
    /// btrfs-progs' texts. Listing commands reads all file data on the
    /// receiving thread: slower.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Print the resume token of the interrupted receive of DIR/NAME (one
    /// line) and exit: give it to `btrsend send --resume TOKEN` with the
    /// arguments of the interrupted send, and receive that stream into DIR
    /// (see RESUMING below). Fails, saying why, when DIR/NAME has no
    /// resume point.
    #[arg(
        long,
        value_name = "DIR/NAME",
        value_hint = ValueHint::DirPath,
        conflicts_with_all = ["dump", "dir", "file"]
    )]
    pub resume_token: Option<PathBuf>,
    /// The directory to receive into: each subvolume of the stream becomes
    /// `DIR/<name>`, a read-only btrfs subvolume with its received UUID (on
    /// btrfs as root), else a directory with its record in `DIR/.btrsend/`.
    #[arg(value_name = "DIR", required_unless_present_any = ["dump", "resume_token"], value_hint = ValueHint::DirPath)]
    pub dir: Option<PathBuf>,
}

const RECORDS_HELP: &str = "\
Two modes. On btrfs, as root, btrsend receive does what btrfs receive does: a
full stream (SUBVOL) creates the subvolume DIR/<name>; an incremental stream
(SNAPSHOT) snapshots its parent, the subvolume of the same filesystem whose
received UUID (else UUID) is the stream's parent's (if several have it, one
whose transid is the stream's too, else the first found, as btrfs receive
takes it), found in the UUID tree (it may be anywhere below the mount root, see
-m). At the end of each subvolume its received UUID and stransid are set and
it is made read-only, so btrfs send -p, btrbk and a later btrsend receive can
use it. A subvolume whose receive failed or was interrupted has no received
UUID: it is incomplete, never taken for a parent, and a second receive of it
says so.

Elsewhere (other filesystems, not root, or --directories) each subvolume is a
directory: an incremental stream needs its parent received earlier into the
same DIR (as a directory, or by btrfs receive as a subvolume): it is found by
the parent's UUID (and ctransid, if several have the UUID), copied (reflinked
where the filesystem can, holes kept) to DIR/<name>, and the changes are
applied. The record DIR/.btrsend/<name>.subvol keeps each subvolume's
received UUID, ctransid, parent and whether it was received completely; an
incomplete one is never used as a parent. On btrfs, a snapshot may also start
from a parent received as a directory.

Either way every path of the stream stays beneath DIR/<name>: absolute
paths, '..' and symlinks in paths are refused.

Receiving on a btrfs backup host over ssh:

    btrsend send -p /mnt/snaps/day1 /mnt/snaps/day2 | ssh backup btrsend receive /backup/host1

As an ordinary user, file owners cannot be set: this is reported once and is
not an error.

RESUMING: a receive takes a checkpoint of each subvolume every 48 MiB of
stream (--checkpoint-interval; 0: none, and no resume), kept in DIR/.btrsend-resume/NAME/ and deleted when the subvolume is
complete: an undo journal that records, until the next checkpoint, how to
reverse every change (removed entries are moved to a trash and deleted at the
next checkpoint; nothing is flushed, see below); on btrfs as root some
checkpoints are also durable: a snapshot, flushed, taken on a time budget (at
most about 5 % of the receive, the first after a few seconds, or after more data than can be written in those). After an interruption (a killed sender or
receiver, a closed pipe, a full disk), --resume-token DIR/NAME prints the
token of the last checkpoint; `btrsend send --resume TOKEN` with the
arguments of the interrupted send writes the rest of the stream (a
continuation stream, which btrfs receive refuses), and `btrsend receive
DIR` rolls DIR/NAME back to its checkpoint (plays the journal backwards, or
after a restart replaces it by the durable snapshot) and finishes it: the same tree as an
uninterrupted receive, with its received UUID set only at the end. The
whole stream received again into DIR continues NAME from its checkpoint in
the same way (the commands the checkpoint holds are read and dropped). A
receive interrupted before NAME's first checkpoint (its first 48 MiB, or
into a directory while an incremental copies its parent) has no resume point
yet: --resume-token says so, and the whole stream received again starts NAME
over (DIR/.btrsend-resume/NAME/start names the subvolume or directory the
receive made; anything else there is refused and left alone).
Over ssh:

    T=$(ssh backup btrsend receive --resume-token /backup/host1/day2)
    btrsend send --resume \"$T\" -p /mnt/snaps/day1 /mnt/snaps/day2 | ssh backup btrsend receive /backup/host1

A resume point between durable checkpoints serves only until the system
restarts: a power loss or OS crash (unlike a killed process) may leave changes
on disk that the journal does not know of. After a restart (another boot id)
a receive into btrfs goes back to its last durable checkpoint; with none, and
in directory mode, --resume-token and a continuation are refused and nothing
is changed, and the whole stream received again starts DIR/NAME over. A subvolume resumed from a durable
checkpoint is a snapshot of it: btrfs subvolume show gives it a Parent UUID
(that of the deleted checkpoint) where an uninterrupted receive of a full
stream has none, or its parent's. Its tree, UUID and received UUID are the
same.";

/// The [`Reporter`], plus the lines `btrfs receive` prints (btrfs-progs
/// `cmds/receive.c`): "At subvol NAME" (stderr) and "At snapshot NAME"
/// (stdout), by default when receiving real subvolumes, in either mode with
/// -v, never with -q; with -v also "receiving subvol|snapshot ..." with the
/// UUIDs and transids, a line for each WRITE and CLONE, and at the end of
/// each subvolume the received UUID and stransid set (directory mode: that
/// it was received completely) or that it was left incomplete; with -vv a
/// line for every command.
struct Lines {
    reporter: Reporter,
    /// -1 quiet, 0 default, 1+ verbose.
    verbosity: i8,
    /// Real subvolumes are received (the "At" lines are printed at default
    /// verbosity).
    subvolumes: bool,
    /// The received UUID and stransid of the subvolume being received
    /// (from its SUBVOL or SNAPSHOT, with -v), for its last line.
    current: Mutex<Option<([u8; 16], u64)>>,
    /// The name of the last subvolume started, for the hint after a
    /// failure.
    last: Mutex<Option<Vec<u8>>>,
}

impl Lines {
    /// "At subvol NAME" (stderr) or "At snapshot NAME" (stdout).
    fn at(&self, name: &[u8], incremental: bool) {
        if incremental {
            // btrfs-progs 6.2 prints this one on standard output. A closed
            // pipe does not stop the receive (`main` reports it at the end:
            // see `exit::stdout_closed`).
            let _ = crate::exit::stdout().write_all(&cat(&[&verbose::at(name, true), b"\n"]));
        } else {
            self.reporter.println_bytes(&verbose::at(name, false));
        }
    }
}

impl Progress for Lines {
    fn subvol_start(&self, name: &[u8], incremental: bool) {
        if let Ok(mut l) = self.last.lock() {
            *l = Some(name.to_vec());
        }
        self.reporter.subvol_start(name, incremental);
        // With -v, the "At" lines come with the SUBVOL / SNAPSHOT listing.
        if self.verbosity == 0 && self.subvolumes {
            self.at(name, incremental);
        }
    }
    fn subvol_done(&self, name: &[u8], complete: bool) {
        self.reporter.subvol_done(name, complete);
        if self.verbosity < 1 {
            return;
        }
        let current = self.current.lock().ok().and_then(|mut c| c.take());
        let line = match (complete, self.subvolumes, current) {
            (true, true, Some((uuid, stransid))) => verbose::set_received_subvol(&uuid, stransid),
            (true, ..) => cat(&[name, b" received completely"]),
            (false, ..) => cat(&[name, b" left incomplete"]),
        };
        self.reporter.println_bytes(&line);
    }
    fn lists_commands(&self) -> bool {
        self.verbosity >= 1
    }
    fn command(&self, cmd: &Command<'_>) {
        let level = u8::try_from(self.verbosity).unwrap_or(0);
        let (path, uuid, ctransid) = match cmd {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            }
            | Command::Snapshot {
                path,
                uuid,
                ctransid,
                ..
            } => (path, uuid, ctransid),
            _ => {
                if let Some(line) = verbose::command(cmd, level) {
                    self.reporter.println_bytes(&line);
                }
                return;
            }
        };
        self.at(path, matches!(cmd, Command::Snapshot { .. }));
        if let Some(line) = verbose::receiving(cmd) {
            self.reporter.println_bytes(&line);
        }
        if let Ok(mut c) = self.current.lock() {
            *c = Some((*uuid, *ctransid));
        }
    }
    fn encoded_fallback(&self, path: &[u8], err: std::io::Error) {
        if self.verbosity >= 2 {
            self.reporter
                .println_bytes(&verbose::encoded_fallback(path, &err));
        }
    }
    fn data(&self, bytes: u64) {
        self.reporter.data(bytes);
    }
    fn position(&self, offset: u64, commands: u64) {
        self.reporter.position(offset, commands);
    }
    fn inode(&self, ino: u64) {
        self.reporter.inode(ino);
    }
    fn note(&self, msg: &str) {
        self.reporter.note(msg);
    }
    fn error(&self, err: &dyn std::error::Error) {
        self.reporter.error(err);
    }
}

/// Receive (or dump).
pub fn run(args: &ReceiveArgs) -> anyhow::Result<()> {
    if args.dump {
        return dump::run(&DumpArgs {
            file: args.file.clone(),
        });
    }
    if let Some(p) = &args.resume_token {
        let token = btrsend::receive::resume_token(p)?;
        let mut out = crate::exit::stdout();
        writeln!(out, "{token}")?;
        out.flush()?;
        return Ok(());
    }
    let Some(dir) = &args.dir else {
        crate::usage_bail!("DIR is required");
    };
    // A regular file (also as standard input) is read without a reader
    // thread, straight into the command buffers; a pipe on a reader thread.
    let input = match &args.file {
        Some(f) => {
            std::fs::File::open(f).with_context(|| format!("cannot open {}", f.display()))?
        }
        None => {
            use std::os::fd::AsFd;
            std::fs::File::from(
                std::io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .context("cannot use standard input")?,
            )
        }
    };
    // A regular file's size is the total; a pipe has none (bytes, rate and
    // elapsed time are shown instead).
    let total = input
        .metadata()
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len());
    let mode = Mode::choose(args.progress, args.no_progress, false);
    let mut progress = Lines {
        reporter: Reporter::new(mode, Op::Receive, total, false),
        verbosity: if args.quiet {
            -1
        } else {
            i8::try_from(args.verbose).unwrap_or(i8::MAX)
        },
        subvolumes: !args.directories && receive::subvol_mode_possible(dir),
        current: Mutex::new(None),
        last: Mutex::new(None),
    };
    let mut opts = ReceiveOptions::new();
    opts.subvolumes = !args.directories;
    opts.root_mount.clone_from(&args.root_mount);
    opts.max_errors = args.max_errors;
    opts.stop_at_end = args.stop_at_end;
    opts.force_decompress = args.force_decompress;
    opts.threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(receive::DEFAULT_THREADS, |n| n.get().clamp(2, 4))
    });
    opts.checkpoint_interval = args.checkpoint_interval.saturating_mul(1 << 20);
    let res = receive::receive_file(input, dir, &opts, &mut progress);
    progress.reporter.finish(res.is_ok(), None);
    if let Err(e) = res {
        let last = progress.last.lock().ok().and_then(|mut l| l.take());
        return Err(match last.and_then(|n| resume_hint(dir, &n)) {
            Some(hint) => anyhow::Error::new(Hinted { error: e, hint }),
            None => e.into(),
        });
    }
    Ok(())
}

/// A receive error with what to do next, said after it.
#[derive(Debug)]
struct Hinted {
    error: receive::ReceiveError,
    hint: String,
}

impl std::fmt::Display for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.error, self.hint)
    }
}

/// The receive error stays in the chain (for the exit status); its text is
/// already in this one's, which error lines do not repeat.
impl std::error::Error for Hinted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// After a failed receive: how to go on with the subvolume it left
/// incomplete, when it left one there (`None` when it did not, or it was
/// removed).
fn resume_hint(dir: &std::path::Path, name: &[u8]) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let path = dir.join(std::ffi::OsStr::from_bytes(name));
    std::fs::symlink_metadata(&path).ok()?;
    let shown = path.display();
    Some(match receive::resume_token(&path) {
        Ok(_) => format!(
            "{shown} is incomplete and can be continued: `btrsend receive --resume-token {shown}` prints a token for `btrsend send --resume TOKEN` with the same arguments (or receive the whole stream again)"
        ),
        Err(_) => format!(
            "{shown} is incomplete, with no resume point yet: receiving the whole stream again starts it over"
        ),
    })
}

/// `parts` joined: a line of raw bytes (paths as the stream has them).
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}
