//! Continuing the stream file an interrupted run left (see
//! [`partial`](crate::backup::partial)): finding it, scanning it (or
//! reading the state an S3 upload recorded), and checking that the send
//! makes the same bytes before anything is appended.
//!
//! A partial file that cannot be continued is removed with a notice; this
//! module never trusts a partial file's bytes without that check.

use std::io::{self, Write};

use crate::backup::partial;
use crate::backup::repository::Repository;
use crate::backup::store;
use crate::backup::treehash::TreeHasher;
use crate::progress::Progress;

/// A writer that takes the first `left` bytes written to it (the part of
/// the stream a partial file holds) without passing them on, hashing them:
/// when they do not hash to `expected`, the write fails and `differs` says
/// so. Past them it reports the continuation, then passes everything on.
pub(crate) struct VerifyHead<'p, W> {
    pub(crate) inner: W,
    pub(crate) left: u64,
    pub(crate) hasher: TreeHasher,
    pub(crate) expected: blake3::Hash,
    pub(crate) differs: &'p std::cell::Cell<bool>,
    pub(crate) resumed: Option<Resumed<'p>>,
    pub(crate) progress: &'p dyn Progress,
}

/// What [`Progress::resumed`] says.
pub(crate) struct Resumed<'p> {
    pub(crate) path: &'p str,
    pub(crate) stream_bytes: u64,
    pub(crate) stored_bytes: u64,
}

impl<W: Write> Write for VerifyHead<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // OK to convert: at most buf.len().
        let skip = usize::try_from(self.left.min(buf.len() as u64)).unwrap_or(buf.len());
        self.hasher.update(&buf[..skip]);
        self.left -= skip as u64;
        if self.left > 0 {
            return Ok(skip);
        }
        if let Some(r) = self.resumed.take() {
            if self.hasher.finalize() != self.expected {
                self.differs.set(true);
                return Err(io::Error::other(
                    "the partial stream file differs from the stream this send makes",
                ));
            }
            self.progress
                .resumed(r.path, r.stream_bytes, r.stored_bytes);
            self.progress.stream(r.stream_bytes);
        }
        if skip == buf.len() {
            return Ok(skip);
        }
        Ok(skip + self.inner.write(&buf[skip..])?)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Repository {
    /// The partial stream file an interrupted run left for this snapshot
    /// (stream `uuid`, `ctransid`, incremental from `parent`), scanned
    /// (see [`partial`]); the others of the same snapshot, and one that
    /// does not match, are removed with a notice.
    pub(crate) fn find_partial(
        &self,
        uuid: &str,
        ctransid: u64,
        parent: Option<&(String, u64)>,
        progress: &dyn Progress,
    ) -> Option<(String, partial::Scan)> {
        if !self.store.continues_uploads() {
            return None;
        }
        let tmp = self.store.list(&format!("{}/", store::TMP_DIR)).ok()?;
        let mut best: Option<(String, partial::Scan)> = None;
        for o in tmp {
            if partial::snapshot_of(&o.key).is_none_or(|(u, c)| u != uuid || c != ctransid) {
                continue;
            }
            let scan = match self.scan_partial(&o.key, o.size) {
                Ok(s) => s,
                Err(why) => {
                    self.discard_partial(&o.key, &why, progress);
                    continue;
                }
            };
            if scan.uuid != uuid || scan.ctransid != ctransid {
                let why = format!(
                    "it holds the stream of snapshot {} ctransid {}",
                    scan.uuid, scan.ctransid
                );
                self.discard_partial(&o.key, &why, progress);
                continue;
            }
            if scan.parent.as_ref() != parent {
                let was = scan.parent.as_ref().map_or_else(
                    || String::from("a full stream"),
                    |(u, c)| format!("incremental from {u} ctransid {c}"),
                );
                let now = parent.map_or_else(
                    || String::from("a full stream"),
                    |(u, c)| format!("incremental from {u} ctransid {c}"),
                );
                let why = format!("it holds {was}, this run stores {now}");
                self.discard_partial(&o.key, &why, progress);
                continue;
            }
            if let Some(cut) = &scan.cut {
                progress.notice(&format!(
                    "{}: keeping its first {} frames ({} bytes of stream): {cut}",
                    o.key,
                    scan.kept.frames.len(),
                    scan.kept.raw_bytes
                ));
            }
            // Two partial files of one snapshot (two runs killed): the
            // longer is continued.
            let longer = best
                .as_ref()
                .is_none_or(|(_, b)| scan.kept.raw_bytes > b.kept.raw_bytes);
            if longer {
                if let Some((k, _)) = best.replace((o.key.clone(), scan)) {
                    self.discard_partial(&k, &format!("{} holds more", o.key), progress);
                }
            } else if let Some((k, _)) = &best {
                self.discard_partial(&o.key, &format!("{k} holds more"), progress);
            }
        }
        best
    }

    /// What the unfinished upload `key` (`size` bytes in `tmp/`) lets a
    /// run keep: the state it recorded (S3), or what its partial file
    /// holds (a directory).
    pub(crate) fn scan_partial(&self, key: &str, size: u64) -> Result<partial::Scan, String> {
        match self.store.recorded(key) {
            Ok(Some(r)) => partial::from_checkpoint(&r.state, r.stored_bytes, &r.key),
            Ok(None) if self.store.reads_back_unfinished() => {
                let mut scan = partial::scan(&*self.store, key, size)?;
                scan.file = self.store.completes_as(key);
                Ok(scan)
            }
            Ok(None) => Err(String::from("no part of its upload was recorded as stored")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Remove a partial stream file that cannot be continued, saying why.
    pub(crate) fn discard_partial(&self, key: &str, why: &str, progress: &dyn Progress) {
        progress.notice(&format!(
            "{key}: not continuing the stream an interrupted run left: {why}; sending it again"
        ));
        if let Err(e) = self.store.discard_unfinished(key) {
            progress.notice(&format!(
                "cannot remove {key}: {e}; the next run tries again"
            ));
        }
    }
}
