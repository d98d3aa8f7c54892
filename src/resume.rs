//! Resuming an interrupted send stream: the design, the resume token and
//! the continuation stream that `btrsend send --resume TOKEN` writes.
//!
//! # Design
//!
//! A btrsend stream is deterministic: the same snapshot (uuid, ctransid),
//! parent, clone sources, protocol and options give the same commands,
//! byte for byte, as long as the filesystem's layout does not change (a
//! balance in between can make a CLONE name another of the references to a
//! shared extent, or split an extent, as it does for `btrfs send`; then
//! the shape chain below refuses a token when the commands before its point
//! no longer have the same numbers and lengths). So the sender resumes by planning the send again and
//! dropping every command before the resume point, counted by the sizing
//! mode of `send --estimate` (no file data is read for a dropped WRITE:
//! skipping costs the metadata walk only), and the receiver continues from
//! a point up to which everything is applied.
//!
//! **Shape chain.** Both ends fold every command of a subvolume's stream,
//! from its SUBVOL or SNAPSHOT on, into a chained digest of its number and
//! wire length ([`Shape`]). The receiver keeps it with its resume point;
//! the sender recomputes it while skipping and refuses to continue when it
//! differs: a send made with other options or clone sources, or of a
//! snapshot that is not the same, makes other commands (an ENCODED_WRITE
//! for a WRITE, a CLONE for a WRITE, other lengths) long before any
//! difference could show in the tree.
//!
//! **Receiver: checkpoints with rollback.** Namespace commands (RENAME,
//! LINK, UNLINK, RMDIR, MKFILE…) are not idempotent and the receiver's data
//! lanes apply file data out of order, so "replay what may have been
//! applied" is unsound. Instead the receiver rolls back to a checkpoint,
//! taken every [`CHECKPOINT_BYTES`] of stream where every command before
//! the point is applied (every lane job before it run, no command held
//! back: see "Checkpoints do not wait for the data lanes"). In both
//! modes (subvolume mode: a btrfs target, as root; directory mode: any
//! other filesystem, or not as root) a checkpoint is an undo journal: the
//! receiver journals how to undo what it changes after a checkpoint,
//! before it changes it. A checkpoint creates an empty journal
//! `DIR/.btrsend-resume/NAME/undo-INDEX` and a trash directory (directory
//! mode: `trash-INDEX/` beside it; subvolume mode:
//! `.btrsend-trash-UUID-INDEX/`, UUID the hex of the received subvolume's
//! UUID, in the subvolume's root, since a rename cannot leave a
//! subvolume; only names with the receive's own UUID are ever taken for
//! its trash, so entries of the tree named `.btrsend-trash-…` stay; made
//! and removed with the root's times kept, the last one removed before the
//! subvolume is made read-only; a stream that makes an entry of that name
//! in the root while it is there fails as on an existing name), then
//! writes the state
//! `DIR/.btrsend-resume/NAME/state` (the token, the system's boot id and
//! the FILEATTRs still to set, a temporary file renamed into place), then
//! deletes the previous journal and trash. Nothing of this is flushed to
//! the device: see "What survives what" below.
//!
//! **Start mark.** Before its first checkpoint a partial subvolume has no
//! resume point, so a receive interrupted in its first interval (or, in
//! directory mode, while an incremental copies its parent, which may take
//! long) could not be resumed. Journaling from the very start would make
//! it resumable but costs a small incremental as much again (measured:
//! 0.63 → 1.08 s for 10 MiB of namespace changes into btrfs), and what
//! would be re-sent is at most one interval anyway. Instead, right after a
//! SUBVOL or SNAPSHOT makes `DIR/NAME` (before a directory-mode copy), the
//! receiver writes `DIR/.btrsend-resume/NAME/start`: the snapshot's uuid
//! and ctransid and the identity of what it made (a subvolume's own UUID; a
//! directory's inode number and birth time; none where the filesystem
//! tells no birth time, and then no mark). A later SUBVOL / SNAPSHOT of
//! the same snapshot that finds `DIR/NAME` incomplete with no resume point
//! this boot can use (none yet, or one of another boot with no durable
//! checkpoint: see "What survives what") but with a start mark naming that
//! very object removes it (a subvolume
//! deleted, a directory removed without following symlinks) and makes it
//! afresh; anything else in its place is refused as before, and left
//! alone. `--resume-token` says to receive the whole stream again. No
//! start mark is written with checkpoints off.
//!
//! **Checkpoints do not wait for the data lanes.** With data lanes a
//! checkpoint does not drain them: it starts its journal at once (the
//! receiving thread goes on with the stream, journaling into it), notes
//! how many jobs each lane has been given, and makes the state name it
//! only when the lanes have run those jobs (checked after each command),
//! so the resume point is still a point where every command before it is
//! applied. Until then the state names the previous checkpoint and a
//! rollback undoes both journals, the newer first (the newer's entries
//! lead back to the checkpoint's tree, the older's from there to the
//! previous one); the first change of a file since the checkpoint waits
//! for its lane first, so what the journal saves of it includes every
//! write before the checkpoint, but for an append: the size the jobs
//! queued before the checkpoint leave the file is known without them
//! (writes only extend it, a TRUNCATE sets it; a queued CHMOD, CHOWN,
//! UTIMES or FALLOCATE makes it unknown, and then it waits), and that size
//! is what the journal saves. If the lanes have not reached it a
//! sixteenth of the interval (at most 4 MiB) later, the receiving thread
//! waits for them there, so what is sent again after an interruption
//! stays within the bound below. A durable checkpoint (a snapshot, below,
//! which must hold everything before it) and a receive without lanes
//! (`--threads 1`) drain the lanes first.
//!
//! **Durable checkpoints (subvolume mode).** Some checkpoints are also
//! durable: after creating the journal, a snapshot of the partial
//! subvolume, `DIR/.btrsend-resume/NAME/ckpt-INDEX` (its creation flushes
//! the subvolume's data and commits it), then its state written to
//! `durable` and flushed (file and rename), then `state` as above, then the
//! previous snapshot deleted. A snapshot costs a transaction commit and the
//! flush of everything written since the last one (about 0.1 s and more),
//! so they are taken on a budget: when the time since the last one is at
//! least 20 times what the next is expected to cost, or after 4 GiB of
//! stream: at most about 5 % of the receive's time. The expected cost is
//! what the last one cost (the first counted as 0.1 s, so it comes 2 s
//! after the subvolume's first checkpoint), but at least the time to write
//! the stream applied since the last one at 256 MiB/s (a stream of large
//! files applied at 1 GiB/s thus makes one every 4 GiB). After a restart the
//! receive goes back to the last durable checkpoint: the partial
//! `DIR/NAME` is replaced by a writable snapshot of it (exactly the
//! subvolume as it was then), so what is sent again is what the receive
//! applied in up to 20 times that expected cost (a few seconds of
//! stream) or 4 GiB, whichever came first, plus 16 MiB. In the same boot a
//! journal rollback is used, even to a durable checkpoint (its journal
//! starts with it). The received UUID and read-only flag are set at the
//! very end, as for any receive, and the resume point is deleted then.
//!
//! **The undo journal.** From a checkpoint on each command first
//! appends what undoes it to the journal (paths as they are right after
//! the command, so undoing in reverse order finds each object where its
//! entry says):
//!
//! * the first change of an object that existed at the checkpoint (its
//!   data, attributes, xattrs, or for a directory its entries) saves its
//!   mode, owner, atime, mtime and, for a regular file, its size; objects
//!   created since need nothing saved (their creation is undone);
//! * a creation (MKFILE, MKDIR, MKNOD, MKFIFO, MKSOCK, SYMLINK, LINK)
//!   records the new name, once the name is seen to be free: undone by
//!   removing it (a directory with all it holds). Nothing is recorded for an
//!   entry made in a directory that was itself created since the checkpoint:
//!   the directory's removal takes it (what is renamed or linked out of such
//!   a directory is recorded as such, and undone first);
//! * UNLINK and RMDIR do not delete: they move the entry into the trash
//!   (after the checks the system call would make); a RENAME that replaces
//!   its destination moves the destination to the trash first. Undone by
//!   renaming back. Nothing that a rollback needs is ever destroyed before
//!   the next checkpoint makes it unnecessary;
//! * WRITE, CLONE, ENCODED_WRITE, FALLOCATE (hole punching) and TRUNCATE
//!   of a file that existed at the checkpoint save the bytes they overwrite
//!   or cut off below its size at the checkpoint (data beyond that size is
//!   undone by restoring the size); appending to such a file saves nothing
//!   and still goes to the data lanes (but for a plain WRITE read from a
//!   stream file, written on the receiving thread, where it measured
//!   faster). Data saved is at most what these
//!   commands overwrite, in pieces of 4 MiB;
//! * SET_XATTR and REMOVE_XATTR save the old value (or its absence);
//!   CHMOD, CHOWN and UTIMES are undone by the saved attributes; FILEATTR
//!   is applied only at the end anyway (the flags still to set are written
//!   into the state at each checkpoint, by the files' paths then, for both
//!   modes).
//!
//! Each entry has its length and a check sum: a torn last entry (killed
//! while writing it) ends the journal, and its change was never started.
//! Resuming undoes the entries from the last back, counting the steps done
//! in the journal's header; every step checks what is there first (a
//! rename undone only if its source is free and its destination present, a
//! trash entry moved back only if it is still in the trash), so a rollback
//! that is itself interrupted is simply made again. Then the journal starts
//! afresh and the receive continues. This is sound under kill -9 at any
//! moment, a closed pipe, or a full disk (a journal entry that cannot be
//! written fails its command before anything changes, and a checkpoint
//! that fails for want of space stops the receive there). Nothing is ever
//! written outside DIR.
//!
//! **What survives what.** A process that dies (kill -9, a closed pipe, a
//! full disk of either side, a crash of btrsend itself) loses nothing it
//! wrote: the page cache keeps every write, in the order the system calls
//! made them, until the kernel writes it out. So a resume point that
//! only has to survive the death of the receiver needs no flush at all,
//! and the write-then-rename of the state is atomic with respect to it.
//! A power loss or an OS crash is another matter: what reaches the disk
//! is then whatever the filesystem had written out, in any order (a
//! change can be on disk while the journal entry written before it is
//! not). The state therefore records the boot id of the system that wrote
//! it (`/proc/sys/kernel/random/boot_id`, a random UUID per boot), and a
//! resume point is used only as far as the failures it survives:
//!
//! | resume point | kill -9, closed pipe, ENOSPC | power loss, OS crash |
//! |---|---|---|
//! | directory mode (undo journal) | resumed from the last checkpoint, tree exact | refused: `DIR/NAME` cannot be trusted; the whole stream received again starts it over |
//! | subvolume mode, with a durable checkpoint | resumed from the last checkpoint, tree exact | resumed from the last durable checkpoint (snapshot and `durable` flushed), tree exact |
//! | subvolume mode, none durable yet (the first seconds) | resumed from the last checkpoint, tree exact | refused, as in directory mode |
//!
//! A resume point of another boot (or a `state` a crash left torn) with no
//! durable checkpoint is refused with that message by `--resume-token` and
//! by a continuation stream, and nothing in DIR is changed; the whole
//! stream received again starts `DIR/NAME` over when its start mark names
//! it (the mark's identity does not depend on what reached the disk), and
//! is refused in the same way when not (an old state without a boot id, from an
//! earlier btrsend that flushed every checkpoint, is still used).
//! `--resume-token` prints the token of the point a resume would use.
//!
//! **Re-sent data.** A checkpoint is taken as soon as [`CHECKPOINT_BYTES`]
//! (48 MiB) of stream were applied since the last one, and is the resume
//! point at most 3 MiB later (see the data lanes above); with the
//! receiver's read-ahead (at most 9 MiB) and a pipe buffer, at most 64 MiB of what
//! the sender wrote before an interruption is sent again (after a restart,
//! subvolume mode: see the durable checkpoints above).
//! [`ReceiveOptions::checkpoint_interval`](crate::receive::ReceiveOptions::checkpoint_interval)
//! (`receive --checkpoint-interval`) sets another interval; 0 takes no
//! checkpoints at all (a one-shot receive, e.g. `backup restore`): an
//! interrupted receive then leaves its subvolume incomplete with no resume
//! point, as `btrfs receive` does.
//!
//! **Continuation stream.** `send --resume` writes a stream header with the
//! magic [`CONTINUATION_MAGIC`] instead of `btrfs-stream`, the protocol
//! version, a 32-bit length and the binary token, then the commands from
//! the resume point on, unchanged (each command carries its own CRC). The
//! stock `btrfs receive` refuses it before doing anything ("unexpected
//! header": btrfs-progs compares the magic first), so it can never build a
//! wrong tree from a continuation. Streams of further subvolumes follow as
//! usual. `btrsend receive` recognises the header, finds the partial
//! subvolume by the token's snapshot identity, rolls it back to its
//! checkpoint and continues. A continuation from an earlier point than the
//! checkpoint (an older token) is accepted: the commands the checkpoint
//! already holds are read, checked against the shape chain and dropped.
//! For the same reason a plain receive of the whole stream again into a
//! DIR holding the partial NAME continues it from its checkpoint.
//!
//! **Token.** `btrsend receive --resume-token DIR/NAME` prints the resume
//! point as one shell-safe line: `btrsend-resume-1-` and the hex of
//! [`Token`]'s 101 bytes: format 1, snapshot uuid and ctransid, parent uuid
//! and ctransid (zero for a full send), protocol version, the command index
//! and stream offset to continue from, the shape chain there, and 16 bytes
//! of a keyed BLAKE3 hash of all of it (a mistyped or edited token is
//! refused).

use std::fmt;

/// Bytes of stream applied between two checkpoints of a receive.
pub const CHECKPOINT_BYTES: u64 = 48 << 20;

/// Magic of a continuation stream's header (13 bytes, as `btrfs-stream\0`).
pub use stream_format::CONTINUATION_MAGIC;

/// The textual token's prefix.
pub const TOKEN_PREFIX: &str = "btrsend-resume-1-";

/// Bytes of a token in binary.
pub const TOKEN_LEN: usize = 101;

/// Offset of a stream's first command (after `btrfs-stream\0` and the
/// version).
pub const FIRST_COMMAND: u64 = 17;

const MAC_CONTEXT: &str = "btrsend 2026-11 resume token v1";

/// The running system's boot id (`/proc/sys/kernel/random/boot_id`, a
/// random UUID the kernel makes at each boot), or `None` where it cannot be
/// read. A resume point that is not flushed to the device is valid only
/// while it is the same (see "What survives what" in the module doc).
pub fn boot_id() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let s = s.trim();
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then(|| s.to_owned())
}

/// The chained digest of the commands of a stream so far (see the module
/// doc): each command's number and length on the wire (header included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape(pub [u8; 16]);

impl Shape {
    /// Fold one command in: number `cmd`, `len` bytes on the wire.
    pub fn push(&mut self, cmd: u16, len: u64) {
        let mut h = blake3::Hasher::new();
        h.update(&self.0);
        h.update(&cmd.to_le_bytes());
        h.update(&len.to_le_bytes());
        let out = h.finalize();
        self.0.copy_from_slice(&out.as_bytes()[..16]);
    }
}

/// Where a subvolume's stream continues: what was sent, and the point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// The snapshot's UUID (SUBVOL / SNAPSHOT).
    pub uuid: [u8; 16],
    /// Its ctransid.
    pub ctransid: u64,
    /// The parent's UUID and ctransid (SNAPSHOT), zero for a full send.
    pub parent_uuid: [u8; 16],
    /// See [`Token::parent_uuid`].
    pub parent_ctransid: u64,
    /// Protocol version of the stream.
    pub version: u32,
    /// Index of the first command to send (SUBVOL / SNAPSHOT is 0).
    pub index: u64,
    /// Its offset in the stream (the first command's is
    /// [`FIRST_COMMAND`]).
    pub offset: u64,
    /// The shape chain of the commands before it.
    pub shape: Shape,
}

/// Why a token cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// It does not start with [`TOKEN_PREFIX`].
    Prefix,
    /// Not hex, or not [`TOKEN_LEN`] bytes.
    Length(usize),
    /// A character that is not a hex digit, at this position.
    NotHex(usize),
    /// The hash does not match: mistyped, cut or edited.
    Hash,
    /// A field makes no sense.
    Field(&'static str),
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Prefix => write!(f, "it does not start with {TOKEN_PREFIX}"),
            TokenError::Length(n) => write!(
                f,
                "it has {n} hex digits after the prefix, not {}",
                2 * TOKEN_LEN
            ),
            TokenError::NotHex(i) => write!(f, "character {i} is not a hex digit"),
            TokenError::Hash => {
                f.write_str("its check hash does not match (mistyped, cut or edited)")
            }
            TokenError::Field(w) => write!(f, "invalid {w}"),
        }
    }
}

impl std::error::Error for TokenError {}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(b.get(at..at + 8).unwrap_or(&[0; 8]));
    u64::from_le_bytes(x)
}

impl Token {
    /// The token in binary (with its hash).
    pub fn to_bytes(&self) -> [u8; TOKEN_LEN] {
        let mut b = [0u8; TOKEN_LEN];
        b[0] = 1;
        b[1..17].copy_from_slice(&self.uuid);
        b[17..25].copy_from_slice(&self.ctransid.to_le_bytes());
        b[25..41].copy_from_slice(&self.parent_uuid);
        b[41..49].copy_from_slice(&self.parent_ctransid.to_le_bytes());
        b[49..53].copy_from_slice(&self.version.to_le_bytes());
        b[53..61].copy_from_slice(&self.index.to_le_bytes());
        b[61..69].copy_from_slice(&self.offset.to_le_bytes());
        b[69..85].copy_from_slice(&self.shape.0);
        let mac = blake3::derive_key(MAC_CONTEXT, &b[..85]);
        b[85..].copy_from_slice(&mac[..16]);
        b
    }

    /// Read a binary token (checking its hash and fields).
    ///
    /// # Errors
    ///
    /// [`TokenError`].
    pub fn from_bytes(b: &[u8]) -> Result<Token, TokenError> {
        if b.len() != TOKEN_LEN {
            return Err(TokenError::Length(2 * b.len()));
        }
        let mac = blake3::derive_key(MAC_CONTEXT, &b[..85]);
        if b[85..] != mac[..16] {
            return Err(TokenError::Hash);
        }
        if b[0] != 1 {
            return Err(TokenError::Field("format"));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[1..17]);
        let mut parent_uuid = [0u8; 16];
        parent_uuid.copy_from_slice(&b[25..41]);
        let mut shape = [0u8; 16];
        shape.copy_from_slice(&b[69..85]);
        let mut v = [0u8; 4];
        v.copy_from_slice(&b[49..53]);
        let t = Token {
            uuid,
            ctransid: u64_at(b, 17),
            parent_uuid,
            parent_ctransid: u64_at(b, 41),
            version: u32::from_le_bytes(v),
            index: u64_at(b, 53),
            offset: u64_at(b, 61),
            shape: Shape(shape),
        };
        if !(1..=3).contains(&t.version) {
            return Err(TokenError::Field("protocol version"));
        }
        if t.index == 0 || t.offset < FIRST_COMMAND {
            return Err(TokenError::Field("resume point"));
        }
        Ok(t)
    }

    /// Whether the stream is incremental (has a parent).
    pub fn has_parent(&self) -> bool {
        self.parent_uuid != [0; 16]
    }

    /// Parse the textual form ([`Token`]'s `Display`).
    ///
    /// # Errors
    ///
    /// [`TokenError`].
    pub fn parse(s: &str) -> Result<Token, TokenError> {
        let hex = s
            .trim()
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(TokenError::Prefix)?;
        if hex.len() != 2 * TOKEN_LEN {
            return Err(TokenError::Length(hex.len()));
        }
        let digit = |i: usize, c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(TokenError::NotHex(TOKEN_PREFIX.len() + i)),
        };
        let h = hex.as_bytes();
        let mut b = [0u8; TOKEN_LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = digit(2 * i, h[2 * i])? << 4 | digit(2 * i + 1, h[2 * i + 1])?;
        }
        Token::from_bytes(&b)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(TOKEN_PREFIX)?;
        for b in self.to_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// The header of a continuation stream for `token` (see the module doc).
pub fn continuation_header(token: &Token) -> Vec<u8> {
    let mut h = Vec::with_capacity(13 + 8 + TOKEN_LEN);
    h.extend_from_slice(CONTINUATION_MAGIC);
    h.extend_from_slice(&token.version.to_le_bytes());
    h.extend_from_slice(&(TOKEN_LEN as u32).to_le_bytes());
    h.extend_from_slice(&token.to_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        let mut shape = Shape::default();
        shape.push(1, 100);
        shape.push(15, 49_000);
        Token {
            uuid: [7; 16],
            ctransid: 12,
            parent_uuid: [0; 16],
            parent_ctransid: 0,
            version: 2,
            index: 2,
            offset: 17 + 49_100,
            shape,
        }
    }

    #[test]
    fn a_token_round_trips_as_one_shell_safe_line() {
        let t = token();
        let s = t.to_string();
        assert!(s.starts_with(TOKEN_PREFIX));
        assert_eq!(s.len(), TOKEN_PREFIX.len() + 2 * TOKEN_LEN);
        assert!(
            s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'),
            "{s}"
        );
        assert_eq!(Token::parse(&s), Ok(t));
        assert_eq!(Token::parse(&format!(" {s}\n")), Ok(t));
        assert!(!t.has_parent());
    }

    #[test]
    fn a_damaged_token_is_refused_with_the_reason() {
        let s = token().to_string();
        assert_eq!(Token::parse("resume-1-00"), Err(TokenError::Prefix));
        assert_eq!(
            Token::parse(&s[..s.len() - 2]),
            Err(TokenError::Length(2 * TOKEN_LEN - 2))
        );
        let mut bad = s.clone().into_bytes();
        bad[TOKEN_PREFIX.len() + 5] = b'g';
        let bad = String::from_utf8(bad).unwrap();
        assert_eq!(
            Token::parse(&bad),
            Err(TokenError::NotHex(TOKEN_PREFIX.len() + 5))
        );
        // One digit changed: the hash catches it, wherever it is.
        for at in [
            TOKEN_PREFIX.len() + 3,
            TOKEN_PREFIX.len() + 110,
            s.len() - 1,
        ] {
            let mut b = s.clone().into_bytes();
            b[at] = if b[at] == b'0' { b'1' } else { b'0' };
            let e = Token::parse(std::str::from_utf8(&b).unwrap()).unwrap_err();
            assert_eq!(e, TokenError::Hash, "digit {at}");
            assert_eq!(
                e.to_string(),
                "its check hash does not match (mistyped, cut or edited)"
            );
        }
        // A well-hashed token with a nonsense field.
        let mut t = token();
        t.version = 9;
        assert_eq!(
            Token::from_bytes(&t.to_bytes()),
            Err(TokenError::Field("protocol version"))
        );
        let mut t = token();
        t.index = 0;
        assert_eq!(
            Token::from_bytes(&t.to_bytes()),
            Err(TokenError::Field("resume point"))
        );
    }

    #[test]
    fn the_shape_chain_depends_on_every_command_and_its_order() {
        let chain = |cmds: &[(u16, u64)]| {
            let mut s = Shape::default();
            for &(c, l) in cmds {
                s.push(c, l);
            }
            s
        };
        let a = chain(&[(1, 50), (15, 1000), (3, 40)]);
        assert_ne!(a, chain(&[(1, 50), (3, 40), (15, 1000)]));
        assert_ne!(a, chain(&[(1, 50), (15, 1001), (3, 40)]));
        assert_ne!(a, chain(&[(1, 50), (25, 1000), (3, 40)]));
        assert_eq!(a, chain(&[(1, 50), (15, 1000), (3, 40)]));
    }

    #[test]
    fn the_continuation_header_is_refused_by_a_btrfs_stream_reader() {
        let h = continuation_header(&token());
        assert_eq!(&h[..13], CONTINUATION_MAGIC);
        assert_ne!(&h[..13], stream_format::STREAM_MAGIC);
        let e = stream_format::StreamReader::new(&h[..])
            .next_command()
            .unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
    }
}
