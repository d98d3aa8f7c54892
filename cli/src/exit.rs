//! Exit codes: the one documented list (also in the man page).
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success |
//! | 1 | the operation failed: bad input, an I/O error, a corrupt stream or filesystem |
//! | 2 | usage error (clap's default for a bad command line; `backup forget` with an empty policy) |
//! | 3 | `backup run`/`import`: some snapshots were stored and some failed |
//! | 10 | `backup`: the repository is missing or unreachable |
//! | 11 | `backup`: the repository's lock is held |
//! | 12 | `backup verify`: damage found |
//! | 130 | interrupted (SIGINT) |

use std::process::ExitCode;

/// What the process reports to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Everything worked.
    Success,
    /// The operation failed; the error was printed.
    Failure,
    /// The operation failed and has already said why (nothing more to print).
    Quiet,
    /// A usage error found after parsing (2), e.g. an empty retention
    /// policy.
    Usage,
    /// Some snapshots were stored and some failed (3).
    Partial,
    /// The repository is missing or unreachable (10).
    RepoMissing,
    /// The repository's lock is held (11).
    LockHeld,
    /// Verify found damage (12).
    Damage,
}

impl Exit {
    /// Map an error to its exit code.
    pub fn from_error(err: &anyhow::Error) -> Exit {
        for cause in err.chain() {
            if let Some(w) = cause.downcast_ref::<ExitWith>() {
                return w.code;
            }
            if let Some(b) = cause.downcast_ref::<btrsend::backup::BackupError>() {
                return crate::cmd::backup::exit_of(b);
            }
        }
        Exit::Failure
    }

    /// Whether the error behind this code still has to be printed.
    pub fn prints(err: &anyhow::Error) -> bool {
        !err.chain()
            .any(|c| c.downcast_ref::<ExitWith>().is_some_and(|w| w.quiet))
    }

    /// The number.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failure | Exit::Quiet => 1,
            Exit::Usage => 2,
            Exit::Partial => 3,
            Exit::RepoMissing => 10,
            Exit::LockHeld => 11,
            Exit::Damage => 12,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// An error that carries its exit code; `quiet` when what went wrong has
/// been printed already.
#[derive(Debug)]
pub struct ExitWith {
    /// The exit code.
    pub code: Exit,
    /// Nothing more to print.
    pub quiet: bool,
    msg: String,
}

impl ExitWith {
    /// An error with this message and code.
    pub fn new(code: Exit, msg: String) -> ExitWith {
        ExitWith {
            code,
            quiet: false,
            msg,
        }
    }

    /// An error that was reported already.
    pub fn quiet(code: Exit) -> ExitWith {
        ExitWith {
            code,
            quiet: true,
            msg: String::new(),
        }
    }
}

impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ExitWith {}
