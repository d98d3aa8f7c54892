//! Backups: the repository of stored send streams (`btrsend backup`).
//!
//! * [`retention`]: which stored streams `backup forget` keeps.

pub mod retention;
