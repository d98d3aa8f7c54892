//! Reaching a repository on another host: start the system's `ssh` with
//! `btrsend serve` at the far end, and speak the protocol over its
//! standard input and output.
//!
//! ssh's standard error is ours, so its questions (a host key to accept,
//! a passphrase) and the far end's messages reach the user's terminal;
//! what the far end sends on its standard output is only ever read as
//! protocol frames.

use std::process::{Command, Stdio};

use super::client::RemoteStore;
use super::spec::SshSpec;
use crate::backup::store::StoreError;

/// The variable that replaces the ssh command (`ssh` and its options,
/// split on whitespace), like borg's `BORG_RSH`.
pub const SSH_ENV: &str = "BTRSEND_SSH";
/// The variable that names the program to run on the far end.
pub const REMOTE_PATH_ENV: &str = "BTRSEND_REMOTE_PATH";

/// How to reach the far end: what `--ssh-command` and `--remote-path`
/// say, else [`SSH_ENV`] and [`REMOTE_PATH_ENV`], else `ssh` and
/// `btrsend`.
#[derive(Debug, Clone, Default)]
pub struct SshOptions {
    /// The ssh command and its options.
    pub command: Option<String>,
    /// The program on the far end.
    pub remote_path: Option<String>,
}

impl SshOptions {
    fn command(&self) -> String {
        self.command
            .clone()
            .or_else(|| std::env::var(SSH_ENV).ok())
            .filter(|c| !c.trim().is_empty())
            .unwrap_or_else(|| "ssh".into())
    }

    fn remote_path(&self) -> String {
        self.remote_path
            .clone()
            .or_else(|| std::env::var(REMOTE_PATH_ENV).ok())
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| "btrsend".into())
    }
}

/// Connect to the repository `spec` names (as the user typed it: `name`).
///
/// # Errors
///
/// [`StoreError::Unreachable`]: ssh cannot be started, the far end
/// cannot be reached, or it refuses the path.
pub fn open(name: &str, spec: &SshSpec, options: &SshOptions) -> Result<RemoteStore, StoreError> {
    connect(name, spec, false, options)
}

/// Connect to the received-subvolume target `spec` names (as the user
/// typed it: `name`).
///
/// # Errors
///
/// As [`open`], as a [`BackupError`](crate::backup::BackupError).
pub fn open_target(
    name: &str,
    spec: &SshSpec,
    options: &SshOptions,
) -> Result<super::client::RemoteTarget, crate::backup::BackupError> {
    Ok(super::client::RemoteTarget::new(connect(
        name, spec, true, options,
    )?))
}

fn connect(
    name: &str,
    spec: &SshSpec,
    target: bool,
    options: &SshOptions,
) -> Result<RemoteStore, StoreError> {
    let line = spec.command(&options.command(), &options.remote_path());
    let (program, args) = line.split_first().ok_or_else(|| StoreError::Unreachable {
        location: name.into(),
        error: "an empty ssh command".into(),
    })?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|error| StoreError::Unreachable {
            location: name.into(),
            error: format!("cannot start {program}: {error}").into(),
        })?;
    // Pipes of 1 MiB (the default is 64 KiB): a frame then goes to ssh
    // in a few writes, and the sender goes on while ssh encrypts it.
    // Best effort: a smaller pipe only costs speed.
    if let Some(stdin) = &child.stdin {
        let _ = rustix::pipe::fcntl_setpipe_size(stdin, PIPE_BYTES);
    }
    if let Some(stdout) = &child.stdout {
        let _ = rustix::pipe::fcntl_setpipe_size(stdout, PIPE_BYTES);
    }
    RemoteStore::connect_process(name, &spec.path, target, program, child)
}

/// The size asked for the pipes to ssh (Linux's default cap for an
/// unprivileged process, /proc/sys/fs/pipe-max-size).
const PIPE_BYTES: usize = 1 << 20;
