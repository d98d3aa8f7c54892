//! `btrsend backup mount`: every stored snapshot as a read-only FUSE
//! filesystem (core `btrsend::backup::mount`), served in the foreground.
//!
//! The repository's shared lock is held for as long as it is mounted:
//! the catalog the mount shows cannot change under it (`backup run`,
//! `import` and `forget`, which take the exclusive lock, wait or fail
//! meanwhile), and the kernel may cache what it has seen.
//!
//! SIGINT and SIGTERM unmount it and end the command with status 0; when
//! the mount is busy, a second signal detaches it lazily (`umount -l`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use btrsend::backup::mount::{Mount, MountOptions, Unmounter};
use btrsend::backup::{LockKind, NoProgress};
use clap::{Args, ValueHint};

use super::{LockArg, RepoArg};
use crate::text::printable;

/// Arguments of `btrsend backup mount` (its help is the doc of
/// `BackupCommand::Mount`).
#[derive(Debug, Args)]
pub struct MountArgs {
    #[command(flatten)]
    repo: RepoArg,
    #[command(flatten)]
    lock: LockArg,
    /// Let every user see the mount (FUSE's allow_other; for a user other
    /// than root, /etc/fuse.conf must have user_allow_other). Access is
    /// checked against each file's stored owner and mode. Default: only
    /// the user who mounts it.
    #[arg(long)]
    allow_other: bool,
    /// The directory to mount on.
    #[arg(value_name = "MOUNTPOINT", value_hint = ValueHint::DirPath)]
    mountpoint: PathBuf,
}

/// Unmount attempts after the first that found the mount busy, and the
/// pause before each: two seconds in all.
const BUSY_RETRIES: usize = 20;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether an unmount failed because the mount is in use (`EBUSY`).
fn busy(tried: &std::io::Result<()>) -> bool {
    matches!(tried, Err(e) if e.raw_os_error() == Some(16))
}

/// Run `btrsend backup mount`.
pub fn run(a: &MountArgs) -> anyhow::Result<()> {
    let repo = a.repo.open()?;
    let _lock = repo.lock(LockKind::Shared, a.lock.wait(), &NoProgress)?;
    let cat = repo.catalog()?;
    let report: btrsend::backup::mount::Report =
        Arc::new(|m: &str| eprintln!("btrsend: {}", printable(m)));
    let unmounter = Unmounter::new(&a.mountpoint);
    let stop = Arc::new(AtomicBool::new(false));
    let signals = Arc::new(AtomicUsize::new(0));
    {
        let (stop, signals, unmounter) =
            (Arc::clone(&stop), Arc::clone(&signals), unmounter.clone());
        crate::signal::on_interrupt_call(Some(Box::new(move || {
            stop.store(true, Ordering::SeqCst);
            let lazy = signals.fetch_add(1, Ordering::SeqCst) > 0;
            // A reader that has just closed the last file can keep the
            // mount busy for a moment (the kernel releases FUSE handles
            // asynchronously): try for a while before asking for another
            // interrupt.
            let mut tried = unmounter.unmount(lazy);
            for _ in 0..BUSY_RETRIES {
                if !busy(&tried) {
                    break;
                }
                std::thread::sleep(BUSY_PAUSE);
                tried = unmounter.unmount(lazy);
            }
            // Any other failure: not mounted (yet, or any more).
            if busy(&tried) {
                eprintln!(
                    "btrsend: {} is busy: close what uses it, or interrupt again to detach it",
                    printable(&unmounter.mountpoint().display().to_string())
                );
            }
        })));
    }
    let mounted = Mount::new(
        Arc::new(repo),
        cat,
        &a.mountpoint,
        MountOptions {
            allow_other: a.allow_other,
        },
        report,
    );
    let mounted = match mounted {
        Ok(m) => m,
        Err(e) => {
            crate::signal::on_interrupt_call(None);
            return Err(e.into());
        }
    };
    // A signal that came while mounting found nothing to unmount.
    if stop.load(Ordering::SeqCst) {
        let _ = unmounter.unmount(false);
    }
    if std::io::stderr().is_terminal() {
        eprintln!(
            "btrsend: {} snapshot(s) mounted on {}; unmount with `umount` or Ctrl-C",
            mounted.snapshots(),
            printable(&a.mountpoint.display().to_string())
        );
    }
    let served = mounted.run();
    crate::signal::on_interrupt_call(None);
    served?;
    Ok(())
}
