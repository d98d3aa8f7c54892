//! `btrsend manifest DIR`: one sorted line per path (see the core's `manifest` module).

use std::path::PathBuf;

use clap::Args;

/// Arguments of `btrsend manifest`.
#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// The directory to describe.
    pub dir: PathBuf,
}

/// Print the manifest.
pub fn run(_args: &ManifestArgs) -> anyhow::Result<()> {
    anyhow::bail!("manifest is not implemented yet")
}
