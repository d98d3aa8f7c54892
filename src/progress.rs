//! Progress: the one interface through which the library's long operations
//! — send, receive, and the backup built on them — tell their caller what
//! they are doing. The library never prints; the caller renders (the CLI
//! draws an indicatif bar on a terminal and plain lines otherwise, see
//! `cli/src/progress.rs`), or ignores it with [`NoProgress`].
//!
//! Every method has a default that does nothing, so a sink implements only
//! what it shows (the shape of rustic_core's `Progress`). Methods take
//! `&self` and the trait needs `Sync`, so one sink can be shared by the
//! threads of an operation; sinks keep their counters in atomics or a
//! mutex.
//!
//! Which operation reports what:
//!
//! | method | send | receive |
//! | --- | --- | --- |
//! | [`subvol_start`](Progress::subvol_start), [`subvol_done`](Progress::subvol_done) | each subvolume sent | each subvolume in the stream |
//! | [`data`](Progress::data) | file data bytes sent (written, encoded or cloned) | — |
//! | [`position`](Progress::position) | — | the input offset and commands read |
//! | [`inode`](Progress::inode) | each inode | — |
//! | [`note`](Progress::note) | — | what was not applied, once each |
//! | [`error`](Progress::error) | — | errors below `--max-errors` |
//! | [`command`](Progress::command) | — | each command, if [`lists_commands`](Progress::lists_commands) |
//! | [`encoded_fallback`](Progress::encoded_fallback) | — | compressed data decompressed because the target refused it |

use std::error::Error;

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
