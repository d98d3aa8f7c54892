//! `btrsend receive`: apply send streams to a directory (core
//! `btrsend::receive`), or `--dump` them.

use std::path::PathBuf;

use anyhow::Context;
use btrsend::receive::{self, ReceiveOptions};
use clap::{Args, ValueHint};

use super::dump::{self, DumpArgs};
use crate::progress::{Mode, Op, Reporter};

/// Arguments of `btrsend receive`.
#[derive(Debug, Args)]
#[command(after_long_help = RECORDS_HELP)]
pub struct ReceiveArgs {
    /// Do not receive: print the stream's commands like `btrfs receive --dump`
    /// (the same as `btrsend dump`).
    #[arg(long)]
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
    /// Show progress on standard error: a bar on a terminal (bytes of the
    /// stream file's size, or from a pipe bytes, rate and elapsed time),
    /// otherwise a line every few seconds and a summary (default: a bar
    /// when standard error is a terminal, else nothing).
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long, overrides_with = "progress")]
    pub no_progress: bool,
    /// The directory to receive into: each subvolume of the stream becomes a
    /// directory `DIR/<name>`, with its record in `DIR/.btrsend/`.
    #[arg(value_name = "DIR", required_unless_present = "dump", value_hint = ValueHint::DirPath)]
    pub dir: Option<PathBuf>,
}

const RECORDS_HELP: &str = "\
DIR may be on any filesystem. A full stream (SUBVOL) creates DIR/<name>; an
incremental stream (SNAPSHOT) needs its parent received earlier into the same
DIR: it is found by the parent's UUID and ctransid, copied (reflinked where the
filesystem can, holes kept) to DIR/<name>, and the changes are applied. The
record DIR/.btrsend/<name>.subvol keeps each subvolume's received UUID,
ctransid, parent and whether it was received completely; an incomplete one is
never used as a parent. Every path of the stream stays beneath DIR/<name>:
absolute paths, '..' and symlinks in paths are refused.

As an ordinary user, file owners cannot be set: this is reported once and is
not an error.";

/// Receive (or dump).
pub fn run(args: &ReceiveArgs) -> anyhow::Result<()> {
    if args.dump {
        return dump::run(&DumpArgs {
            file: args.file.clone(),
        });
    }
    let Some(dir) = &args.dir else {
        anyhow::bail!("DIR is required");
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
    let mut progress = Reporter::new(mode, Op::Receive, total, false);
    let mut opts = ReceiveOptions::new();
    opts.max_errors = args.max_errors;
    opts.stop_at_end = args.stop_at_end;
    opts.force_decompress = args.force_decompress;
    opts.threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(receive::DEFAULT_THREADS, |n| n.get().clamp(2, 4))
    });
    let res = receive::receive_file(input, dir, &opts, &mut progress);
    progress.finish(res.is_ok(), None);
    res?;
    Ok(())
}
