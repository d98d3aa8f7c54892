//! `btrsend`: the command-line front end.
//!
//! Glue only: clap structs → validated options → the core library → an exit
//! code (see `exit.rs`). Errors are printed once, as `btrsend: error: …`.

use std::process::ExitCode;

use btrsend_cli::{args, cmd, exit::Exit};
use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    match cmd::run(cli) {
        Ok(()) => Exit::Success.into(),
        Err(err) => {
            let code = Exit::from_error(&err);
            if code != Exit::Quiet && Exit::prints(&err) {
                eprintln!("btrsend: error: {err:#}");
            }
            code.into()
        }
    }
}
