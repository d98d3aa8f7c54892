//! `btrsend send`: write a full send stream of a subvolume read straight
//! from the filesystem's devices (core `btrsend::send`), given as
//! `--device` images or found from a path inside a mounted btrfs
//! (core `btrsend::mount`).

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use btrsend::fs::Filesystem;
use btrsend::fs::subvol::Subvolume;
use btrsend::mount::{self, MountedSubvol};
use btrsend::send::{self, MAX_PROTO, SendError, SendOptions};
use clap::builder::TypedValueParser as _;
use clap::{Args, ValueHint};

use crate::progress::{Mode, Op, Reporter};

/// Arguments of `btrsend send`.
#[derive(Debug, Args)]
#[command(after_long_help = SEND_HELP)]
pub struct SendArgs {
    /// A device or image file of the filesystem (repeat for multi-device
    /// filesystems). The filesystem should not be mounted read-write.
    /// Without it, SUBVOL is a path inside a mounted btrfs.
    #[arg(short = 'd', long = "device", value_name = "PATH", value_hint = ValueHint::FilePath)]
    pub devices: Vec<PathBuf>,
    /// Write the stream to FILE instead of standard output.
    #[arg(short = 'f', long = "file", value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub file: Option<PathBuf>,
    /// Protocol version: 1 (default, like btrfs-progs), 2, 3, or 0 for the
    /// highest this btrsend writes (2). `--compressed-data` without
    /// `--proto` means 2.
    #[arg(long = "proto", value_name = "N", value_parser = proto_parser())]
    pub proto: Option<u32>,
    /// Send compressed extents as they are stored (ENCODED_WRITE), without
    /// decompressing them; needs protocol 2 or later.
    #[arg(long = "compressed-data")]
    pub compressed_data: bool,
    /// Send no file data, only where it would go (UPDATE_EXTENT), like
    /// `btrfs send --no-data`.
    #[arg(long = "no-data")]
    pub no_data: bool,
    /// Verify file data against the filesystem's data checksums while
    /// sending; a bad copy is read from another mirror, and when no copy is
    /// good the send fails naming the inode, path, file offset, logical
    /// address and mirror.
    #[arg(long = "verify-data")]
    pub verify_data: bool,
    /// Threads that read, verify and decompress file data ahead of the
    /// stream writer (default 4); 0 does all of it on one thread. The
    /// stream is the same for every count.
    #[arg(long = "threads", value_name = "N", value_parser = clap::value_parser!(u16).range(0..=256), value_hint = ValueHint::Other)]
    pub threads: Option<u16>,
    /// Show progress on standard error: a bar on a terminal, otherwise a
    /// line every few seconds and a summary (default: a bar when standard
    /// error is a terminal, else nothing).
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long, overrides_with = "progress")]
    pub no_progress: bool,
    /// Send an incremental stream against PARENT, a snapshot the receiver
    /// already has (given like SUBVOL): only the differences are sent.
    #[arg(short = 'p', long = "parent", value_name = "PARENT", value_hint = ValueHint::AnyPath)]
    pub parent: Option<String>,
    /// A further snapshot the receiver has whose data may be cloned
    /// (repeatable; given like SUBVOL): extents shared with it are sent as
    /// clones, as with `btrfs send -c`. Without -p, the parent is chosen
    /// among the clone sources as btrfs-progs does: the snapshot SUBVOL was
    /// taken of, else the other snapshot of the same subvolume whose
    /// ctransid is closest.
    #[arg(short = 'c', long = "clone-src", value_name = "CLONE_SRC", value_hint = ValueHint::AnyPath)]
    pub clone_src: Vec<String>,
    /// The subvolume: with --device, its path from the top level as
    /// `btrsend list` prints it, or `id:N`; without, the path of a read-only
    /// snapshot in a mounted btrfs (e.g. /mnt/snaps/daily).
    #[arg(value_name = "SUBVOL")]
    pub subvol: String,
}

const SEND_HELP: &str = "\
The stream has the same commands, in the same order, as the kernel's
`btrfs send` of the same snapshot (Linux 6.3 and later): `btrfs receive` on
another machine recreates the subvolume with the same received UUID, so later
incremental streams chain onto it. btrsend reads the devices directly; the
filesystem need not be mounted. A binary stream is never written to a
terminal. If the reader of the stream goes away (a closed pipe), btrsend
fails with exit status 1.

Without --device, SUBVOL is a path in a mounted btrfs: btrsend finds the
mount (/proc/self/mountinfo), its devices (/sys/fs/btrfs/FSID/devices) and
the subvolume's path from the top level, syncs the filesystem, drops the
devices' page cache and reads them directly (reading the devices needs the
permission to). As with `btrfs send`, only read-only snapshots of a mounted
filesystem can be sent; of an image given with --device, any subvolume. If a
block fails verification because the kernel moved it meanwhile (a balance),
btrsend rereads the superblock and chunk map and starts again once if the
failure came within the first 4 MiB of the stream (held back until then),
and otherwise fails: the stream is then incomplete. After the send, btrsend
fails if chunks were removed or moved meanwhile, since blocks read through
the old chunk map may be stale.

Progress: the total is the file data the snapshot's extent items reference,
from a metadata-only pass over its tree before the send (only when progress
is shown).";

/// `--proto`'s values, listed (not a range) so that shells complete them.
fn proto_parser() -> impl clap::builder::TypedValueParser<Value = u32> {
    // Only the listed strings reach `map`, and each parses.
    clap::builder::PossibleValuesParser::new(["0", "1", "2", "3"])
        .map(|v| v.parse::<u32>().unwrap_or(MAX_PROTO))
}

/// The options the arguments ask for.
pub fn options(args: &SendArgs) -> anyhow::Result<SendOptions> {
    let version = match args.proto {
        Some(0) => MAX_PROTO,
        Some(v) => v,
        None if args.compressed_data => 2,
        None => 1,
    };
    if args.compressed_data && version < 2 {
        crate::usage_bail!("--compressed-data needs protocol 2 or later (--proto {version} given)");
    }
    let opts = SendOptions::new(version)
        .with_compressed_data(args.compressed_data)
        .with_no_data(args.no_data)
        .with_verify_data(args.verify_data);
    Ok(match args.threads {
        Some(n) => opts.with_threads(n.into()),
        None => opts,
    })
}

/// Where the filesystem comes from.
struct Source {
    fs: Filesystem,
    /// The subvolume as `find_subvolume` takes it.
    spec: String,
    /// Set when SUBVOL was a path in a mounted btrfs.
    mounted: Option<MountedSubvol>,
}

impl Source {
    fn open(args: &SendArgs) -> anyhow::Result<Source> {
        if !args.devices.is_empty() {
            let fs = Filesystem::open(&args.devices)?;
            return Ok(Source {
                fs,
                spec: args.subvol.clone(),
                mounted: None,
            });
        }
        if args.subvol.starts_with("id:") {
            bail!(
                "{} needs --device: without it SUBVOL is a path in a mounted btrfs",
                args.subvol
            );
        }
        let m = mount::resolve(Path::new(&args.subvol))?;
        if m.subvol_path.is_empty() {
            bail!(
                "{} is the top level of the filesystem, not a read-only snapshot",
                m.path.display()
            );
        }
        let fs = open_mounted(&m)?;
        Ok(Source {
            fs,
            spec: m.subvol_path.clone(),
            mounted: Some(m),
        })
    }

    fn subvolume(&self) -> anyhow::Result<Subvolume> {
        let subvol = send::find_subvolume(&self.fs, &self.spec)?;
        if let Some(m) = &self.mounted
            && !subvol.root.is_readonly()
        {
            bail!(
                "{} is not a read-only subvolume: on a mounted filesystem only read-only \
                 snapshots can be sent (as with btrfs send); make one with \
                 `btrfs subvolume snapshot -r {} SNAP`",
                m.path.display(),
                m.path.display()
            );
        }
        Ok(subvol)
    }
}

/// Sync the mounted filesystem, drop its devices' stale page cache, and
/// open the devices.
fn open_mounted(m: &MountedSubvol) -> anyhow::Result<Filesystem> {
    m.sync()?;
    mount::drop_page_cache(&m.devices)?;
    let list = m
        .devices
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Filesystem::open(&m.devices).with_context(|| {
        format!(
            "cannot read the filesystem mounted at {} from its devices ({list})",
            m.mount_point.display()
        )
    })
}

/// After a send from a mounted filesystem: fail if its chunk layout
/// changed meanwhile (a balance relocated block groups), since blocks read
/// through the old chunk map may then be stale.
fn check_layout(m: &MountedSubvol, fs: &Filesystem) -> anyhow::Result<()> {
    let Some(dev) = m.devices.first() else {
        return Ok(());
    };
    mount::drop_page_cache(std::slice::from_ref(dev))?;
    let device = btrsend::device::FileDevice::open(dev)?;
    let (now, _) = btrsend::superblock::read_superblock(&device)?;
    let was = fs.volume().superblock().chunk_root_generation;
    if now.chunk_root_generation == was {
        return Ok(());
    }
    // New chunks being allocated is harmless; a chunk gone or changed is not.
    let fresh = btrsend::volume::Volume::open(&m.devices)?;
    let new = fresh.chunk_map().chunks();
    let kept = fs
        .volume()
        .chunk_map()
        .chunks()
        .iter()
        .all(|c| new.contains(c));
    if !kept {
        bail!(
            "the chunk layout of the filesystem mounted at {} changed during the send (chunks \
             removed or moved; chunk tree generation {} then {}: a balance?); the stream may hold stale blocks: run the \
             send again",
            m.mount_point.display(),
            was.get(),
            now.chunk_root_generation.get()
        );
    }
    Ok(())
}

/// Bytes of the stream held back, when sending from a mounted filesystem,
/// before any reaches the output: a send that fails within them (a block
/// the kernel moved) starts again from a fresh superblock.
const HOLD_BYTES: usize = 4 << 20;

/// The output: holds back the first `hold` bytes, counts what reached the
/// inner writer.
struct Held<W> {
    inner: W,
    held: Vec<u8>,
    hold: usize,
    /// Bytes that reached `inner`.
    written: u64,
}

impl<W: Write> Held<W> {
    fn new(inner: W, hold: usize) -> Held<W> {
        Held {
            inner,
            held: Vec::new(),
            hold,
            written: 0,
        }
    }

    /// Pass the held bytes on and hold no more.
    fn release(&mut self) -> std::io::Result<()> {
        self.hold = 0;
        if !self.held.is_empty() {
            self.inner.write_all(&self.held)?;
            self.written = self.written.saturating_add(self.held.len() as u64);
            self.held = Vec::new();
        }
        Ok(())
    }

    /// Forget the held bytes (before starting again).
    fn discard(&mut self) {
        self.held.clear();
    }
}

impl<W: Write> Write for Held<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.held.len().saturating_add(buf.len()) <= self.hold {
            self.held.extend_from_slice(buf);
            return Ok(buf.len());
        }
        self.release()?;
        let n = self.inner.write(buf)?;
        self.written = self.written.saturating_add(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.release()?;
        self.inner.flush()
    }
}

/// Whether a send error is a failed read of the filesystem (which, on a
/// mounted one, a concurrent balance may explain).
fn is_read_error(e: &SendError) -> bool {
    matches!(e, SendError::Fs { .. } | SendError::Corrupt { .. })
}

/// Send.
pub fn run(args: &SendArgs) -> anyhow::Result<()> {
    let opts = options(args)?;
    if args.file.is_none() && std::io::stdout().is_terminal() {
        bail!(
            "not writing a binary send stream to a terminal: redirect standard output or use -f FILE"
        );
    }
    let mut src = Source::open(args)?;
    for notice in src.fs.volume().notices() {
        eprintln!("btrsend: warning: {notice}");
    }
    let mut subvol = src.subvolume()?;
    let spec_of = |p: &String| -> anyhow::Result<String> {
        if !args.devices.is_empty() || p.starts_with("id:") {
            Ok(p.clone())
        } else {
            Ok(mount::resolve(Path::new(p))?.subvol_path.clone())
        }
    };
    let parent_spec = args.parent.as_ref().map(spec_of).transpose()?;
    let clone_specs = args
        .clone_src
        .iter()
        .map(spec_of)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mounted = src.mounted.is_some();
    let find_roots = |fs: &btrsend::fs::Filesystem,
                      subvol: &Subvolume|
     -> anyhow::Result<(Option<Subvolume>, Vec<Subvolume>)> {
        let mut clones = Vec::new();
        for (spec, given) in clone_specs.iter().zip(&args.clone_src) {
            let c = send::find_subvolume(fs, spec)?;
            if mounted && !c.root.is_readonly() {
                bail!("clone source {given} is not a read-only subvolume (as with btrfs send)");
            }
            clones.push(c);
        }
        let parent = match &parent_spec {
            Some(spec) => Some(send::find_subvolume(fs, spec)?),
            None if !clones.is_empty() => Some(send::find_good_parent(fs, subvol, &clones)?),
            None => None,
        };
        Ok((parent, clones))
    };
    let (mut parent, mut clones) = find_roots(&src.fs, &subvol)?;
    let out: Box<dyn Write> = match &args.file {
        Some(f) => {
            Box::new(File::create(f).with_context(|| format!("cannot create {}", f.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let hold = if src.mounted.is_some() { HOLD_BYTES } else { 0 };
    let mut out = Held::new(out, hold);
    let mode = Mode::choose(args.progress, args.no_progress, false);
    let total = if mode == Mode::Off {
        0
    } else {
        let t = Instant::now();
        let total = send::total::data_bytes(&src.fs, &subvol).map_err(|e| send_error(e, args))?;
        if std::env::var_os("BTRSEND_DEBUG_TOTAL").is_some() {
            eprintln!(
                "btrsend: total pass: {total} bytes in {:.3}s",
                t.elapsed().as_secs_f64()
            );
        }
        total
    };
    let progress = Reporter::new(mode, Op::Send, Some(total), false);
    let send_one = |fs: &btrsend::fs::Filesystem,
                    subvol: &Subvolume,
                    parent: Option<&Subvolume>,
                    clones: &[Subvolume],
                    out: &mut Held<Box<dyn Write>>| {
        send::send_with_clone_sources(fs, subvol, parent, clones, out, opts, &progress)
            .map(|(_, stats)| stats)
    };
    let mut res = send_one(&src.fs, &subvol, parent.as_ref(), &clones, &mut out);
    if let (Err(e), Some(m)) = (&res, &src.mounted)
        && is_read_error(e)
    {
        // The kernel may have moved blocks (balance): reread the superblock
        // and the chunk map; start again if nothing was written yet.
        let before = src.fs.volume().superblock().generation;
        let fresh = open_mounted(m)?;
        let after = fresh.volume().superblock().generation;
        if out.written > 0 {
            progress.finish(false, None);
            let e = res.err().map(|e| send_error(e, args));
            let e = e.unwrap_or_else(|| anyhow::anyhow!("send failed"));
            return Err(e.context(format!(
                "a block failed to read or verify on the mounted filesystem (generation \
                 {before} then {after}); the stream already written is incomplete: run the \
                 send again"
            )));
        }
        out.discard();
        src.fs = fresh;
        subvol = src.subvolume()?;
        (parent, clones) = find_roots(&src.fs, &subvol)?;
        res = send_one(&src.fs, &subvol, parent.as_ref(), &clones, &mut out);
    }
    progress.finish(
        res.is_ok(),
        res.as_ref().ok().map(|stats| stats.stream_bytes),
    );
    if let Ok(stats) = &res
        && std::env::var_os("BTRSEND_DEBUG_EXTENT_TREE").is_some()
    {
        let x = stats.extent_tree;
        eprintln!(
            "btrsend: extent tree: {} lookups, {} cached, {} in leaf, {} forward ({} leaves), \
             {} searches from the root, {} from a subtree, {} block reads",
            x.lookups,
            x.cache_hits,
            x.in_leaf,
            x.forward,
            x.leaves_stepped,
            x.descents,
            x.subtree_descents,
            x.block_reads
        );
    }
    if std::env::var_os("BTRSEND_DEBUG_CACHE").is_some() {
        eprintln!("btrsend: block cache: {:?}", src.fs.volume().cache_stats());
    }
    match res {
        Ok(_stats) => match out.flush() {
            Ok(()) => match &src.mounted {
                Some(m) => check_layout(m, &src.fs),
                None => Ok(()),
            },
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(broken_pipe()),
            Err(e) => Err(anyhow::Error::new(e).context("cannot write the send stream")),
        },
        Err(e) if e.is_broken_pipe() => Err(broken_pipe()),
        Err(e) => Err(send_error(e, args)),
    }
}

fn broken_pipe() -> anyhow::Error {
    anyhow::anyhow!(
        "the reader of the stream went away (broken pipe): the stream it got is incomplete"
    )
}

fn send_error(e: SendError, args: &SendArgs) -> anyhow::Error {
    let dev = if args.devices.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = args
            .devices
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        format!(" from {}", list.join(", "))
    };
    anyhow::Error::new(e).context(format!("cannot send {}{dev}", args.subvol))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::Held;

    #[test]
    fn held_output_passes_on_only_past_the_hold_or_on_flush() {
        let mut h = Held::new(Vec::new(), 8);
        h.write_all(b"abcd").unwrap();
        assert_eq!((h.written, h.inner.len()), (0, 0));
        h.discard();
        h.write_all(b"efgh").unwrap();
        h.write_all(b"ijklm").unwrap();
        assert_eq!(h.inner, b"efghijklm");
        assert_eq!(h.written, 9);
        h.write_all(b"n").unwrap();
        assert_eq!(h.inner, b"efghijklmn", "holds no more once released");
        let mut h = Held::new(Vec::new(), 8);
        h.write_all(b"xy").unwrap();
        h.flush().unwrap();
        assert_eq!((h.inner.as_slice(), h.written), (&b"xy"[..], 2));
    }
}
