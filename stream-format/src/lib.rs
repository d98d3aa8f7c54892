//! The btrfs send stream wire format: commands, attributes, encode, decode and
//! the `btrfs receive --dump` text format.
//!
//! Layout and numbers: Linux `fs/btrfs/send.h`, btrfs-progs
//! `common/send-stream.c` (see `shared/docs/send-stream-format.md`).

#![forbid(unsafe_code)]
