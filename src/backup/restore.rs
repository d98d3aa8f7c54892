//! `backup restore`: a stored snapshot's chain, full stream first, received
//! into a directory with btrsend's receiver or written as raw streams.
//!
//! Nothing damaged is applied or written: frames are checked before they
//! are decompressed, each stream's hash before its last frame. A failed
//! restore into a directory removes what it made. Restore only reads the
//! repository.

use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

use stream_format::Command;

use super::catalog::Entry;
use super::error::BackupError;
use super::file::{self, Damage, ReadError, StreamFile};
use super::frames;
use super::lock::LockKind;
use super::repository::Repository;
use crate::progress::Progress;
use crate::receive::{self, ReceiveOptions};

/// Where a restore goes.
pub enum RestoreTarget<'a> {
    /// Receive the chain into this directory with btrsend's receiver.
    Dir(&'a Path),
    /// Write the chain's raw streams, full first, here.
    Writer(&'a mut dyn Write),
}

impl std::fmt::Debug for RestoreTarget<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreTarget::Dir(d) => f.debug_tuple("Dir").field(d).finish(),
            RestoreTarget::Writer(_) => f.write_str("Writer"),
        }
    }
}

/// The raw streams of a chain, one after the other, from frames
/// decompressed ahead on other threads. Each stream's BLAKE3 and length are
/// checked when its last frame arrives, before any byte of that frame is
/// given out: the END command that finishes a received subvolume is in it,
/// so a stream whose hash does not match never ends as a finished
/// subvolume. Damage is an error from `read`, and is also left in
/// `damage` for the caller (the receiver wraps the error in its own).
pub(super) struct ChainReader<'a, 'b> {
    ahead: &'a mut frames::Ahead<'b>,
    files: &'a [StreamFile],
    cur: Option<frames::Frame>,
    pos: usize,
    /// The file being read and its hash so far.
    file: usize,
    hasher: blake3::Hasher,
    total: u64,
    done: bool,
    damage: &'a std::sync::Mutex<Option<Damage>>,
    /// Told of each frame's raw bytes as they are given out.
    watch: &'a dyn Progress,
}

impl<'a, 'b> ChainReader<'a, 'b> {
    /// A reader of the frames of `files` from `ahead`.
    pub(super) fn new(
        ahead: &'a mut frames::Ahead<'b>,
        files: &'a [StreamFile],
        damage: &'a std::sync::Mutex<Option<Damage>>,
        watch: &'a dyn Progress,
    ) -> ChainReader<'a, 'b> {
        ChainReader {
            ahead,
            files,
            cur: None,
            pos: 0,
            file: 0,
            hasher: blake3::Hasher::new(),
            total: 0,
            done: false,
            damage,
            watch,
        }
    }

    /// The error for `err`, its damage kept in `self.damage`.
    fn fail(&self, err: ReadError) -> io::Error {
        if let ReadError::Damage(d) = &err
            && let Ok(mut slot) = self.damage.lock()
        {
            slot.get_or_insert_with(|| d.clone());
        }
        file::io_damage(err)
    }

    /// Check the stream of file `self.file` and move to the next file.
    fn finish_file(&mut self) -> io::Result<()> {
        let Some(f) = self.files.get(self.file) else {
            return Ok(());
        };
        let found = self.hasher.finalize().to_hex().to_string();
        if self.total != f.trailer.stream_bytes || found != f.trailer.stream_blake3 {
            let d = Damage::Stream {
                file: f.key.clone(),
                what: format!(
                    "has {} bytes with BLAKE3 {found}, the trailer says {} bytes with BLAKE3 {}",
                    self.total, f.trailer.stream_bytes, f.trailer.stream_blake3
                ),
            };
            return Err(self.fail(ReadError::Damage(d)));
        }
        self.file += 1;
        self.hasher = blake3::Hasher::new();
        self.total = 0;
        Ok(())
    }

    /// Load the next frame; false at the end of the chain.
    fn load(&mut self) -> io::Result<bool> {
        if let Some(old) = self.cur.take() {
            self.ahead.recycle(old.into_buf());
        }
        let Some(r) = self.ahead.next() else {
            while self.file < self.files.len() {
                self.finish_file()?;
            }
            return Ok(false);
        };
        let fr = r.map_err(|e| self.fail(e))?;
        while self.file < fr.file {
            self.finish_file()?;
        }
        self.hasher.update(fr.raw());
        self.total += fr.raw().len() as u64;
        self.watch.stream(fr.raw().len() as u64);
        let last = self
            .files
            .get(fr.file)
            .is_some_and(|f| fr.index + 1 >= f.trailer.frames.len());
        self.pos = 0;
        self.cur = Some(fr);
        if last {
            self.finish_file()?;
        }
        Ok(true)
    }
}

impl Read for ChainReader<'_, '_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(fr) = &self.cur {
                let raw = fr.raw();
                if self.pos < raw.len() {
                    let n = (raw.len() - self.pos).min(out.len());
                    out[..n].copy_from_slice(&raw[self.pos..self.pos + n]);
                    self.pos += n;
                    return Ok(n);
                }
            }
            if self.done {
                return Ok(0);
            }
            if !self.load()? {
                self.done = true;
                return Ok(0);
            }
        }
    }
}

/// The frames themselves are the receiver's input blocks (no copy): each
/// stream's hash is checked as [`Read`] does it, before its last frame is
/// given out.
impl receive::StreamBlocks for ChainReader<'_, '_> {
    fn next_block(&mut self) -> Option<io::Result<(Vec<u8>, usize)>> {
        if self.done {
            return None;
        }
        match self.load() {
            Ok(true) => self.cur.take().map(|fr| Ok(fr.into_raw())),
            Ok(false) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    fn give_back(&mut self, buf: Vec<u8>) {
        self.ahead.recycle(buf);
    }
}

/// Frames queued for the receiver at most in a restore (besides those
/// [`frames::read_ahead`] holds): with 4 MiB frames, 8 MiB.
const RESTORE_QUEUE: usize = 2;

/// The restore's sink as its receive sees it: the receive's reports passed
/// on (those a receive makes), and the names of the subvolumes it made
/// (for [`receive::discard`]).
struct Made<'p> {
    inner: &'p dyn Progress,
    names: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Progress for Made<'_> {
    fn subvol_start(&self, name: &[u8], incremental: bool) {
        if let Ok(mut n) = self.names.lock() {
            n.push(name.to_vec());
        }
        self.inner.subvol_start(name, incremental);
    }
    fn subvol_done(&self, name: &[u8], complete: bool) {
        self.inner.subvol_done(name, complete);
    }
    fn data(&self, bytes: u64) {
        self.inner.data(bytes);
    }
    fn position(&self, offset: u64, commands: u64) {
        self.inner.position(offset, commands);
    }
    fn inode(&self, ino: u64) {
        self.inner.inode(ino);
    }
    fn note(&self, msg: &str) {
        self.inner.note(msg);
    }
    fn error(&self, err: &dyn std::error::Error) {
        self.inner.error(err);
    }
    fn lists_commands(&self) -> bool {
        self.inner.lists_commands()
    }
    fn command(&self, cmd: &Command<'_>) {
        self.inner.command(cmd);
    }
    fn encoded_fallback(&self, path: &[u8], err: io::Error) {
        self.inner.encoded_fallback(path, err);
    }
}

impl Repository {
    /// Restore the snapshot `spec` names (uuid, id or path): every file of
    /// its chain present, with a trailer that matches its entry, then its
    /// streams in order, oldest first.
    ///
    /// Nothing damaged is applied or written. [`RestoreTarget::Writer`]:
    /// the files are read twice, every frame's hash and every stream's
    /// hash checked before the first byte is written (written bytes cannot
    /// be taken back).
    /// [`RestoreTarget::Dir`] reads the files once: each frame's hash is
    /// checked before it is decompressed and applied, each stream's hash
    /// before its last frame (with the END command that finishes a
    /// subvolume); damage stops the receive there, and the subvolumes this
    /// restore made are removed, so `dir` is left as it was. It takes no
    /// resume checkpoints: an interrupted restore leaves its partial
    /// subvolume (delete it and restore again).
    ///
    /// `progress` hears the restore (the lock's notices, the plan, each
    /// stream's bytes) and, for a directory, its receive.
    ///
    /// # Errors
    ///
    /// [`BackupError::NoSuchSnapshot`], [`BackupError::Damage`], receive
    /// and write errors.
    pub fn restore(
        &self,
        spec: &str,
        target: RestoreTarget<'_>,
        wait: Duration,
        progress: &dyn Progress,
    ) -> Result<Entry, BackupError> {
        self.need_contents("restore")?;
        let _lock = self.lock(LockKind::Shared, wait, progress)?;
        let cat = self.catalog()?;
        let entry = self.find(&cat, spec)?;
        let chain = cat.chain(entry.id).map_err(|missing| BackupError::Catalog {
            repo: self.store.name().to_owned(),
            what: format!(
                "entry {} ({}) cannot be restored: its chain needs entry {missing}, which is not in the catalog",
                entry.id, entry.path
            ),
        })?;
        let mut files = Vec::new();
        for e in &chain {
            files.push(self.open_file(e)?);
        }
        // Exact totals: the catalog knows every stream's size. Writing to
        // a pipe reads the chain twice (checked first, then written).
        let passes = if matches!(target, RestoreTarget::Writer(_)) {
            2
        } else {
            1
        };
        let raw: u64 = files.iter().map(|f| f.trailer.stream_bytes).sum();
        progress.plan(1, raw.saturating_mul(passes));
        progress.start(&entry.path, entry.kind, raw);
        let store = &*self.store;
        let damage = |d: Damage| BackupError::Damage {
            repo: self.store.name().to_owned(),
            damage: Box::new(d),
        };
        let read_err = |err| match err {
            ReadError::Damage(d) => damage(d),
            ReadError::Store(s) => BackupError::Store(s),
        };
        let found = std::sync::Mutex::new(None);
        let mut decompress = frames::Work {
            hash: true,
            decompress: true,
            decode: false,
        };
        let damage_or = |e: io::Error, what: String| match file::damage_of(&e) {
            Some(ReadError::Damage(d)) => damage(d.clone()),
            _ => BackupError::Io { what, error: e },
        };
        if matches!(target, RestoreTarget::Writer(_)) {
            // Bytes written cannot be taken back: a whole pass first, each
            // frame's stored bytes against their hash and each stream's
            // raw bytes against theirs (frames intact under a forged
            // stream hash are found only so), nothing written.
            frames::read_ahead(store, &files, decompress, |ahead| {
                let mut check = ChainReader::new(ahead, &files, &found, progress);
                while let Some(b) = receive::StreamBlocks::next_block(&mut check) {
                    let (buf, _) = b?;
                    check.ahead.recycle(buf);
                }
                Ok(())
            })
            .map_err(|e| match file::into_read_error(e) {
                Ok(err) => read_err(err),
                Err(e) => BackupError::Io {
                    what: String::from("cannot read the streams"),
                    error: e,
                },
            })?;
            // Then decompressed again and written (zstd checks each
            // frame's checksum, each stream's hash is checked again).
            decompress.hash = false;
        }
        frames::read_ahead(store, &files, decompress, |ahead| {
            let mut input = ChainReader::new(ahead, &files, &found, progress);
            match target {
                RestoreTarget::Writer(w) => {
                    io::copy(&mut input, w)
                        .map_err(|e| damage_or(e, String::from("cannot write the streams")))?;
                    w.flush().map_err(|e| BackupError::Io {
                        what: String::from("cannot write the streams"),
                        error: e,
                    })
                }
                RestoreTarget::Dir(dir) => {
                    // No resume checkpoints: the stream is in the
                    // repository, an interrupted restore is run again (each
                    // checkpoint snapshots the subvolume, which writes out
                    // its data: about half the time of a 4 GiB restore).
                    let mut opts = ReceiveOptions::new();
                    opts.checkpoint_interval = 0;
                    let mut made = Made {
                        inner: progress,
                        names: std::sync::Mutex::new(Vec::new()),
                    };
                    let res = receive::receive_blocks(input, RESTORE_QUEUE, dir, &opts, &mut made);
                    let Err(source) = res else { return Ok(()) };
                    // Whatever failed (damage found, or the receive itself:
                    // a full disk, a stream the target refuses), what this
                    // restore made of the chain goes, later ones first, so
                    // DIR is left as it was.
                    let names = made.names.into_inner().unwrap_or_default();
                    for n in names.iter().rev() {
                        if let Err(e) = receive::discard(dir, n) {
                            progress.note(&format!(
                                "the failed restore left {} incomplete and cannot remove it ({e}): remove it by hand (`btrfs subvolume delete` for a subvolume, else `rm -r`)",
                                dir.join(String::from_utf8_lossy(n).as_ref()).display()
                            ));
                        }
                    }
                    match found.lock().ok().and_then(|mut f| f.take()) {
                        Some(d) => Err(damage(d)),
                        None => Err(BackupError::Receive {
                            snapshot: format!("{} ({})", entry.path, entry.id),
                            dir: dir.to_path_buf(),
                            error: Box::new(source),
                        }),
                    }
                }
            }
        })?;
        Ok(entry.clone())
    }
}
