//! `btrsend completions SHELL`: shell completion scripts from the clap definition.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::args::Cli;

/// Arguments of `btrsend completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to write completions for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Write the completion script for the chosen shell to stdout.
pub fn run(args: &CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "btrsend", &mut std::io::stdout());
    Ok(())
}
