//! Progress: the one interface through which the library's long operations
//! — send, receive, and the backup built on them — tell their caller what
//! they are doing. The library never prints; the caller renders (the CLI
//! draws an indicatif bar on a terminal and plain lines otherwise, or JSON
//! lines for `backup run --json`), or ignores it with [`NoProgress`].
//!
//! Every method has a default that does nothing, so a sink implements only
//! what it shows. Methods take `&self` and the trait needs `Sync`, so one
//! sink can be shared by the threads of an operation; sinks keep their
//! counters in atomics or a mutex. A backup hands its sink on to the send
//! or receive it runs, so one sink hears the whole operation.
//!
//! Which operation reports what:
//!
//! | method | send | receive | backup |
//! | --- | --- | --- | --- |
//! | [`subvol_start`](Progress::subvol_start), [`subvol_done`](Progress::subvol_done) | each subvolume sent | each subvolume in the stream | through the send or receive it runs |
//! | [`data`](Progress::data) | file data bytes sent (written, encoded or cloned) | — | `run`: as its send |
//! | [`position`](Progress::position) | — | the input offset and commands read | `restore`: as its receive |
//! | [`inode`](Progress::inode) | each inode | — | `run`: as its send |
//! | [`note`](Progress::note) | — | what was not applied, once each | `restore`: as its receive, and what a failed restore could not remove |
//! | [`error`](Progress::error) | — | errors below `--max-errors` | — |
//! | [`command`](Progress::command) | — | each command, if [`lists_commands`](Progress::lists_commands) | — |
//! | [`encoded_fallback`](Progress::encoded_fallback) | — | compressed data decompressed because the target refused it | — |
//! | [`notice`](Progress::notice), [`warning`](Progress::warning) | — | — | housekeeping (a stale lock taken over, a leftover removed); what must be heard even from cron |
//! | [`plan`](Progress::plan), [`start`](Progress::start), [`stream`](Progress::stream) | — | — | `run`, `verify --read-data`, `restore`: the whole operation's size, each entry, its stream bytes |
//! | [`full`](Progress::full), [`resumed`](Progress::resumed), [`stored`](Progress::stored), [`skipped`](Progress::skipped), [`failed`](Progress::failed), [`unchanged`](Progress::unchanged) | — | — | `run` and `import`: what became of each snapshot or file |

use std::error::Error;
use std::path::Path;

use crate::backup::entry::{Entry, Kind};
use crate::backup::plan::FullReason;

/// Where a long operation reports what it is doing (see the module docs for
/// who reports what). Every method defaults to doing nothing.
pub trait Progress: Sync {
    /// A subvolume's stream begins (`name`: the subvolume's path or name,
    /// `incremental`: against a parent).
    fn subvol_start(&self, name: &[u8], incremental: bool) {
        let _ = (name, incremental);
    }
    /// A subvolume's stream ended; `complete` is false if any part failed.
    fn subvol_done(&self, name: &[u8], complete: bool) {
        let _ = (name, complete);
    }
    /// `bytes` more bytes of file data were done.
    fn data(&self, bytes: u64) {
        let _ = bytes;
    }
    /// The input has been read up to byte `offset`, `commands` commands in.
    fn position(&self, offset: u64, commands: u64) {
        let _ = (offset, commands);
    }
    /// Inode `ino` is being processed.
    fn inode(&self, ino: u64) {
        let _ = ino;
    }
    /// Something not done that the user should know of, reported once (e.g.
    /// owners as an ordinary user). Not an error.
    fn note(&self, msg: &str) {
        let _ = msg;
    }
    /// An error the operation went on after (receive's `--max-errors`).
    fn error(&self, err: &dyn Error) {
        let _ = err;
    }
    /// Whether [`command`](Progress::command) wants each command of a
    /// receive (a listing, as `btrfs receive -v` prints). Asked once, at
    /// the start; when true, the receiver reads every command whole, also
    /// file data that it would otherwise leave to the thread that writes
    /// it.
    fn lists_commands(&self) -> bool {
        false
    }
    /// receive: the next command of the stream, in stream order, as it is
    /// read (before it is applied). Called only if
    /// [`lists_commands`](Progress::lists_commands).
    fn command(&self, cmd: &stream_format::Command<'_>) {
        let _ = cmd;
    }
    /// receive: the target refused to take the compressed data of the
    /// ENCODED_WRITE to `path` (the stream path) as it is (`err`), so it is
    /// decompressed and written (reported as `btrfs receive -vv` does).
    fn encoded_fallback(&self, path: &[u8], err: std::io::Error) {
        let _ = (path, err);
    }
    /// backup: something the user may want to know, not a problem (a stale
    /// lock taken over, a leftover file removed, a partial stream file not
    /// continued). Unlike [`note`](Progress::note), which says what an
    /// operation did not do, it may go unshown (from cron).
    fn notice(&self, msg: &str) {
        let _ = msg;
    }
    /// backup: something the user must hear even from cron, where notices
    /// are not shown (a full stream nobody planned for, a hold record that
    /// cannot be read).
    fn warning(&self, msg: &str) {
        let _ = msg;
    }
    /// backup: before the first entry, when
    /// [`wants_total`](Progress::wants_total) says so (always for `verify
    /// --read-data` and `restore`): how many snapshots the operation
    /// stores or reads and the size of all their raw streams (`run`: from
    /// exact estimates, a metadata pass over each snapshot, no file data
    /// read).
    fn plan(&self, snapshots: usize, stream_bytes: u64) {
        let _ = (snapshots, stream_bytes);
    }
    /// backup: the snapshot about to be stored gets a full stream, and why.
    fn full(&self, path: &str, why: FullReason) {
        let _ = (path, why);
    }
    /// backup: an entry starts being stored, checked or restored;
    /// `stream_total` is its raw stream's size in bytes (estimated when
    /// storing; 0 when not computed).
    fn start(&self, path: &str, kind: Kind, stream_total: u64) {
        let _ = (path, kind, stream_total);
    }
    /// backup: `bytes` more of the raw stream were stored, checked or
    /// restored.
    fn stream(&self, bytes: u64) {
        let _ = bytes;
    }
    /// backup: the stream of the snapshot being stored continues the
    /// partial file an interrupted run left: `stream_bytes` of its raw
    /// stream (`stored_bytes` in the file) are kept, the rest is sent now.
    fn resumed(&self, path: &str, stream_bytes: u64, stored_bytes: u64) {
        let _ = (path, stream_bytes, stored_bytes);
    }
    /// backup: a snapshot (or an imported file) was stored as `entry`.
    fn stored(&self, entry: &Entry) {
        let _ = entry;
    }
    /// backup: `subvol` has not changed since its newest snapshot
    /// `snapshot`: no snapshot is taken (`run --snapshot`).
    fn unchanged(&self, subvol: &Path, snapshot: &Path) {
        let _ = (subvol, snapshot);
    }
    /// backup: the snapshot (or file) at `path` was stored already, as
    /// `entry`.
    fn skipped(&self, path: &str, entry: &Entry) {
        let _ = (path, entry);
    }
    /// backup: the snapshot (or file) at `path` could not be stored; the
    /// operation goes on with the others.
    fn failed(&self, path: &str, err: &(dyn Error + 'static)) {
        let _ = (path, err);
    }
    /// backup: whether to estimate every snapshot's stream first (a pass
    /// over its metadata) for [`plan`](Progress::plan).
    fn wants_total(&self) -> bool {
        false
    }
}

/// A [`Progress`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A sink that records what it is told.
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Progress for Log {
        fn data(&self, bytes: u64) {
            self.0.lock().unwrap().push(format!("data {bytes}"));
        }
        fn error(&self, err: &dyn Error) {
            self.0.lock().unwrap().push(format!("error {err}"));
        }
    }

    #[test]
    fn defaults_ignore_and_overrides_receive() {
        let log = Log::default();
        let p: &dyn Progress = &log;
        p.subvol_start(b"a", false);
        p.data(5);
        p.error(&std::io::Error::other("disk on fire"));
        p.position(1, 1);
        NoProgress.data(1);
        assert_eq!(*log.0.lock().unwrap(), ["data 5", "error disk on fire"]);
    }
}
