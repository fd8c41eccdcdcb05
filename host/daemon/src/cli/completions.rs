//! `narad completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell on
//! stdout, generated from the same clap definitions that parse the command line.

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

/// Writes the completion script to stdout.
pub fn run(args: &CompletionsArgs) {
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "narad", &mut std::io::stdout());
}
