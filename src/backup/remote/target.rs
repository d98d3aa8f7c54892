//! The far end of a received-subvolume target: `btrsend serve` answering
//! the `Target*` requests for the directory its handshake named, with
//! [`target::local`](crate::backup::target::local)'s functions, so that
//! a target over ssh lists, receives and deletes exactly as a local one.
//!
//! The stream a client sends is hostile input like any other: it is
//! received by [`receive`], which keeps every path beneath
//! the directory. With `--append-only` a target receives new subvolumes
//! and removes what an interrupted receive left, but deletes nothing
//! received completely.

use std::path::PathBuf;

use super::proto::{Reply, Request};
use crate::backup::target::local;
use crate::receive::{self, ReceiveOptions};

/// A receive in progress: the channel its stream's frames go into, and
/// the thread that receives them ([`receive::receive_blocks`]: each
/// frame's payload is a block of the stream, never copied again).
struct Receiving {
    frames: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    /// The receive stopped: the rest of the stream is dropped and the
    /// answer at its end says why.
    failed: bool,
}

/// The frames of a stream as [`receive::StreamBlocks`].
struct Frames(std::sync::mpsc::Receiver<Vec<u8>>);

impl receive::StreamBlocks for Frames {
    fn next_block(&mut self) -> Option<std::io::Result<(Vec<u8>, usize)>> {
        let b = self.0.recv().ok()?;
        let n = b.len();
        Some(Ok((b, n)))
    }
}

/// Frames queued for the receive at most (of up to 8 MiB, typically 1).
const QUEUED_FRAMES: usize = 8;

impl Receiving {
    fn start(dir: PathBuf) -> std::io::Result<Receiving> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUED_FRAMES);
        let thread = std::thread::Builder::new()
            .name("receive".into())
            .spawn(move || {
                receive::receive_blocks(
                    Frames(rx),
                    QUEUED_FRAMES,
                    &dir,
                    &ReceiveOptions::new(),
                    &mut crate::progress::NoProgress,
                )
                .map(|_| ())
                .map_err(|e| e.to_string())
            })?;
        Ok(Receiving {
            frames: Some(tx),
            thread: Some(thread),
            failed: false,
        })
    }

    fn write(&mut self, data: Vec<u8>) {
        if self.failed || data.is_empty() {
            return;
        }
        if let Some(tx) = self.frames.as_ref()
            && tx.send(data).is_err()
        {
            self.failed = true;
            self.frames = None;
        }
    }

    /// End the stream and wait for the receive: its verdict.
    fn finish(&mut self) -> Result<(), String> {
        self.frames = None;
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("the receive stopped unexpectedly".into()),
            None => Err("no receive is open".into()),
        }
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        // A connection that ends mid-stream: the receive sees the stream
        // cut and leaves its resume point.
        let _ = self.finish();
    }
}

/// The longest a client may make the server wait for the lock.
const MAX_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// One target connection after the handshake.
pub(super) struct TargetSession {
    pub(super) dir: PathBuf,
    pub(super) append_only: bool,
    receiving: Option<Receiving>,
    /// The directory's lock the client holds.
    lock: Option<local::TargetLock>,
}

impl TargetSession {
    pub(super) fn new(dir: PathBuf, append_only: bool) -> TargetSession {
        TargetSession {
            dir,
            append_only,
            receiving: None,
            lock: None,
        }
    }

    /// The reply to `request` (none for a write), with its payload.
    pub(super) fn handle(
        &mut self,
        request: Request,
        payload: Vec<u8>,
    ) -> Option<(Reply, Vec<u8>)> {
        let failed = |e: crate::backup::BackupError| Reply::Failed { why: e.to_string() };
        let reply = match request {
            Request::Write => {
                match self.receiving.as_mut() {
                    Some(r) => r.write(payload),
                    None => {
                        // Answered at Complete: nothing is open.
                    }
                }
                return None;
            }
            Request::TargetList => {
                return Some(match local::list(&self.dir) {
                    Ok(list) => match serde_json::to_vec(&list) {
                        Ok(json) => (super::server::data_reply(json.len()), json),
                        Err(e) => (Reply::Failed { why: e.to_string() }, Vec::new()),
                    },
                    Err(e) => (failed(e), Vec::new()),
                });
            }
            Request::TargetToken { name } => {
                return Some(match local::resume_token(&self.dir, &name) {
                    Some(t) => {
                        let text = t.to_string().into_bytes();
                        (super::server::data_reply(text.len()), text)
                    }
                    None => (Reply::NotFound, Vec::new()),
                });
            }
            Request::TargetReceive => {
                if self.receiving.is_some() {
                    Reply::Refused {
                        why: "a receive is open already (one at a time per connection)".into(),
                    }
                } else {
                    match Receiving::start(self.dir.clone()) {
                        Ok(r) => {
                            self.receiving = Some(r);
                            Reply::Ok
                        }
                        Err(e) => Reply::Failed {
                            why: format!("cannot start the receive: {e}"),
                        },
                    }
                }
            }
            Request::Complete => match self.receiving.take() {
                Some(mut r) => match r.finish() {
                    Ok(()) => Reply::Ok,
                    Err(why) => Reply::Failed { why },
                },
                None => Reply::Failed {
                    why: "no open receive".into(),
                },
            },
            Request::Abort => {
                // Dropping it ends the stream where it is.
                self.receiving = None;
                Reply::Ok
            }
            Request::Lock {
                exclusive: true,
                wait_ms,
            } => {
                // One lock per connection: a new request replaces it.
                self.lock = None;
                let wait = std::time::Duration::from_millis(wait_ms).min(MAX_LOCK_WAIT);
                match local::lock(&self.dir, wait) {
                    Ok(held) => {
                        self.lock = Some(held);
                        Reply::Ok
                    }
                    Err(crate::backup::BackupError::LockHeld { holder, .. }) => {
                        Reply::LockHeld { holder }
                    }
                    Err(e) => failed(e),
                }
            }
            Request::Unlock => {
                self.lock = None;
                Reply::Ok
            }
            Request::TargetDiscard { name } => match local::discard(&self.dir, &name) {
                Ok(()) => Reply::Ok,
                Err(e) => failed(e),
            },
            Request::TargetDelete { name } if self.append_only => Reply::Refused {
                why: format!(
                    "deleting {name} is refused: this server is append-only \
                     (prune on the server, or with an unrestricted key)"
                ),
            },
            Request::TargetDelete { name } => match local::delete(&self.dir, &name) {
                Ok(()) => Reply::Ok,
                Err(e) => failed(e),
            },
            _ => Reply::Refused {
                why: "not a request for a target (this connection serves a target directory)"
                    .into(),
            },
        };
        Some((reply, Vec::new()))
    }
}
