//! `narad completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell on
//! stdout, generated from the same clap definitions that parse the command line.

use std::io::Write as _;

use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

use super::Cli;

/// `narad completions`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  narad completions bash > ~/.local/share/bash-completion/completions/narad\n  narad completions zsh > \"${fpath[1]}/_narad\"\n  narad completions fish > ~/.config/fish/completions/narad.fish"
)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: Shell,
}

/// Writes the completion script to stdout. A failed write is returned, not a panic: the
/// script is generated into memory first because `clap_complete` panics when its writer fails
/// (as it does when `| head` closes the pipe).
pub fn run(args: &CompletionsArgs) -> anyhow::Result<()> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "narad", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script)?;
    stdout.flush()?;
    Ok(())
}
