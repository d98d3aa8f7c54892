//! `btrsend debug`: hidden developer tools; `debug walk` times a full walk
//! of one tree for `benches/walk-cold-warm`.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use btrsend::device::readahead::ReadOptions;
use btrsend::fs::Filesystem;
use btrsend::tree::key::Key;
use btrsend::tree::walk::for_each_in_range;
use btrsend::types::TreeId;
use btrsend::volume::Volume;
use clap::{Args, Subcommand};

/// Arguments of `btrsend debug`.
#[derive(Debug, Args)]
pub struct DebugArgs {
    /// The tool.
    #[command(subcommand)]
    pub command: DebugCommand,
}

/// The debug tools.
#[derive(Debug, Subcommand)]
pub enum DebugCommand {
    /// Walk every item of one tree in key order and print the time taken.
    Walk(WalkArgs),
}

/// Arguments of `btrsend debug walk`.
#[derive(Debug, Args)]
pub struct WalkArgs {
    /// A device or image file of the filesystem (repeat for multi-device filesystems).
    #[arg(short = 'd', long = "device", value_name = "PATH", required = true)]
    pub devices: Vec<PathBuf>,
    /// The tree to walk (default 5, the top-level subvolume).
    #[arg(long, value_name = "ID", default_value_t = 5)]
    pub tree: u64,
    /// Read every block on demand (no reader threads, no hints).
    #[arg(long)]
    pub no_readahead: bool,
    /// Blocks announced ahead per tree level (default 64).
    #[arg(long, value_name = "N")]
    pub window: Option<usize>,
    /// Reader threads (default 4).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Block cache size in MiB (default 256).
    #[arg(long, value_name = "MIB")]
    pub cache_mib: Option<usize>,
    /// Walk this many times in one process (later passes find the blocks
    /// in the block cache).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub passes: u32,
}

/// Run a debug tool.
pub fn run(args: &DebugArgs) -> anyhow::Result<()> {
    match &args.command {
        DebugCommand::Walk(a) => walk(a),
    }
}

fn walk(args: &WalkArgs) -> anyhow::Result<()> {
    let defaults = ReadOptions::default();
    let options = ReadOptions {
        readahead: !args.no_readahead,
        window: args.window.unwrap_or(defaults.window),
        threads: args.threads.unwrap_or(defaults.threads),
        cache_bytes: args
            .cache_mib
            .map_or(defaults.cache_bytes, |c| c.saturating_mul(1 << 20)),
        ..defaults
    };
    let t0 = Instant::now();
    let fs = Filesystem::from_volume(Volume::open_with(&args.devices, &options)?);
    let root = fs.tree_root(TreeId(args.tree))?;
    let open_secs = t0.elapsed().as_secs_f64();
    let nodesize = u64::from(fs.volume().superblock().nodesize);
    let mut out = crate::exit::stdout();
    writeln!(
        out,
        "open secs={open_secs:.4} tree={} level={} readahead={}",
        args.tree, root.level, options.readahead
    )?;
    for pass in 1..=args.passes.max(1) {
        let before = fs.volume().cache_stats();
        let t = Instant::now();
        let mut items = 0u64;
        let mut data = 0u64;
        let mut leaves = HashSet::new();
        for_each_in_range(fs.volume(), root, &Key::MIN, &Key::MAX, |item| {
            items += 1;
            data += u64::try_from(item.data.len()).unwrap_or(0);
            leaves.insert(item.leaf);
            Ok(())
        })?;
        let secs = t.elapsed().as_secs_f64().max(1e-9);
        let s = fs.volume().cache_stats();
        let leaf_bytes = u64::try_from(leaves.len()).unwrap_or(0) * nodesize;
        writeln!(
            out,
            "pass={pass} items={items} leaves={} item_bytes={data} secs={secs:.4} \
             items_per_sec={:.0} leaf_mb_per_sec={:.1} hits={} waits={} misses={} \
             prefetched={} prefetch_errors={}",
            leaves.len(),
            items as f64 / secs,
            leaf_bytes as f64 / secs / 1e6,
            s.hits - before.hits,
            s.waits - before.waits,
            s.misses - before.misses,
            s.prefetch_loaded - before.prefetch_loaded,
            s.prefetch_errors - before.prefetch_errors,
        )?;
    }
    Ok(())
}
