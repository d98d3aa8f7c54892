//! `btrsend manifest DIR`: one sorted line per path (see the core's `manifest` module).

use std::fs::File;
use std::io;
use std::path::PathBuf;

use anyhow::Context as _;
use btrsend::manifest::{self, Options};
use clap::Args;

/// Arguments of `btrsend manifest`.
///
/// The manifest starts with the line `# btrsend manifest v1`, then has one
/// line per path, sorted by the raw bytes of the path (the root is `.`):
/// the escaped path, its type (file, dir, symlink, fifo, sock, chr, blk, or
/// subvol for a nested subvolume, which is not descended into), then mode,
/// uid, gid, size (files and symlinks), mtime as SEC.NSEC, symlink target,
/// device numbers, hard-link group, BLAKE3 hash of file contents, data
/// ranges (with --holes) and all xattrs. Atime, ctime, inode numbers and
/// directory sizes are left out, so the manifests of a snapshot and of its
/// received copy are equal. Bytes outside printable ASCII, and backslashes,
/// are written as \xHH.
#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// The directory to describe.
    pub dir: PathBuf,
    /// Also record the data ranges of regular files (from SEEK_DATA and
    /// SEEK_HOLE) as `data=OFFSET+LENGTH,…`.
    #[arg(long)]
    pub holes: bool,
    /// Write the manifest to FILE instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Print the manifest.
pub fn run(args: &ManifestArgs) -> anyhow::Result<()> {
    let opts = Options { holes: args.holes };
    match &args.output {
        Some(path) => {
            let mut file =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            manifest::write_manifest(&args.dir, opts, &mut file)?;
            file.sync_all()
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        None => {
            let stdout = io::stdout();
            manifest::write_manifest(&args.dir, opts, &mut stdout.lock())?;
        }
    }
    Ok(())
}
