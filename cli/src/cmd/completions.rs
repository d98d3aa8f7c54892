//! `btrsend completions SHELL`: shell completion scripts from the clap definition.

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
    clap_complete::generate(args.shell, &mut cli, "btrsend", &mut std::io::stdout());
    Ok(())
}
