//! Integration tests of the stream-format crate: byte equality with kernel
//! streams and btrfs-progs dumps, typed round trips, and mutated streams.

mod common;
mod kernel;
mod mutate;
mod quirks;
mod round_trip;
