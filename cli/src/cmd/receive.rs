//! `btrsend receive`: for now only `--dump`.

use clap::Args;

use super::dump::{self, DumpArgs};

/// Arguments of `btrsend receive`.
#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// Do not receive: print the stream's commands like `btrfs receive --dump`
    /// (the same as `btrsend dump`).
    #[arg(long)]
    pub dump: bool,
    /// Read the stream from FILE instead of standard input.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
}

/// Receive (only `--dump` for now).
pub fn run(args: &ReceiveArgs) -> anyhow::Result<()> {
    if args.dump {
        return dump::run(&DumpArgs { file: args.file.clone() });
    }
    anyhow::bail!("receiving into a directory is not available yet: use --dump, or `btrfs receive`")
}
