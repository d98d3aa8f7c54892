//! The receiver: applies send streams to a directory on any filesystem.
//!
//! Flow: `stream_format::StreamReader` → [`apply`] (one typed command at a
//! time) → [`target`] (the only stream-path → filesystem-path code) → the
//! kernel's `*at` system calls. [`meta`] keeps a record beside each received
//! subvolume (received UUID, ctransid, parent, completeness), the part of
//! `btrfs receive`'s root-item bookkeeping that a plain directory cannot hold.
//! Semantics per command follow btrfs-progs `cmds/receive.c` (see
//! `shared/docs/send-stream-format.md` §9, §10).

pub mod encoded;
pub mod meta;
pub mod target;
