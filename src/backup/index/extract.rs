//! `backup restore --include`: the paths of a stored snapshot that a
//! [`Selection`] picks, restored from its index into a directory, each at
//! its path inside the snapshot (`DIR/PATH`, as restic restores), with
//! no chain received.
//!
//! The index writes the picked paths out as a full stream ([`synth`]),
//! which btrsend's receiver applies into a staging directory of its own
//! inside DIR (`.btrsend-restore.PID`, mode 0700), as plain files and
//! directories: every attribute a full restore gives them, checked as any
//! received stream is. Only a restore that worked is moved into place:
//! each entry at the staging root goes to the same name in DIR, with
//! `RENAME_NOREPLACE`; where DIR already has a directory of that name the
//! move goes on inside it (that directory keeps its own attributes), and
//! where it has anything else the restore stops before it moves anything:
//! nothing the user had is replaced. Directories are opened one name at a
//! time without following symlinks. The staging directory is removed
//! whatever happens, except by a `kill -9`: then DIR keeps it, to be
//! removed by hand.
//!
//! [`synth`]: super::synth

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::time::Duration;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use stream_format::StreamWriter;

use super::inline::ChannelReader;
use super::synth::{self, Head, Selection, Written};
use super::{DataSource, IndexError, Snapshot};
use crate::backup::Entry;
use crate::backup::error::BackupError;
use crate::backup::lock::LockKind;
use crate::backup::repository::Repository;
use crate::progress::Progress;
use crate::receive::apply::{open_dir, remove_tree};
use crate::receive::{self, ReceiveOptions};

/// Bytes of stream handed to the receiver at once.
const CHUNK: usize = 1 << 20;

/// Chunks in flight between the index and the receiver: the memory bound
/// of the hand-over (8 MiB).
const IN_FLIGHT: usize = 8;

/// Conflicting names reported at most.
const CONFLICTS_SHOWN: usize = 10;

impl Repository {
    /// Restore the paths of stored snapshot `spec` that `sel` picks into
    /// `dir` (made if missing), each at `dir/PATH`, from the snapshot's
    /// index (see the module docs); the entry and what was restored.
    ///
    /// `progress` hears the lock's notices and the receiver's notes.
    ///
    /// # Errors
    ///
    /// [`BackupError::NoSuchSnapshot`]; no index, or a damaged one, or
    /// data that cannot be read ([`BackupError::Index`]); nothing picked;
    /// a name in `dir` that is in the way; receive and write errors.
    pub fn restore_selected(
        &self,
        spec: &str,
        dir: &Path,
        sel: &Selection,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<(Entry, Written), BackupError> {
        self.need_contents("restore")?;
        let _lock = self.lock(LockKind::Shared, wait, progress)?;
        let cat = self.catalog()?;
        let entry = self.find(&cat, spec)?.clone();
        std::fs::create_dir_all(dir).map_err(io_err(format!("{}", dir.display())))?;
        let dfd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err(format!("{}", dir.display())))?;
        let stage = format!(".btrsend-restore.{}", std::process::id());
        let stage_path = dir.join(&stage);
        rustix::fs::mkdirat(&dfd, stage.as_str(), Mode::from_raw_mode(0o700)).map_err(io_err(
            format!("making the staging directory {}", stage_path.display()),
        ))?;
        let res = self
            .with_index(&cat, &entry, |snap, data| {
                receive_picked(snap, data, sel, &entry, &stage_path, progress)
            })
            .and_then(|written| {
                move_into_place(&dfd, &stage, dir)?;
                Ok(written)
            });
        let cleaned = remove_tree(dfd.as_fd(), OsStr::new(&stage));
        let written = res?;
        cleaned.map_err(io_err(format!(
            "removing the staging directory {}",
            stage_path.display()
        )))?;
        Ok((entry, written))
    }
}

/// An I/O error of `what` (a std or rustix error) as the backup's.
fn io_err<E: Into<io::Error>>(what: String) -> impl FnOnce(E) -> BackupError {
    move |e| BackupError::Io {
        what,
        error: e.into(),
    }
}

/// The name the picked tree is received under in the staging directory.
const STAGED: &str = "snapshot";

/// Write the picked paths of `snap` as a stream and receive it into
/// `stage` (as `stage/STAGED`).
fn receive_picked(
    snap: &Snapshot<'_, '_>,
    data: &dyn DataSource,
    sel: &Selection,
    entry: &Entry,
    stage: &Path,
    progress: &dyn Progress,
) -> Result<Written, BackupError> {
    let what = format!("entry {} ({})", entry.id, entry.path);
    let index_err = |error: IndexError| BackupError::Index {
        what: what.clone(),
        error: Box::new(error),
    };
    let (tx, rx) = sync_channel(IN_FLIGHT);
    let (received, written) = std::thread::scope(|s| {
        let rx_thread = s.spawn(move || {
            let mut notes = Notes::default();
            let mut opts = ReceiveOptions::new();
            opts.subvolumes = false;
            opts.checkpoint_interval = 0;
            let r = receive::receive(ChannelReader::new(rx), stage, &opts, &mut notes);
            (r, notes)
        });
        let written = StreamWriter::new(ChanWriter::new(tx), 1)
            .map_err(|e| IndexError::Output(e.to_string()))
            .and_then(|mut w| {
                let head = Head {
                    name: STAGED.as_bytes(),
                    uuid: [0; 16],
                    ctransid: entry.ctransid,
                };
                synth::write_stream(snap, data, sel, head, &mut w)
            });
        // The writer is gone: the receiver reads to the end of the stream.
        let (received, notes) = rx_thread
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        for n in notes.0.into_inner().unwrap_or_else(|p| p.into_inner()) {
            progress.note(&n);
        }
        (received, written)
    });
    // A stream cut short by the index is why its receive failed; a
    // receive that failed is why the writing stopped.
    let written = match (written, received) {
        (Err(e), _) if !matches!(e, IndexError::Output(_)) => return Err(index_err(e)),
        (_, Err(error)) => {
            return Err(BackupError::Receive {
                snapshot: entry.path.clone(),
                dir: stage.to_path_buf(),
                error: Box::new(error),
            });
        }
        (w, Ok(_)) => w.map_err(index_err)?,
    };
    if written.paths == 0 {
        return Err(BackupError::Invalid(format!(
            "{what}: no path of the snapshot matches the patterns"
        )));
    }
    Ok(written)
}

/// What the receiver notes, kept for the caller (the receive runs on a
/// thread of its own; the caller's progress need not go there).
#[derive(Default)]
struct Notes(Mutex<Vec<String>>);

impl Progress for Notes {
    fn note(&self, msg: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(msg.to_owned());
    }

    fn warning(&self, msg: &str) {
        self.note(msg);
    }
}

/// The writing end of the hand-over: bytes in chunks of [`CHUNK`].
struct ChanWriter {
    tx: SyncSender<Vec<u8>>,
    buf: Vec<u8>,
}

impl ChanWriter {
    fn new(tx: SyncSender<Vec<u8>>) -> ChanWriter {
        ChanWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .send(full)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the receiver stopped"))
    }
}

impl Write for ChanWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = b.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&b[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Move the tree received at `dir/stage/STAGED` into `dir`: every name
/// checked first (see the module docs), then moved.
fn move_into_place(dfd: &OwnedFd, stage: &str, dir: &Path) -> Result<(), BackupError> {
    let staged = open_dir(dfd.as_fd(), OsStr::new(stage))
        .and_then(|s| open_dir(s.as_fd(), OsStr::new(STAGED)))
        .map_err(io_err(format!("{}/{stage}/{STAGED}", dir.display())))?;
    let mut conflicts = Vec::new();
    merge(
        staged.as_fd(),
        dfd.as_fd(),
        &mut Vec::new(),
        false,
        &mut conflicts,
    )
    .map_err(io_err(format!("checking {}", dir.display())))?;
    if !conflicts.is_empty() {
        let shown: Vec<String> = conflicts
            .iter()
            .take(CONFLICTS_SHOWN)
            .map(|p| dir.join(OsStr::from_bytes(p)).display().to_string())
            .collect();
        let more = conflicts.len().saturating_sub(CONFLICTS_SHOWN);
        return Err(BackupError::Invalid(format!(
            "not restoring over what {} holds: {}{} already exist{} (restore into an empty directory)",
            dir.display(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            if conflicts.len() == 1 { "s" } else { "" },
        )));
    }
    merge(
        staged.as_fd(),
        dfd.as_fd(),
        &mut Vec::new(),
        true,
        &mut conflicts,
    )
    .map_err(io_err(format!(
        "moving the restored paths into {}",
        dir.display()
    )))?;
    Ok(())
}

/// Walk the entries of `from` against `to` (at `rel` below both roots):
/// a name `to` lacks is moved there when `apply` is set; where both
/// have a directory, the walk goes into them; any other name `to` has is
/// a conflict.
fn merge(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    rel: &mut Vec<u8>,
    apply: bool,
    conflicts: &mut Vec<Vec<u8>>,
) -> io::Result<()> {
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(from)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    names.sort();
    for n in names {
        let name = OsStr::from_bytes(&n);
        let len = rel.len();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&n);
        match rustix::fs::statat(to, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => {
                if apply {
                    rustix::fs::renameat_with(from, name, to, name, RenameFlags::NOREPLACE)?;
                }
            }
            Err(e) => return Err(e.into()),
            Ok(there) => {
                let here = rustix::fs::statat(from, name, AtFlags::SYMLINK_NOFOLLOW)?;
                let is_dir = |m| FileType::from_raw_mode(m) == FileType::Directory;
                if is_dir(here.st_mode) && is_dir(there.st_mode) {
                    let f = open_dir(from, name)?;
                    let t = open_dir(to, name)?;
                    merge(f.as_fd(), t.as_fd(), rel, apply, conflicts)?;
                } else {
                    conflicts.push(rel.clone());
                }
            }
        }
        rel.truncate(len);
    }
    Ok(())
}
