//! `btrsend send`: write full or incremental send streams of subvolumes
//! read straight from the filesystem's devices (core `btrsend::send`), given as
//! `--device` images or found from a path inside a mounted btrfs
//! (core `btrsend::send::mounted`: the policy for a mounted filesystem).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::bail;
use btrsend::device::readahead::ReadOptions;
use btrsend::send::mounted::{Request, Source};
use btrsend::send::several::{self, Event, OwnedRequest, Sent, Several};
use btrsend::send::{self, MAX_PROTO, SendError, SendOptions};
use clap::builder::TypedValueParser as _;
use clap::{Args, ValueHint};

use crate::progress::{Mode, Op, Reporter};
use crate::signal::OutputFile;

/// Arguments of `btrsend send`.
#[derive(Debug, Args)]
#[command(after_long_help = SEND_HELP)]
pub struct SendArgs {
    /// A device or image file of the filesystem (repeat for multi-device
    /// filesystems). It may be mounted: see MOUNTED FILESYSTEMS below.
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
    /// sending, as the kernel's own reads do (the default): a bad copy is
    /// read from another mirror, and when no copy is good the send fails
    /// naming the inode, path, file offset, logical address and mirror.
    /// Files without checksums (nodatasum, nodatacow) are read unchecked,
    /// as the kernel reads them.
    #[arg(long = "verify-data", overrides_with = "no_verify_data")]
    pub verify_data: bool,
    /// Send file data without verifying its checksums: saves the CPU time
    /// verification costs, about 0.1 s per GiB of file data (see
    /// VERIFICATION below).
    #[arg(long = "no-verify-data", overrides_with = "verify_data")]
    pub no_verify_data: bool,
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
    /// Write no stream: print the exact number of bytes the stream would
    /// have (with the same arguments), found from the metadata without
    /// reading any file data (see ESTIMATE below).
    #[arg(long, conflicts_with = "file")]
    pub estimate: bool,
    /// Continue an interrupted send: TOKEN is the line `btrsend receive
    /// --resume-token DIR/NAME` prints where the receive was interrupted.
    /// Give the same SUBVOLs, parent, clone sources and options as the
    /// interrupted send (a token that does not match them is refused); only
    /// the rest of the stream is written, for `btrsend receive` (see RESUME
    /// below).
    #[arg(long, value_name = "TOKEN", conflicts_with = "estimate")]
    pub resume: Option<String>,
    /// With --estimate: print a JSON object with the stream's size and
    /// what it holds.
    #[arg(long, requires = "estimate")]
    pub json: bool,
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
    /// Read a filesystem some of whose devices are missing from the
    /// remaining copies (RAID1, RAID10, DUP on the others; RAID5/6 from
    /// parity), as `mount -o degraded` does. Without it, a device the
    /// filesystem lists that is not given is an error naming its devid and
    /// uuid.
    #[arg(long)]
    pub degraded: bool,
    /// Bound the cache of metadata blocks to MIB MiB (16 or more; default
    /// 64, or the environment variable BTRSEND_CACHE_MIB); with progress
    /// shown, the pass that computes its total takes 16 MiB of it. A send's
    /// peak memory is about this plus 45 MiB, whatever the snapshot's size
    /// (see MEMORY below).
    #[arg(long = "cache-size", value_name = "MIB", value_parser = clap::value_parser!(u32).range(16..), value_hint = ValueHint::Other)]
    pub cache_size: Option<u32>,
    /// Write the stream at most RATE bytes per second on average (K, M, G:
    /// times 1024, 1024², 1024³, as curl reads them; e.g. 10M), so that a
    /// send over a network leaves room on the link. Bursts after a pause
    /// are at most a tenth of a second's worth.
    #[arg(long = "limit-rate", value_name = "RATE", value_parser = crate::cmd::parse_rate)]
    pub limit_rate: Option<u64>,
    /// Print only errors: no warnings, no progress (unless --progress is
    /// given too), as `btrfs send -q`.
    #[arg(short = 'q', long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Print "At subvol SUBVOL" on standard error as each subvolume starts
    /// (what `btrfs send` prints by default; btrsend is silent by default,
    /// for cron).
    #[arg(short = 'v', long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// The subvolumes to send, one stream each, concatenated in this order
    /// as `btrfs send A B` writes them: with --device, paths from the top
    /// level as `btrsend list` prints them, or `id:N`; without, paths of
    /// read-only snapshots in a mounted btrfs (e.g. /mnt/snaps/daily).
    #[arg(value_name = "SUBVOL", required = true, value_hint = ValueHint::AnyPath)]
    pub subvols: Vec<String>,
}

const SEND_HELP: &str = "\
The stream has the same commands, in the same order, as the kernel's
`btrfs send` of the same snapshot (Linux 6.3 and later): `btrfs receive` on
another machine recreates the subvolume with the same received UUID, so later
incremental streams chain onto it. btrsend reads the devices directly; the
filesystem need not be mounted. A binary stream is never written to a
terminal. If the reader of the stream goes away (a closed pipe), btrsend
says so and exits with status 141, as every subcommand does.

Several SUBVOLs give one stream each, concatenated in the order given, as
`btrfs send A B` writes them (`btrfs receive` and `btrsend receive` take
them in one go). With -c and no -p, each subvolume sent becomes a clone
source of the next ones, whose parent is then chosen among the clone
sources as btrfs-progs does; with -p each is sent against that parent.
Every subvolume, parent and clone source is found before anything is
written.

`btrsend SNAPSHOT... [send options]` is short for `btrsend send SNAPSHOT...
[send options]` when its first word is not a subcommand's name (see
`btrsend --help`).

With -f FILE the stream is written to a temporary file beside FILE
(.FILE.XXXXXX.part, mode 0600) and renamed to FILE only when complete: on
an error (a full disk, a read error) or on SIGINT/SIGTERM the temporary file
is removed and a FILE that existed before is left as it was. A FILE that
is not a regular file (a FIFO, /dev/null) is written directly.

Without --device, SUBVOL is a path in a mounted btrfs: btrsend finds the
mount (/proc/self/mountinfo), its devices (/sys/fs/btrfs/FSID/devices) and
the subvolume's path from the top level, and reads the devices directly
(reading them needs the permission to). As with `btrfs send`, only
read-only snapshots of a mounted filesystem can be sent; of an unmounted
image given with --device, any subvolume.

MOUNTED FILESYSTEMS: a --device that belongs to a mounted btrfs (a block
device listed in /sys/fs/btrfs/FSID/devices, or an image file backing a
loop device listed there; a copy of an image with the same UUID does not
count) is read as a path is. If it is mounted read-write: btrsend syncs the
filesystem, drops the page cache of the block devices it reads (the kernel
writes around that cache, so pages cached earlier can be stale), and sends
only read-only subvolumes (parent and clone sources too). If a block fails
to read or verify because the kernel moved it meanwhile (a balance),
btrsend rereads the superblock, the chunk map and the snapshot's roots,
plans the send again and continues the stream at the byte where it
stopped (a note on stderr says so, unless --quiet): the stream stays
continuous and receives to the snapshot's exact tree. (The stream depends on the layout, as btrfs send's does: the data
commands of each extent before that point, such as which clone source,
are made again as they were, and if the commands planned again before it
still differ from those written, the send fails saying the stream is
incomplete: run it again.) After the
send, btrsend fails if file data was read without checksums (nodatasum
files, --no-verify-data) and chunks were removed or moved meanwhile (that
data may be stale); the stream's final END command is withheld then, so
a receiver of it fails too: run the send again.
A read-only mount only has its block devices' page cache dropped first.

VERIFICATION: every tree block is checked (checksum, address, generation)
and, by default, every data block against its stored checksum, reading
another copy (DUP, RAID1, …) when one is bad. This costs CPU time for the
checksum lookups and crc32c over the data: about 0.1 s per GiB of file data
on a current x86-64 machine (measured: +0.43 CPU-seconds for a 4 GiB send
from a warm cache, about a third more CPU than without). Files without
checksums (nodatasum or nodatacow) cannot be verified; on a mounted
filesystem the sync, the cache drop and the layout check above keep them
right. --no-verify-data skips verification and sends data unchecked.

ESTIMATE: --estimate plans the whole send as it would be made (the same
commands, the same WRITE sizes, ENCODED_WRITE with each extent's stored
size) without reading file data, and prints the stream's length in bytes,
exact to the byte, for full and incremental sends, every protocol and
--compressed-data. It costs the metadata walk of the send: a small part
of a data-heavy send, most of one whose files are tiny. With --json, an
object: stream_bytes, commands, files, directories, data_bytes,
encoded_bytes, cloned_bytes, writes, encoded_writes, clones, and
by_command (each command's count, e.g. WRITE).

RESUME: a receive by `btrsend receive` keeps a resume point: every 48 MiB
of stream it takes a checkpoint in DIR/.btrsend-resume/NAME/ (a hidden
snapshot on btrfs as root, an undo journal in directory mode). After an interruption (either side
killed, a closed pipe, a full disk), `btrsend receive --resume-token DIR/NAME`
prints a token; `btrsend send --resume TOKEN` with the same arguments
writes the rest of the stream from that point (re-reading no file data
before it; at most 64 MiB of what was sent before is sent again), and
`btrsend receive DIR` rolls NAME back to its checkpoint and finishes it,
into the same tree as an uninterrupted receive. Over ssh:
  btrsend send -p OLD NEW | ssh host btrsend receive /backup
  (interrupted)
  T=$(ssh host btrsend receive --resume-token /backup/NEW)
  btrsend send --resume \"$T\" -p OLD NEW | ssh host btrsend receive /backup
The continuation starts with a header btrfs-progs refuses (\"unexpected
header\"): `btrfs receive` cannot take it. With several SUBVOLs, those
before the token's are skipped and those after it sent whole.

MEMORY: a send holds a bounded cache of metadata blocks (--cache-size,
default 64 MiB), at most 32 MiB of commands and data on their way out, and
small bounded tables; its peak memory was 70-110 MiB on snapshots of 50k
to 2M files and on 3 GiB of data. A larger cache rarely helps: the walk
reads each block once and readahead feeds it.

Progress: bytes of the stream written, of a total that is the stream's
exact size: --estimate's pass, run on a thread beside the send (only when
progress is shown), sets it when done; until then the bar shows bytes,
rate and elapsed time. That pass reads the metadata a second time: on a
send of many small files it competes with the send for the CPU (and
--no-progress saves it); on a data-heavy send it ends early.";

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
        .with_verify_data(!args.no_verify_data);
    Ok(match args.threads {
        Some(n) => opts.with_threads(n.into()),
        None => opts,
    })
}

/// Each subvolume's clone sources, as btrfs-progs sends `btrfs send A B
/// …`: with `-c` and no `-p`, every subvolume sent becomes a clone source of
/// the next (whose parent is then chosen among them); with `-p`, or with
/// neither, each is sent alone against the same parent (or none).
fn clone_lists(args: &SendArgs) -> Vec<Vec<String>> {
    let chain = !args.clone_src.is_empty() && args.parent.is_none();
    let mut clones = args.clone_src.clone();
    let mut lists = Vec::with_capacity(args.subvols.len());
    for s in &args.subvols {
        lists.push(clones.clone());
        if chain && !clones.contains(s) {
            clones.push(s.clone());
        }
    }
    lists
}

/// Send.
pub fn run(args: &SendArgs) -> anyhow::Result<()> {
    let opts = options(args)?;
    if args.file.is_none() && !args.estimate && std::io::stdout().is_terminal() {
        bail!(
            "not writing a binary send stream to a terminal: redirect standard output or use -f FILE"
        );
    }
    // clap requires at least one SUBVOL.
    let first = args.subvols.first().map_or("", String::as_str);
    let mut read = ReadOptions::default().with_degraded(args.degraded);
    if let Some(mib) = args.cache_size {
        read = read.with_cache_mib(mib as usize);
    }
    let mode = Mode::choose(args.progress, args.no_progress, args.quiet);
    let (read, estimate_read) = several::split_cache(read, mode != Mode::Off);
    let mut src = Source::open_with(&args.devices, first, &read).map_err(|e| match e {
        // `id:N` without --device: the command line is wrong (exit 2).
        SendError::NeedsDevice(_) => anyhow::Error::new(crate::exit::UsageError(e.to_string())),
        e => e.into(),
    })?;
    if !args.quiet {
        for notice in src.fs().volume().notices() {
            eprintln!("btrsend: warning: {notice}");
        }
    }
    let lists = clone_lists(args);
    let requests: Vec<Request<'_>> = args
        .subvols
        .iter()
        .zip(&lists)
        .map(|(given, clones)| Request {
            subvol: given,
            parent: args.parent.as_deref(),
            clone_sources: clones,
        })
        .collect();
    let token = match &args.resume {
        Some(t) => Some(btrsend::resume::Token::parse(t).map_err(|e| {
            anyhow::Error::new(crate::exit::UsageError(format!(
                "invalid --resume token: {e}"
            )))
        })?),
        None => None,
    };
    let batch = Several::check(&src, &requests, token.as_ref())?;
    if args.estimate {
        let all = batch
            .estimate(&src, opts)
            .map_err(|f| send_error(*f.error, args, f.subvol))?;
        return print_estimate(&all, args.json);
    }
    let progress = std::sync::Arc::new(Reporter::new(mode, Op::Send, None, args.quiet));
    // The bar's total: the streams' exact size, from the estimate's pass
    // on a thread beside the send (it ends long before a data-heavy send
    // does).
    let estimate = (mode != Mode::Off).then(|| {
        let bar = progress.clone();
        several::spawn_total(
            src.beside(),
            requests.iter().map(OwnedRequest::of).collect(),
            opts,
            estimate_read,
            move |total| bar.set_total(total),
        )
    });
    // A file is written under a temporary name and renamed when complete
    // (see `signal.rs`): FILE never holds a partial stream.
    let mut file = match &args.file {
        Some(f) => Some(OutputFile::create(f)?),
        None => None,
    };
    let mut stdout = crate::exit::stdout();
    let unlimited: &mut dyn Write = match &mut file {
        Some(f) => f,
        None => &mut stdout,
    };
    let mut limited = args.limit_rate.map(|rate| {
        btrsend::rate::Limited::new(
            &mut *unlimited,
            std::sync::Arc::new(btrsend::rate::RateLimit::new(rate)),
        )
    });
    let inner: &mut dyn Write = match &mut limited {
        Some(l) => l,
        None => unlimited,
    };
    let mut counted = Counted {
        inner,
        progress: &progress,
    };
    let out: &mut dyn Write = if mode == Mode::Off {
        counted.inner
    } else {
        &mut counted
    };
    let mut events = |event: Event<'_>| match event {
        Event::Starting(subvol) => {
            if args.verbose > 0 {
                progress.println(&format!("At subvol {subvol}"));
            }
        }
        Event::Sent(done) => {
            debug_figures(&done);
            let stats = done.stats;
            if stats.continued > 0 && !args.quiet {
                progress.println(&format!(
                    "btrsend: note: a balance moved blocks during the send of {}; its \
                     stream continued where it stopped (last at byte {}, {} time(s))",
                    done.subvol, stats.continued_at, stats.continued
                ));
            }
        }
    };
    let sent_res = batch.send(
        &mut src,
        opts,
        token.as_ref(),
        &mut *out,
        &*progress,
        &mut events,
    );
    let stream_bytes = sent_res.as_ref().map_or(0, |&b| b);
    let mut res = sent_res.map(drop).map_err(|f| match *f.error {
        e if e.is_broken_pipe() => broken_pipe(),
        e => send_error(e, args, f.subvol),
    });
    if res.is_ok() {
        res = out.flush().map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => broken_pipe(),
            _ => anyhow::Error::new(e).context("cannot write the send stream"),
        });
    }
    if std::env::var_os("BTRSEND_DEBUG_TOTAL").is_some()
        && let Some(handle) = estimate
    {
        // Tests: wait for the total, and show it beside the stream's size.
        match handle.join() {
            Ok(Ok(total)) => progress.println(&format!(
                "btrsend: total {total} bytes, stream {stream_bytes} bytes"
            )),
            Ok(Err(e)) => {
                progress.println(&format!("btrsend: no total: {:#}", anyhow::Error::new(e)))
            }
            Err(_) => progress.println("btrsend: no total: the estimate's thread panicked"),
        }
    }
    progress.finish(res.is_ok(), Some(stream_bytes));
    res?;
    if let Some(f) = file {
        f.commit()?;
    }
    Ok(())
}

/// The stream on its way out: counts what is written for the progress.
struct Counted<'a> {
    inner: &'a mut dyn Write,
    progress: &'a Reporter,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.progress.wrote(n as u64);
        Ok(n)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(buf)?;
        self.progress.wrote(buf.len() as u64);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The figures the `BTRSEND_DEBUG_*` variables ask for, after each stream.
fn debug_figures(done: &Sent<'_>) {
    if std::env::var_os("BTRSEND_DEBUG_EXTENT_TREE").is_some() {
        let x = done.stats.extent_tree;
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
        eprintln!(
            "btrsend: block cache: {:?}",
            done.source.fs().volume().cache_stats()
        );
    }
}

/// `--estimate`: the total of the streams' sizes (one number), or with
/// `--json` an object with the counts too.
fn print_estimate(all: &[send::SendStats], json: bool) -> anyhow::Result<()> {
    use btrsend::stream_format::CommandKind as K;
    let sum = |f: &dyn Fn(&send::SendStats) -> u64| all.iter().map(f).sum::<u64>();
    let bytes = sum(&|s| s.stream_bytes);
    let mut out = crate::exit::stdout();
    if !json {
        writeln!(out, "{bytes}")?;
        return Ok(out.flush()?);
    }
    let by_command: serde_json::Map<String, serde_json::Value> = K::ALL
        .iter()
        .filter_map(|&k| {
            let n = sum(&|s| s.count(k));
            (n > 0).then(|| (k.name().to_owned(), n.into()))
        })
        .collect();
    let v = serde_json::json!({
        "stream_bytes": bytes,
        "commands": sum(&|s| s.total_commands()),
        "files": sum(&|s| s.count(K::Mkfile)),
        "directories": sum(&|s| s.count(K::Mkdir)),
        "data_bytes": sum(&|s| s.data_bytes),
        "encoded_bytes": sum(&|s| s.encoded_bytes),
        "cloned_bytes": sum(&|s| s.cloned_bytes),
        "writes": sum(&|s| s.count(K::Write)),
        "encoded_writes": sum(&|s| s.count(K::EncodedWrite)),
        "clones": sum(&|s| s.count(K::Clone)),
        "by_command": by_command,
    });
    writeln!(out, "{v}")?;
    Ok(out.flush()?)
}

/// The reader of the stream went away: the broken pipe itself, which
/// `main` reports (exit 141) as in every subcommand.
fn broken_pipe() -> anyhow::Error {
    std::io::Error::from(std::io::ErrorKind::BrokenPipe).into()
}

fn send_error(e: SendError, args: &SendArgs, given: &str) -> anyhow::Error {
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
    anyhow::Error::new(e).context(format!("cannot send {given}{dev}"))
}
