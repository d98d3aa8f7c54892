//! The `btrsend` command line as a library, so tests can reach the clap
//! definition (man pages, completions) and the exit codes.

pub mod args;
pub mod cmd;
pub mod exit;
pub mod man;
pub mod progress;
pub mod repository_man;
pub mod signal;
pub mod text;
