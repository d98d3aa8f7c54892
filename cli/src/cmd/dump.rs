//! `btrsend dump`: print a send stream like `btrfs receive --dump`.
//!
//! The text is btrfs-progs 6.2's, byte for byte (see `stream_format::dump`);
//! times are printed in the zone of the `TZ` environment variable, as progs'
//! `localtime()` does. Only the first stream is printed: dumping stops at the
//! first END, like progs. Protocol versions 1 to 3 are read — whatever
//! `btrsend send --proto N` writes, and what `btrsend receive` takes —
//! where progs 6.2 stops at 2 (version 3 adds only ENABLE_VERITY, printed as
//! newer progs print it). Errors differ from progs' on purpose: they name the
//! stream offset and the command index.
//!
//! A closed standard output (`btrsend dump | head`) stops the dump with exit
//! status 141, as in every subcommand (see `exit.rs`); everything else that
//! goes wrong is an error (exit 1), printed once by `main`.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueHint};
use stream_format::ReaderOptions;
use stream_format::dump::{DumpOptions, dump, is_broken_pipe};

/// The highest stream version read: 3, as `btrsend send` and `receive`.
const MAX_VERSION: u32 = 3;

/// Arguments of `btrsend dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Read the stream from FILE instead of standard input.
    #[arg(short = 'f', long = "file", value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub file: Option<PathBuf>,
}

/// Dump the stream.
pub fn run(args: &DumpArgs) -> anyhow::Result<()> {
    match &args.file {
        Some(path) => {
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            // Large enough that a whole 128 KiB WRITE is read in one call.
            let input = BufReader::with_capacity(256 << 10, file);
            dump_to_stdout(input).with_context(|| path.display().to_string())
        }
        None => dump_to_stdout(io::stdin().lock()).context("standard input"),
    }
}

fn dump_to_stdout<R: Read>(input: R) -> anyhow::Result<()> {
    let mut out = BufWriter::with_capacity(64 << 10, crate::exit::stdout());
    let mut options = DumpOptions::default();
    options.reader = ReaderOptions::new().with_max_version(MAX_VERSION);
    match dump(input, &mut out, &options) {
        Ok(_) => Ok(()),
        // Only the broken pipe itself, so `main` names it as every
        // subcommand does (not as a stream error).
        Err(e) if is_broken_pipe(&e) => Err(io::Error::from(io::ErrorKind::BrokenPipe).into()),
        Err(e) => Err(e.into()),
    }
}
