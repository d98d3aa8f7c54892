//! `btrsend`: the command-line front end.
//!
//! Glue only: clap structs → validated options → the core library → an exit
//! code (see `exit.rs`). Errors are printed once, as `btrsend: error: …`.

mod args;
mod cmd;
mod exit;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    match cmd::run(cli) {
        Ok(()) => exit::Exit::Success.into(),
        Err(err) => {
            let code = exit::Exit::from_error(&err);
            if code != exit::Exit::Quiet {
                eprintln!("btrsend: error: {err:#}");
            }
            code.into()
        }
    }
}
