//! One thread per open snapshot: the index's readers ([`Snapshot`] over
//! its [`Pages`](crate::backup::index::Pages), [`RepoData`] and their
//! caches) borrow the repository and live in `RefCell`s, so they are
//! neither `Send` nor `Sync`; each stays on the thread that opened it, and
//! the FUSE session hands it work as closures over a channel.
//!
//! A snapshot is opened on its first use and kept while it is among the
//! [`MAX_OPEN`] used last; closing one ends its thread once its queue is
//! empty (its caches go with it). So the work of one snapshot runs in
//! order, several snapshots are read at once, and what stays in memory is
//! bounded by [`MAX_OPEN`] snapshots' caches.

use std::cell::RefCell;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use crate::backup::index::model::Inode;
use crate::backup::index::repo::RepoData;
use crate::backup::index::{IndexError, Snapshot};
use crate::backup::{BackupError, Catalog, Repository};

/// Snapshots open at once.
pub const MAX_OPEN: usize = 8;

/// An open snapshot, as a job sees it.
pub struct Open<'a> {
    /// Its index.
    pub snap: &'a Snapshot<'a, 'a>,
    /// Its data, with the frame cache.
    pub data: &'a RepoData<'a>,
    /// The inode read last (a file being read sequentially needs it for
    /// every read).
    last: RefCell<Option<(u64, Inode)>>,
}

impl Open<'_> {
    /// Inode `ino`.
    ///
    /// # Errors
    ///
    /// It is missing, or the index is damaged.
    pub fn inode(&self, ino: u64) -> Result<Inode, IndexError> {
        if let Some((n, i)) = &*self.last.borrow()
            && *n == ino
        {
            return Ok(i.clone());
        }
        let i = self.snap.inode(ino)?;
        *self.last.borrow_mut() = Some((ino, i.clone()));
        Ok(i)
    }
}

/// Work for a snapshot: called with the open snapshot, or with why it
/// cannot be opened.
type Job = Box<dyn for<'a> FnOnce(Result<&'a Open<'a>, &'a str>) + Send>;

/// The threads of the open snapshots.
pub struct Workers {
    repo: Arc<Repository>,
    cat: Arc<Catalog>,
    /// Entry id and queue of each open snapshot, the one used last at the
    /// end.
    open: Mutex<Vec<(u64, Sender<Job>)>>,
}

impl Workers {
    /// No snapshot open yet.
    pub fn new(repo: Arc<Repository>, cat: Arc<Catalog>) -> Workers {
        Workers {
            repo,
            cat,
            open: Mutex::new(Vec::new()),
        }
    }

    /// Run `job` on the thread of the snapshot of catalog entry `entry`
    /// (whose id is `id`), opening it first if it is not open.
    pub fn run(
        &self,
        id: u64,
        entry: usize,
        job: impl for<'a> FnOnce(Result<&'a Open<'a>, &'a str>) + Send + 'static,
    ) {
        let mut job: Job = Box::new(job);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pos) = open.iter().position(|(i, _)| *i == id) {
            let (i, tx) = open.remove(pos);
            match tx.send(job) {
                Ok(()) => {
                    open.push((i, tx));
                    return;
                }
                // Its thread is gone (it panicked): start another.
                Err(mpsc::SendError(j)) => job = j,
            }
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let repo = Arc::clone(&self.repo);
        let cat = Arc::clone(&self.cat);
        let started = std::thread::Builder::new()
            .name(format!("snapshot-{id}"))
            .spawn(move || serve(&repo, &cat, entry, &rx));
        if let Err(e) = started {
            job(Err(&format!("cannot start a thread: {e}")));
            return;
        }
        // OK: the receiver lives until the thread ends.
        let _ = tx.send(job);
        open.push((id, tx));
        if open.len() > MAX_OPEN {
            // Its thread ends when its queue is empty.
            open.remove(0);
        }
    }
}

/// A snapshot's thread: open it, then run its jobs until its queue closes.
fn serve(repo: &Repository, cat: &Catalog, entry: usize, rx: &mpsc::Receiver<Job>) {
    let Some(e) = cat.entries.get(entry) else {
        for job in rx {
            job(Err("no such catalog entry"));
        }
        return;
    };
    let opened = repo.with_index(cat, e, |snap, data| {
        let open = Open {
            snap,
            data,
            last: RefCell::new(None),
        };
        for job in rx {
            job(Ok(&open));
        }
        Ok::<(), BackupError>(())
    });
    if let Err(err) = opened {
        let msg = err.to_string();
        for job in rx {
            job(Err(&msg));
        }
    }
}
