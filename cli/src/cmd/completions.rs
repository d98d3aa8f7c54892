//! `btrsend completions SHELL`: shell completion scripts from the clap definition.

use std::io::Write as _;

use clap::Args;
use clap_complete::Shell;

/// Arguments of `btrsend completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to write completions for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Write the completion script of `cli` (the whole clap definition, passed
/// in by `main`) for the chosen shell to stdout.
pub fn run(args: &CompletionsArgs, mut cli: clap::Command) -> anyhow::Result<()> {
    // Into memory first: clap_complete panics on a write error (a closed
    // pipe), which must end like in every subcommand instead.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cli, "btrsend", &mut script);
    crate::exit::stdout().write_all(&script)?;
    Ok(())
}
