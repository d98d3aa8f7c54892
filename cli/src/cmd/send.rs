//! `btrsend send`: write a full send stream of a subvolume read straight
//! from the filesystem's devices (core `btrsend::send`).

use std::cell::Cell;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use btrsend::fs::Filesystem;
use btrsend::send::{self, MAX_PROTO, Progress, SendError, SendOptions};
use clap::Args;

/// Arguments of `btrsend send`.
#[derive(Debug, Args)]
#[command(after_long_help = SEND_HELP)]
pub struct SendArgs {
    /// A device or image file of the filesystem (repeat for multi-device
    /// filesystems). The filesystem should not be mounted read-write.
    #[arg(short = 'd', long = "device", value_name = "PATH", required = true)]
    pub devices: Vec<PathBuf>,
    /// Write the stream to FILE instead of standard output.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Protocol version: 1 (default, like btrfs-progs), 2, 3, or 0 for the
    /// highest this btrsend writes (2). `--compressed-data` without
    /// `--proto` means 2.
    #[arg(long = "proto", value_name = "N", value_parser = clap::value_parser!(u32).range(0..=3))]
    pub proto: Option<u32>,
    /// Send compressed extents as they are stored (ENCODED_WRITE), without
    /// decompressing them; needs protocol 2 or later.
    #[arg(long = "compressed-data")]
    pub compressed_data: bool,
    /// Send no file data, only where it would go (UPDATE_EXTENT), like
    /// `btrfs send --no-data`.
    #[arg(long = "no-data")]
    pub no_data: bool,
    /// Show progress on standard error (default: when it is a terminal).
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long, overrides_with = "progress")]
    pub no_progress: bool,
    /// The subvolume: its path from the top level as `btrsend list` prints
    /// it, or `id:N`.
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
fails with exit status 1.";

/// Progress on standard error: inodes and data bytes.
struct CliProgress {
    bar: indicatif::ProgressBar,
    bytes: Cell<u64>,
}

impl Progress for CliProgress {
    fn inode(&self, ino: u64) {
        if ino.is_multiple_of(256) {
            self.bar.set_message(format!("inode {ino}"));
        }
    }
    fn data(&self, bytes: u64) {
        let n = self.bytes.get().saturating_add(bytes);
        self.bytes.set(n);
        self.bar.set_position(n);
    }
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
        bail!("--compressed-data needs protocol 2 or later (--proto {version} given)");
    }
    Ok(SendOptions::new(version)
        .with_compressed_data(args.compressed_data)
        .with_no_data(args.no_data))
}

/// Send.
pub fn run(args: &SendArgs) -> anyhow::Result<()> {
    let opts = options(args)?;
    if args.file.is_none() && std::io::stdout().is_terminal() {
        bail!(
            "not writing a binary send stream to a terminal: redirect standard output or use -f FILE"
        );
    }
    let fs = Filesystem::open(&args.devices)?;
    for notice in fs.volume().notices() {
        eprintln!("btrsend: warning: {notice}");
    }
    let subvol = send::find_subvolume(&fs, &args.subvol)?;
    let out: Box<dyn Write> = match &args.file {
        Some(f) => {
            Box::new(File::create(f).with_context(|| format!("cannot create {}", f.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let show = !args.no_progress && (args.progress || std::io::stderr().is_terminal());
    let progress = CliProgress {
        bar: if show {
            let b = indicatif::ProgressBar::no_length();
            let style = indicatif::ProgressStyle::with_template(
                "{spinner} {msg} {bytes} {bytes_per_sec} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner());
            b.set_style(style);
            b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            b
        } else {
            indicatif::ProgressBar::hidden()
        },
        bytes: Cell::new(0),
    };
    let res = send::send_full(&fs, &subvol, out, opts, &progress);
    progress.bar.finish_and_clear();
    match res {
        Ok((mut out, _stats)) => match out.flush() {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(broken_pipe()),
            Err(e) => Err(anyhow::Error::new(e).context("cannot write the send stream")),
        },
        Err(e) if e.is_broken_pipe() => Err(broken_pipe()),
        Err(e) => Err(send_error(e, &args.subvol)),
    }
}

fn broken_pipe() -> anyhow::Error {
    anyhow::anyhow!(
        "the reader of the stream went away (broken pipe): the stream it got is incomplete"
    )
}

fn send_error(e: SendError, subvol: &str) -> anyhow::Error {
    anyhow::Error::new(e).context(format!("cannot send {subvol}"))
}
