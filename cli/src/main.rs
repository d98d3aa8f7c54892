//! `btrsend`: the command-line front end.
//!
//! Glue only: clap structs → validated options → the core library → an exit
//! code (see `exit.rs`). Errors are printed once, as `btrsend: error: …`.

use std::process::ExitCode;

use btrsend_cli::args::{Cli, Command};
use btrsend_cli::exit::{self, Exit};
use btrsend_cli::{cmd, signal};
use clap::CommandFactory;

fn main() -> ExitCode {
    let cli = btrsend_cli::args::parse();
    signal::install();
    match run(cli) {
        // A report line that met a closed pipe did not stop the work
        // (receive, backup run --json), but the output is incomplete.
        Ok(()) if exit::stdout_closed() => {
            eprintln!("btrsend: error: {}", Exit::BROKEN_PIPE);
            Exit::BrokenPipe.into()
        }
        Ok(()) => Exit::Success.into(),
        Err(err) => {
            let code = Exit::from_error(&err);
            match code {
                Exit::Quiet => {}
                _ if !Exit::prints(&err) => {}
                Exit::BrokenPipe => eprintln!("btrsend: error: {}", Exit::BROKEN_PIPE),
                _ => eprintln!(
                    "btrsend: error: {}",
                    btrsend_cli::text::printable_lines(&btrsend_cli::text::error_text(&err))
                ),
            }
            code.into()
        }
    }
}

/// Run the parsed command line: the one place that knows both the clap
/// definition (`args`) and the subcommands (`cmd`), so neither imports the
/// other's dispatch.
fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Backup(a) => cmd::backup::run(&a),
        Command::Dump(a) => cmd::dump::run(&a),
        Command::List(a) => cmd::list::run(&a),
        Command::Send(a) => cmd::send::run(&a),
        Command::Receive(a) => cmd::receive::run(&a),
        Command::Manifest(a) => cmd::manifest::run(&a),
        Command::Serve(a) => cmd::serve::run(&a),
        Command::Completions(a) => cmd::completions::run(&a, Cli::command()),
        Command::Debug(a) => cmd::debug::run(&a),
    }
}
