//! One module per subcommand, each with its clap arguments and its `run`;
//! `main` dispatches. Nothing here imports `args` (which lists these
//! modules' arguments), so the two do not form a circle.

pub mod backup;
pub mod completions;
pub mod debug;
pub mod dump;
pub mod list;
pub mod manifest;
pub mod receive;
pub mod send;
pub mod serve;

/// `--limit-rate RATE` (see [`btrsend::rate::parse_rate`]).
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    btrsend::rate::parse_rate(s)
}
