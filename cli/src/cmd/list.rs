//! `btrsend list`: the subvolumes of a filesystem read straight from its devices.

use std::path::PathBuf;

use clap::Args;

/// Arguments of `btrsend list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// A device or image file of the filesystem (repeat for multi-device filesystems).
    #[arg(short = 'd', long = "device", value_name = "PATH", required = true)]
    pub devices: Vec<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// List the subvolumes.
pub fn run(_args: &ListArgs) -> anyhow::Result<()> {
    anyhow::bail!("list is not available yet")
}
