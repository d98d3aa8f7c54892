//! One module per subcommand; `run` dispatches.

pub mod backup;
pub mod completions;
pub mod debug;
pub mod dump;
pub mod forget;
pub mod list;
pub mod manifest;
pub mod receive;
pub mod send;

use crate::args::{Cli, Command};

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Backup(a) => backup::run(&a),
        Command::Dump(a) => dump::run(&a),
        Command::List(a) => list::run(&a),
        Command::Send(a) => send::run(&a),
        Command::Receive(a) => receive::run(&a),
        Command::Manifest(a) => manifest::run(&a),
        Command::Completions(a) => completions::run(&a),
        Command::Debug(a) => debug::run(&a),
    }
}
