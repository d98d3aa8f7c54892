//! The data jobs of the send pipeline and the worker threads that run
//! them: a job reads (verifies, decompresses) part of one extent into a
//! reused buffer; the workers take batches of jobs and reply in order.
//! This module reads; it never writes to the stream or decides order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};

use crate::fs::{FileExtent, FsTree};

/// What a job produces: the bytes, or the read error.
pub(super) type Reply = crate::Result<Vec<u8>>;

/// What a data job reads.
#[derive(Debug)]
pub(super) enum Read {
    /// File bytes `[offset, offset + len)` of the extent.
    Range { offset: u64, len: u64 },
    /// The extent's encoded bytes as stored.
    Raw,
}

/// One data job: read (verify, decompress) part of an extent of an inode
/// into `buf` (a reused buffer).
#[derive(Debug)]
pub(super) struct Job {
    pub(super) ino: u64,
    pub(super) ext: FileExtent,
    pub(super) read: Read,
    pub(super) buf: Vec<u8>,
}

impl Job {
    pub(super) fn run(self, tree: &FsTree<'_>, verify: bool) -> Reply {
        let r = tree.extent_reader(self.ino, verify);
        match self.read {
            Read::Range { offset, len } => {
                // Every byte is written by the read: a reused buffer needs
                // no clearing.
                let mut buf = self.buf;
                buf.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
                r.read_at(&self.ext, offset, &mut buf)?;
                Ok(buf)
            }
            Read::Raw => r.raw(&self.ext),
        }
    }
}

/// A batch of jobs for one worker, and where to send their replies (in
/// order).
#[derive(Debug)]
pub(super) struct Task {
    pub(super) jobs: Vec<Job>,
    pub(super) reply: SyncSender<Vec<Reply>>,
}

/// The worker threads' side: the tasks to run. Dropping it lets the
/// workers end (they skip the tasks still queued).
pub(crate) struct Workers {
    pub(super) tasks: Sender<Task>,
    /// The workers' end of `tasks`, for the writer to take a task itself
    /// rather than sleep while all workers are busy.
    pub(super) queue: Arc<Mutex<Receiver<Task>>>,
    pub(super) stop: Arc<AtomicBool>,
}

impl Workers {
    /// The oldest task no worker took yet, unless a worker is taking one.
    pub(super) fn steal(&self) -> Option<Task> {
        self.queue.try_lock().ok()?.try_recv().ok()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Start `threads` workers in `scope` (of a rayon pool with as many
/// threads) reading `tree`'s data (verified with `verify`).
pub(crate) fn spawn_workers<'env>(
    scope: &rayon::Scope<'env>,
    tree: &'env FsTree<'env>,
    verify: bool,
    threads: usize,
) -> Workers {
    let (tx, rx) = mpsc::channel::<Task>();
    let rx = Arc::new(Mutex::new(rx));
    let stop = Arc::new(AtomicBool::new(false));
    for _ in 0..threads {
        let rx = Arc::clone(&rx);
        let stop = Arc::clone(&stop);
        scope.spawn(move |_| {
            loop {
                // The lock is held only to take one task.
                let task = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok(task) = task else { break };
                if stop.load(Ordering::Relaxed) {
                    continue;
                }
                let replies = task.jobs.into_iter().map(|j| j.run(tree, verify));
                // The writer may have gone (an earlier error): nobody waits.
                let _ = task.reply.send(replies.collect());
            }
        });
    }
    Workers {
        tasks: tx,
        queue: rx,
        stop,
    }
}
