//! `btrsend backup key`: the passphrases of a repository encrypted with
//! one (list, add, remove, passwd), and what keys a repository has.

use std::io::Write;
use std::path::PathBuf;

use btrsend::backup::NoProgress;
use btrsend::backup::crypt::SecretString;
use clap::{Args, Subcommand};

use super::secrets::{self, PassArgs};
use super::{LockArg, RepoArg};
use crate::text::printable;

/// Arguments of `btrsend backup key`.
#[derive(Debug, Args)]
pub struct KeyCmdArgs {
    #[command(subcommand)]
    command: KeyCommand,
}

/// The subcommands of `btrsend backup key`.
#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// List the repository's keys (the one the passphrase given opens is
    /// marked), its recipients and its write key's fingerprint.
    List(ListArgs),
    /// Add a passphrase (a new key object; nothing else is re-encrypted).
    Add(NewArgs),
    /// Remove a passphrase's key object, by its name in key list (never
    /// the one the passphrase given opens).
    Remove(RemoveArgs),
    /// Change the passphrase given: add the new one, remove the old one.
    Passwd(NewArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Print the keys as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct NewArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// Read the new passphrase from the first line of FILE (default: a
    /// prompt, twice, on the terminal).
    #[arg(
        long = "new-password-file",
        value_name = "FILE",
        conflicts_with = "new_password_command"
    )]
    new_password_file: Option<PathBuf>,
    /// Run CMD with sh -c and read the new passphrase from the first line
    /// of its output.
    #[arg(long = "new-password-command", value_name = "CMD")]
    new_password_command: Option<String>,
    #[command(flatten)]
    lock: LockArg,
}

#[derive(Debug, Args)]
struct RemoveArgs {
    #[command(flatten)]
    repo: RepoArg,
    /// The key's name, as key list shows it (pass-…).
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    lock: LockArg,
}

impl NewArgs {
    fn new_passphrase(&self) -> anyhow::Result<SecretString> {
        let given = PassArgs {
            password_file: self.new_password_file.clone(),
            password_command: self.new_password_command.clone(),
        };
        if self.new_password_file.is_some() || self.new_password_command.is_some() {
            return given
                .passphrase()?
                .ok_or_else(|| anyhow::anyhow!("no new passphrase"));
        }
        secrets::prompt("New passphrase", true).map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// Run `btrsend backup key`.
pub fn run(a: &KeyCmdArgs) -> anyhow::Result<()> {
    let mut out = crate::exit::stdout();
    match &a.command {
        KeyCommand::List(l) => {
            let repo = l.repo.open()?;
            let keys = repo.key_list()?;
            if l.json {
                let v = serde_json::json!({
                    "keys": keys,
                    "recipients": repo.recipients(),
                    "write_key_fingerprint": repo.write_key_fingerprint(),
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
                return Ok(());
            }
            for k in &keys {
                let mark = if k.current {
                    "  (opened by the passphrase given)"
                } else {
                    ""
                };
                writeln!(out, "{}  {}{mark}", printable(&k.name), k.kind)?;
            }
            for r in repo.recipients() {
                writeln!(out, "recipient  {r}")?;
            }
            if let Some(f) = repo.write_key_fingerprint() {
                writeln!(out, "write key fingerprint  {f}")?;
            }
        }
        KeyCommand::Add(n) => {
            let repo = n.repo.open()?;
            let new = n.new_passphrase()?;
            let name = repo.key_add(&new, secrets::scrypt_log_n()?, n.lock.wait(), &NoProgress)?;
            writeln!(out, "added the passphrase key {name}")?;
        }
        KeyCommand::Passwd(n) => {
            let repo = n.repo.open()?;
            let new = n.new_passphrase()?;
            let name =
                repo.key_passwd(&new, secrets::scrypt_log_n()?, n.lock.wait(), &NoProgress)?;
            writeln!(out, "changed the passphrase: its key is now {name}")?;
        }
        KeyCommand::Remove(r) => {
            let repo = r.repo.open()?;
            repo.key_remove(&r.name, r.lock.wait(), &NoProgress)?;
            writeln!(out, "removed the passphrase key {}", printable(&r.name))?;
        }
    }
    Ok(())
}
