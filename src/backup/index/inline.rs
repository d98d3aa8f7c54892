//! Indexing a stream while `run` or `import` stores it: the bytes the
//! stream file is written from are handed, in batches, to a thread that
//! applies them to the parent's index, so the index costs no second read
//! of the stream.
//!
//! The index is a convenience that `backup index` can always rebuild: an
//! indexing that fails (a stream the indexer refuses, a page that cannot
//! be written) never fails the store, and an index is recorded just
//! before the stream's catalog entry, for the snapshot that entry names.

use std::io::{self, BufRead, Read, Write};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use super::IndexError;
use super::apply::{IndexRoot, Snapshots, index_own_stream};
use super::repo::StorePages;
use super::tree::Pages;
use crate::backup::catalog::Catalog;
use crate::backup::entry::Entry;
use crate::backup::file::format::hyphenated;
use crate::backup::store::Store;
use crate::backup::{BackupError, Repository};

/// Bytes batched before they go to the indexing thread.
const BATCH: usize = 1 << 20;

/// Batches in flight: what the indexer may lag behind the writer.
const IN_FLIGHT: usize = 16;

/// What the indexing thread ends with: the snapshot's UUID and its index.
type Indexed = Result<([u8; 16], IndexRoot), IndexError>;

/// An index being built from the bytes of a stream being stored.
pub struct InlineIndex {
    tx: Option<SyncSender<Vec<u8>>>,
    buf: Vec<u8>,
    /// Batches the indexer is done with, to fill again: a new buffer a
    /// batch costs its pages' faults, which showed on a 4 GiB stream.
    spent: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<Indexed>>,
}

/// The one snapshot an indexed stream may build on: its parent.
struct Parent(Option<(String, IndexRoot)>);

impl Snapshots for Parent {
    fn index_of(&self, uuid: &[u8; 16]) -> Option<IndexRoot> {
        let (want, root) = self.0.as_ref()?;
        want.eq_ignore_ascii_case(&hyphenated(uuid))
            .then(|| root.clone())
    }
}

/// The stream's bytes, as the channel brings them; the end of the stream
/// when the sender is dropped.
pub(super) struct ChannelReader {
    rx: Receiver<Vec<u8>>,
    cur: Vec<u8>,
    at: usize,
    /// Where read batches go back to be filled again (none: dropped).
    spent: Option<SyncSender<Vec<u8>>>,
}

impl ChannelReader {
    pub(super) fn new(rx: Receiver<Vec<u8>>) -> ChannelReader {
        ChannelReader {
            rx,
            cur: Vec::new(),
            at: 0,
            spent: None,
        }
    }
}

impl BufRead for ChannelReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.at == self.cur.len() {
            match self.rx.recv() {
                Ok(b) => {
                    let done = std::mem::replace(&mut self.cur, b);
                    self.at = 0;
                    if let Some(back) = &self.spent {
                        // A full queue or a gone writer: the batch is freed.
                        let _ = back.try_send(done);
                    }
                }
                Err(_) => break,
            }
        }
        Ok(&self.cur[self.at..])
    }

    fn consume(&mut self, n: usize) {
        self.at = self.at.saturating_add(n).min(self.cur.len());
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let got = self.fill_buf()?;
        let n = out.len().min(got.len());
        out[..n].copy_from_slice(&got[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl InlineIndex {
    /// Hand `data`, the next bytes of the stream, to the indexer.
    pub fn feed(&mut self, data: &[u8]) {
        if self.tx.is_none() {
            return;
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= BATCH {
            self.send();
        }
    }

    fn send(&mut self) {
        let next = match self.spent.try_recv().ok() {
            Some(mut b) => {
                b.clear();
                b
            }
            None => Vec::with_capacity(BATCH + (64 << 10)),
        };
        let batch = std::mem::replace(&mut self.buf, next);
        if let Some(tx) = &self.tx
            && tx.send(batch).is_err()
        {
            // The indexer stopped (its error comes with `finish`).
            self.tx = None;
        }
    }

    /// The index of the stream fed: its snapshot's UUID and its root.
    ///
    /// # Errors
    ///
    /// The indexer refused the stream or could not store a page.
    pub fn finish(mut self) -> Indexed {
        self.send();
        self.tx = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => Err(IndexError::Store("the indexing thread ended early".into())),
        }
    }
}

impl Drop for InlineIndex {
    fn drop(&mut self) {
        // Closing the channel ends the thread; nobody waits for its answer.
        self.tx = None;
    }
}

/// A writer that passes what is written on to `inner` and to an index.
pub struct IndexTee<'a, W> {
    /// Where the bytes go.
    pub inner: W,
    /// The index they are also fed to (none: just `inner`).
    pub index: Option<&'a mut InlineIndex>,
}

impl<W: Write> Write for IndexTee<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(ix) = &mut self.index {
            ix.feed(&buf[..n]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Repository {
    /// Start indexing the stream to be stored as `file`, whose parent
    /// entry is `parent` (none: a full stream). `None` when there is
    /// nothing to build on: the parent has no index (a repository made
    /// before indexes, until `backup index`). The write key alone is
    /// enough: the index is sealed like the catalog, and the stream's
    /// bytes come from the send.
    pub fn inline_index(
        &self,
        cat: &Catalog,
        file: &str,
        parent: Option<&Entry>,
    ) -> Option<InlineIndex> {
        let parent = match parent {
            None => Parent(None),
            Some(e) => Parent(Some((e.uuid.clone(), self.index_root(cat, e).ok()?))),
        };
        let (tx, rx) = sync_channel(IN_FLIGHT);
        let (back, spent) = sync_channel(IN_FLIGHT);
        let store: Arc<dyn Store> = Arc::clone(self.store());
        let key = self.page_name_key();
        let seal = self.page_sealer();
        let file = file.to_owned();
        let thread = std::thread::Builder::new()
            .name("index".into())
            .spawn(move || {
                let sp = StorePages::new(&*store, seal);
                let pages = Pages::new(&sp, key);
                let mut input = ChannelReader::new(rx);
                input.spent = Some(back);
                let r = index_own_stream(&pages, &mut input, &file, &parent);
                // Whatever follows END is read and dropped, so the writer
                // never waits on a full channel.
                let _ = io::copy(&mut input, &mut io::sink());
                r
            })
            .ok()?;
        Some(InlineIndex {
            tx: Some(tx),
            buf: Vec::with_capacity(BATCH + (64 << 10)),
            spent,
            thread: Some(thread),
        })
    }

    /// Record the index `built` of the stream stored as `e.file`, when it
    /// is of `e`'s snapshot; a failed indexing is reported to `warn` and
    /// left for `backup index`. Called before the entry is committed, so
    /// that no crash leaves a listed entry without its index (a root
    /// whose entry never made it is no one's: `forget` sweeps it).
    pub fn record_inline_index(&self, e: &Entry, built: Option<InlineIndex>, warn: &dyn Fn(&str)) {
        let Some(ix) = built else {
            return;
        };
        let r = ix
            .finish()
            .map_err(|err| BackupError::Invalid(err.to_string()))
            .and_then(|(uuid, root)| {
                if !hyphenated(&uuid).eq_ignore_ascii_case(&e.uuid) {
                    return Err(BackupError::Invalid(
                        "the stream indexed is not the entry's snapshot".into(),
                    ));
                }
                self.put_index_root(e, &root)
            });
        if let Err(err) = r {
            warn(&format!(
                "{} is stored without an index ({err}); `btrsend backup index` indexes it",
                crate::manifest::escape(e.path.as_bytes())
            ));
        }
    }
}
