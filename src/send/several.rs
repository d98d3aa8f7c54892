//! Several subvolumes in one stream, as `btrfs send A B C` writes them:
//! every subvolume, parent and clone source is found before the first
//! byte (a later one that is wrong must not leave a stream of the first
//! ones behind); a resume token says which subvolume the stream
//! continues (those before it were received whole); and, beside a send
//! whose progress is shown, the streams' exact total is estimated on a
//! thread of its own, with a block cache of its own taken out of the
//! send's bound.
//!
//! This module sequences whole sends of a [`Source`]; it never plans a
//! stream (the planner does) and prints nothing: what the caller shows
//! comes through [`Progress`] and the [`Sent`] events.

use std::io::Write;

use crate::device::readahead::{MIN_CACHE_MIB, ReadOptions};
use crate::resume::Token;
use crate::types::Uuid;

use super::mounted::{Beside, Request, Source};
use super::{Progress, SendError, SendOptions, SendStats};

/// The subvolumes of one stream, checked, and where sending starts.
#[derive(Debug)]
pub struct Several<'r> {
    requests: &'r [Request<'r>],
    /// The first request sent (a resume token's; else 0).
    first: usize,
}

/// A send of one of the subvolumes failed.
#[derive(Debug)]
pub struct Failed<'r> {
    /// The subvolume as given.
    pub subvol: &'r str,
    /// Why.
    pub error: Box<SendError>,
}

/// What [`Several::send`] tells its caller as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// This subvolume's stream is next (`btrfs send -v`: "At subvol").
    Starting(&'a str),
    /// This subvolume's stream was written.
    Sent(Sent<'a>),
}

/// One subvolume's stream was written.
#[derive(Debug)]
pub struct Sent<'a> {
    /// The subvolume as given.
    pub subvol: &'a str,
    /// Its stream's figures.
    pub stats: &'a SendStats,
    /// The source it was read from (its caches, for debugging output).
    pub source: &'a Source,
}

impl<'r> Several<'r> {
    /// Find every subvolume, parent and clone source of `requests` in
    /// `src`; with `token`, the subvolume the stream continues.
    ///
    /// # Errors
    ///
    /// As [`Source::check`] for the first request that fails;
    /// [`SendError::ResumeMismatch`] when the token's snapshot is none of
    /// the requests'.
    pub fn check(
        src: &Source,
        requests: &'r [Request<'r>],
        token: Option<&Token>,
    ) -> Result<Several<'r>, SendError> {
        let mut subvols = Vec::with_capacity(requests.len());
        for req in requests {
            subvols.push(src.check(req)?);
        }
        let first = match token {
            Some(t) => subvols
                .iter()
                .position(|s| s.stream_uuid() == t.uuid)
                .ok_or_else(|| {
                    SendError::ResumeMismatch(format!(
                        "it continues the snapshot with uuid {}, which is none of the SUBVOLs given",
                        Uuid(t.uuid)
                    ))
                })?,
            None => 0,
        };
        Ok(Several { requests, first })
    }

    /// The requests, in stream order.
    pub fn requests(&self) -> &'r [Request<'r>] {
        self.requests
    }

    /// The exact size and commands of each stream ([`Source::estimate`]).
    ///
    /// # Errors
    ///
    /// The first subvolume whose estimate fails.
    pub fn estimate(&self, src: &Source, opts: SendOptions) -> Result<Vec<SendStats>, Failed<'r>> {
        self.requests
            .iter()
            .map(|req| {
                src.estimate(req, opts).map_err(|error| Failed {
                    subvol: req.subvol,
                    error: Box::new(error),
                })
            })
            .collect()
    }

    /// Write the streams to `out` one after another, from the token's
    /// subvolume on (continuing its stream); `events` is told before and
    /// after each subvolume; the bytes written.
    ///
    /// # Errors
    ///
    /// The first subvolume whose send fails ([`Source::send_from`]); the
    /// streams before it are written whole.
    pub fn send(
        &self,
        src: &mut Source,
        opts: SendOptions,
        token: Option<&Token>,
        out: &mut dyn Write,
        progress: &dyn Progress,
        events: &mut dyn FnMut(Event<'_>),
    ) -> Result<u64, Failed<'r>> {
        let mut bytes = 0u64;
        for (k, req) in self.requests.iter().enumerate().skip(self.first) {
            events(Event::Starting(req.subvol));
            let resume = token.filter(|_| k == self.first);
            let (_, stats) = src
                .send_from(req, &mut *out, opts, resume, progress)
                .map_err(|error| Failed {
                    subvol: req.subvol,
                    error: Box::new(error),
                })?;
            bytes = bytes.saturating_add(stats.stream_bytes);
            events(Event::Sent(Sent {
                subvol: req.subvol,
                stats: &stats,
                source: src,
            }));
        }
        Ok(bytes)
    }
}

/// The block caches of a send and of the estimate beside it: with
/// `beside`, the estimate takes the smallest cache ([`MIN_CACHE_MIB`]; it
/// walks each tree once, in order) out of the send's bound; without, the
/// send has it all.
pub fn split_cache(read: ReadOptions, beside: bool) -> (ReadOptions, ReadOptions) {
    let estimate = read.clone().with_cache_mib(MIN_CACHE_MIB);
    if !beside {
        return (read, estimate);
    }
    let mib = (read.cache_bytes >> 20).saturating_sub(MIN_CACHE_MIB);
    (read.with_cache_mib(mib), estimate)
}

/// A [`Request`] the estimate's thread owns.
#[derive(Debug, Clone)]
pub struct OwnedRequest {
    /// The subvolume.
    pub subvol: String,
    /// The parent, if any.
    pub parent: Option<String>,
    /// The clone sources.
    pub clone_sources: Vec<String>,
}

impl OwnedRequest {
    /// An owned copy of `req`.
    pub fn of(req: &Request<'_>) -> OwnedRequest {
        OwnedRequest {
            subvol: req.subvol.to_owned(),
            parent: req.parent.map(str::to_owned),
            clone_sources: req.clone_sources.to_vec(),
        }
    }
}

/// Estimate the streams of `requests` on a thread of its own, with a
/// source of its own opened `beside` the send's (a mounted filesystem is
/// not synced again for it) with the cache `read`; `done` is given the
/// total. It never delays the send's first byte. An estimate that fails
/// gives no total (the send reports its own errors): the handle has the
/// error.
pub fn spawn_total(
    beside: Beside,
    requests: Vec<OwnedRequest>,
    opts: SendOptions,
    read: ReadOptions,
    done: impl FnOnce(u64) + Send + 'static,
) -> std::thread::JoinHandle<Result<u64, SendError>> {
    std::thread::spawn(move || {
        let src = beside.open(&read)?;
        let mut total = 0u64;
        for r in &requests {
            let req = Request {
                subvol: &r.subvol,
                parent: r.parent.as_deref(),
                clone_sources: &r.clone_sources,
            };
            total = total.saturating_add(src.estimate(&req, opts)?.stream_bytes);
        }
        done(total);
        Ok(total)
    })
}
