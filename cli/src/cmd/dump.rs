//! `btrsend dump`: print a send stream like `btrfs receive --dump`.

use std::path::PathBuf;

use clap::Args;

/// Arguments of `btrsend dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Read the stream from FILE instead of standard input.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// Dump the stream.
pub fn run(_args: &DumpArgs) -> anyhow::Result<()> {
    anyhow::bail!("dump is not implemented yet")
}
