//! Exit codes: the one documented list (also in the man page).
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success |
//! | 1 | the operation failed: bad input, an I/O error, a corrupt stream or filesystem |
//! | 2 | usage error (clap's default for a bad command line) |
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
}

impl Exit {
    /// Map an error to its exit code.
    pub fn from_error(_err: &anyhow::Error) -> Exit {
        Exit::Failure
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        match e {
            Exit::Success => ExitCode::SUCCESS,
            Exit::Failure | Exit::Quiet => ExitCode::from(1),
        }
    }
}
