//! `btrsend manifest DIR`: one sorted line per path (see the core's `manifest` module),
//! of a mounted directory, or with `--device` of a subvolume read straight from the
//! filesystem's devices (the core's `fs::manifest`).

use std::fs::File;
use std::io;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use btrsend::device::readahead::ReadOptions;
use btrsend::fs::Filesystem;
use btrsend::fs::subvol::list_subvolumes;
use btrsend::manifest::{self, Options};
use btrsend::types::TreeId;
use clap::{Args, ValueHint};

/// Arguments of `btrsend manifest`.
///
/// The manifest starts with the line `# btrsend manifest v2`, then has one
/// line per path, sorted by the raw bytes of the path (the root is `.`):
/// the escaped path, its type (file, dir, symlink, fifo, sock, chr, blk, or
/// subvol for a nested subvolume, which is not descended into), then mode,
/// uid, gid, size (files and symlinks), mtime as SEC.NSEC, symlink target,
/// device numbers, hard-link group, content hash (BLAKE3 of the non-zero
/// 4 KiB blocks with their indexes, then the size; see the core's
/// `manifest` module), data
/// ranges (with --holes) and all xattrs. Atime, ctime, inode numbers and
/// directory sizes are left out, so the manifests of a snapshot and of its
/// received copy are equal. Bytes outside printable ASCII, and backslashes,
/// are written as \xHH.
///
/// With --device, nothing is mounted: the filesystem is read from its
/// devices or image files and DIR names a subvolume or snapshot by its path
/// from the top level (as `btrsend list` prints it), by `id:N` (as `send`
/// takes it; a bare N works too), or `.` for the top level.
#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// The directory to describe (with --device: the subvolume's path from
    /// the top level, or `id:N`).
    #[arg(value_hint = ValueHint::AnyPath)]
    pub dir: PathBuf,
    /// Also record the data ranges of regular files (from SEEK_DATA and
    /// SEEK_HOLE) as `data=OFFSET+LENGTH,…`.
    #[arg(long)]
    pub holes: bool,
    /// Write the manifest to FILE instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub output: Option<PathBuf>,
    /// Read the filesystem from this device or image file instead of a mounted
    /// directory (repeat for multi-device filesystems).
    #[arg(short = 'd', long = "device", value_name = "PATH", value_hint = ValueHint::FilePath)]
    pub devices: Vec<PathBuf>,
    /// With --device: verify data checksums while reading file contents.
    #[arg(long, requires = "devices")]
    pub verify_data: bool,
    /// With --device: read a filesystem some of whose devices are missing from the
    /// remaining copies (RAID1, RAID10, DUP on the others; RAID5/6 from
    /// parity), as `mount -o degraded` does. Without it, a device the
    /// filesystem lists that is not given is an error naming its devid and
    /// uuid.
    #[arg(long, requires = "devices")]
    pub degraded: bool,
}

/// The manifest of a subvolume read from the devices.
fn from_devices(args: &ManifestArgs, opts: Options) -> anyhow::Result<String> {
    let read = ReadOptions::default().with_degraded(args.degraded);
    let fs = Filesystem::open_with(&args.devices, &read)?;
    for notice in fs.volume().notices() {
        eprintln!("btrsend: warning: {notice}");
    }
    let given = args.dir.as_os_str().as_encoded_bytes();
    let want = given.strip_prefix(b"/").unwrap_or(given);
    let id = if want.is_empty() || want == b"." {
        TreeId::FS
    } else {
        let subvols = list_subvolumes(&fs)?;
        let exists = |n: u64| n == TreeId::FS.get() || subvols.iter().any(|s| s.id().get() == n);
        let number = |b: &[u8]| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
        };
        // `id:N` as `send` takes it, else the path from the top level, else
        // a bare id (which `manifest` took before `id:N`).
        let found = match given.strip_prefix(b"id:") {
            Some(n) => number(n).filter(|&n| exists(n)),
            None => subvols
                .iter()
                .find(|s| s.path == want)
                .map(|s| s.id().get())
                .or_else(|| number(want).filter(|&n| exists(n))),
        };
        match found {
            Some(n) => TreeId(n),
            None => bail!("no subvolume {} in this filesystem", args.dir.display()),
        }
    };
    let tree = fs.fs_tree(id)?;
    Ok(btrsend::fs::manifest::manifest(
        &tree,
        opts,
        args.verify_data,
    )?)
}

/// Print the manifest.
pub fn run(args: &ManifestArgs) -> anyhow::Result<()> {
    let opts = Options { holes: args.holes };
    if !args.devices.is_empty() {
        let text = from_devices(args, opts)?;
        match &args.output {
            Some(path) => std::fs::write(path, text)
                .with_context(|| format!("cannot write {}", path.display()))?,
            None => io::Write::write_all(&mut crate::exit::stdout(), text.as_bytes())?,
        }
        return Ok(());
    }
    match &args.output {
        Some(path) => {
            let mut file =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            manifest::write_manifest(&args.dir, opts, &mut file)?;
            file.sync_all()
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        None => {
            manifest::write_manifest(&args.dir, opts, &mut crate::exit::stdout())?;
        }
    }
    Ok(())
}
