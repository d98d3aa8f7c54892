//! Exit codes: the one documented list (also in `--help` and the man pages'
//! EXIT STATUS section, both made from [`EXIT_STATUS`]).
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success |
//! | 1 | the operation failed: bad input, an I/O error, a corrupt stream or filesystem |
//! | 2 | usage error: a bad command line, options that conflict (clap's code for its own errors), or `backup forget` with an empty policy |
//! | 3 | `backup run`/`import`: some snapshots were stored and some failed; with `--config`, some jobs or destinations failed and others did not |
//! | 10 | `backup`: the repository is missing or unreachable |
//! | 11 | `backup`: the repository's lock is held |
//! | 12 | `backup verify`: damage found |
//! | 14 | `backup status`: a backup is stale (older than `--max-age`, or none) or its chain unhealthy |
//! | 130 | interrupted by SIGINT (Ctrl-C); 143 by SIGTERM |
//! | 141 | standard output's reader went away (a closed pipe), in every subcommand (`receive` and `backup run` finish their work first) |

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use btrsend::backup::BackupError;
use serde_json::json;

/// The exit status table, as `--help` and the man pages print it.
pub const EXIT_STATUS: &str = "\
  0    success
  1    the operation failed (bad input, an I/O error, a corrupt stream or
       filesystem); the error is printed once, as `btrsend: error: ...`
  2    usage error: a bad command line or options that conflict (e.g.
       --proto 1 --compressed-data), or backup forget with an empty policy
  3    backup run/import: some snapshots were stored and some failed;
       with --config, some jobs or destinations failed and others did not
  10   backup: the repository is missing or unreachable
  11   backup: the repository's lock is held (--retry-lock waits)
  12   backup verify: damage found
  13   backup: a passphrase, identity or write key is missing or wrong
  14   backup status: an origin's newest backup is older than --max-age
       (or the repository holds none), or its chain does not resolve
  130  interrupted (SIGINT, Ctrl-C); 143 terminated (SIGTERM). Nothing
       half-written is left: send -f FILE removes its temporary file
  141  standard output was closed by its reader (a broken pipe, e.g. `| head`),
       in every subcommand alike (send, dump, receive --dump, list, manifest,
       completions, backup list/verify/restore --stdout/forget): btrsend
       stops, says once that the output is incomplete, and exits
       128 + SIGPIPE, the status of a command killed by SIGPIPE. receive and
       backup run, whose standard output is only a report, finish their work
       first";

/// What the process reports to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: everything worked.
    Success,
    /// 1: the operation failed; the error was printed.
    Failure,
    /// 1: the operation failed and has already said why (nothing more to print).
    Quiet,
    /// 2: the command line is wrong (a [`UsageError`]; clap exits 2 itself
    /// for the errors it finds).
    Usage,
    /// 128 + the signal number: stopped by SIGINT (130) or SIGTERM (143).
    Signal(u8),
    /// 3: some snapshots were stored and some failed.
    Partial,
    /// 10: the repository is missing or unreachable.
    RepoMissing,
    /// 11: the repository's lock is held.
    LockHeld,
    /// 12: verify found damage.
    Damage,
    /// 13: a secret of an encrypted repository is missing or wrong.
    Key,
    /// 14: `backup status` found a stale or unhealthy backup.
    Stale,
    /// 141 (128 + SIGPIPE): standard output's reader went away.
    BrokenPipe,
}

impl Exit {
    /// SIGINT's exit status (128 + 2).
    pub const INTERRUPTED: u8 = 130;

    /// What `main` prints for [`Exit::BrokenPipe`], whatever the subcommand.
    pub const BROKEN_PIPE: &str =
        "standard output was closed by its reader (broken pipe): the output it got is incomplete";

    /// Map an error to its exit code: a [`UsageError`] anywhere in the chain
    /// is a usage error, a broken pipe (an I/O error of that kind anywhere
    /// in the chain: only standard output is a pipe btrsend writes; or a
    /// write through [`stdout`] that met one) is [`Exit::BrokenPipe`],
    /// everything else a failure.
    pub fn from_error(err: &anyhow::Error) -> Exit {
        if err.chain().any(|e| e.is::<UsageError>()) {
            return Exit::Usage;
        }
        if stdout_closed()
            || err.chain().any(|e| {
                e.downcast_ref::<io::Error>()
                    .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            })
        {
            return Exit::BrokenPipe;
        }
        for cause in err.chain() {
            if let Some(w) = cause.downcast_ref::<ExitWith>() {
                return w.code;
            }
            if let Some(b) = cause.downcast_ref::<btrsend::backup::BackupError>() {
                return exit_of(b);
            }
        }
        Exit::Failure
    }

    /// Whether the error behind this code still has to be printed.
    pub fn prints(err: &anyhow::Error) -> bool {
        !err.chain()
            .any(|c| c.downcast_ref::<ExitWith>().is_some_and(|w| w.quiet))
    }

    /// The numeric status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failure | Exit::Quiet => 1,
            Exit::Usage => 2,
            Exit::Signal(n) => n,
            Exit::Partial => 3,
            Exit::RepoMissing => 10,
            Exit::LockHeld => 11,
            Exit::Damage => 12,
            Exit::Key => 13,
            Exit::Stale => 14,
            Exit::BrokenPipe => 141,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// The exit code for a backup error.
pub fn exit_of(e: &BackupError) -> Exit {
    if e.is_repo_missing() {
        Exit::RepoMissing
    } else if e.is_lock_held() {
        Exit::LockHeld
    } else if e.is_key() {
        Exit::Key
    } else {
        Exit::Failure
    }
}

/// The keys every JSON line and object gets while a config file's job runs
/// on one of its destinations (`job`, `destination`).
static JSON_CONTEXT: std::sync::Mutex<Option<serde_json::Map<String, serde_json::Value>>> =
    std::sync::Mutex::new(None);

/// Set (or with `None` clear) the keys [`with_json_context`] adds.
pub fn set_json_context(keys: Option<serde_json::Map<String, serde_json::Value>>) {
    *JSON_CONTEXT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = keys;
}

/// `v` with the keys of the job and destination being run, when `v` is an
/// object and a config file's job runs.
pub fn with_json_context(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(o) = v.as_object_mut()
        && let Some(ctx) = JSON_CONTEXT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
    {
        for (k, val) in ctx {
            o.entry(k.clone()).or_insert_with(|| val.clone());
        }
    }
    v
}

/// The exit status of several jobs or destinations that ended with
/// `codes`: 0 when all succeeded; an interruption's status; the one status
/// they all failed with, when none succeeded or when it is a finding
/// (3 some stored and some failed, 12 damage, 14 stale) rather than a
/// failure to act; else 3 when some succeeded and 1 when none did.
pub fn combine(codes: &[Exit]) -> Exit {
    let norm = |e: Exit| if e == Exit::Quiet { Exit::Failure } else { e };
    let failed: Vec<Exit> = codes
        .iter()
        .map(|&e| norm(e))
        .filter(|&e| e != Exit::Success)
        .collect();
    let Some(&first) = failed.first() else {
        return Exit::Success;
    };
    if let Some(&s) = failed.iter().find(|e| matches!(e, Exit::Signal(_))) {
        return s;
    }
    // A job that stored some (3) is something done, as a success is.
    let some_ok = failed.len() < codes.len() || failed.contains(&Exit::Partial);
    let same = failed.iter().all(|&e| e == first);
    let finding = matches!(first, Exit::Partial | Exit::Damage | Exit::Stale);
    if same && (!some_ok || finding) {
        first
    } else if some_ok {
        Exit::Partial
    } else {
        Exit::Failure
    }
}

/// With `--json`: print the error as JSON on stderr and exit quietly.
pub fn json_error(json: bool, e: anyhow::Error) -> anyhow::Error {
    if !json {
        return e;
    }
    let code = Exit::from_error(&e);
    let line = with_json_context(
        json!({"message_type": "error", "message": crate::text::error_text(&e), "exit_code": code.code()}),
    );
    eprintln!("{line}");
    anyhow::Error::new(ExitWith {
        code,
        quiet: true,
        // Kept for a config file's summary, which names each failure.
        msg: crate::text::error_text(&e),
    })
}

/// The exit for a `backup run` or `import` that stored `ok` and failed
/// `failed` snapshots (or files): 0, 1 when none was stored, else 3.
pub fn stored_or_failed(ok: usize, failed: usize, what: &str) -> anyhow::Result<()> {
    match (ok, failed) {
        (_, 0) => Ok(()),
        (0, n) => Err(anyhow::Error::new(ExitWith::quiet(Exit::Failure))
            .context(format!("{n} {what} failed"))),
        (_, n) => Err(anyhow::Error::new(ExitWith::quiet(Exit::Partial))
            .context(format!("{n} {what} failed, {ok} stored"))),
    }
}

/// With `--json`: the error line for one snapshot (or file) that could not
/// be stored, on standard error; the run goes on.
pub fn json_snapshot_error(path: &str, err: &(dyn std::error::Error + 'static)) {
    let v = with_json_context(
        json!({"message_type": "error", "snapshot": path, "message": crate::text::error_text_of(err)}),
    );
    eprintln!("{v}");
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

impl fmt::Display for ExitWith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ExitWith {}

/// Set when a write to standard output through [`Watch`] met a broken pipe.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether standard output's reader went away (a write through [`stdout`]
/// or another [`Watch`] failed with a broken pipe): `main` then exits with
/// [`Exit::BrokenPipe`] whatever the subcommand returned, so that output
/// errors buried in a library error's message, or ignored by a report
/// line that must not stop the work (`receive`, `backup run --json`), end
/// the same way.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// Standard output, locked, remembering a broken pipe (see
/// [`stdout_closed`]). Every subcommand writes its output through this.
pub fn stdout() -> Watch<io::StdoutLock<'static>> {
    Watch(io::stdout().lock())
}

/// A writer to standard output that remembers a broken pipe.
#[derive(Debug)]
pub struct Watch<W>(pub W);

impl<W> Watch<W> {
    fn note<T>(r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r
            && e.kind() == io::ErrorKind::BrokenPipe
        {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl<W: Write> Write for Watch<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Self::note(self.0.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Self::note(self.0.flush())
    }
}

/// A command line that parsed but asks for something impossible, e.g.
/// options that conflict: exit status 2, like clap's own errors.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Return a [`UsageError`] from the current function (like `anyhow::bail!`).
#[macro_export]
macro_rules! usage_bail {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::exit::UsageError(format!($($arg)*))))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_2_even_with_context() {
        let e = anyhow::Error::new(UsageError("x".into())).context("while parsing");
        assert_eq!(Exit::from_error(&e), Exit::Usage);
        assert_eq!(Exit::Usage.code(), 2);
        assert_eq!(Exit::from_error(&anyhow::anyhow!("io")), Exit::Failure);
        assert_eq!(Exit::Signal(Exit::INTERRUPTED).code(), 130);
        let pipe = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("cannot write");
        assert_eq!(Exit::from_error(&pipe), Exit::BrokenPipe);
        assert_eq!(Exit::BrokenPipe.code(), 141);
    }

    #[test]
    fn combined_statuses() {
        use Exit::*;
        assert_eq!(combine(&[]), Success);
        assert_eq!(combine(&[Success, Success]), Success);
        assert_eq!(combine(&[RepoMissing]), RepoMissing);
        assert_eq!(combine(&[RepoMissing, RepoMissing]), RepoMissing);
        assert_eq!(combine(&[Success, RepoMissing]), Partial);
        assert_eq!(combine(&[Success, Stale]), Stale);
        assert_eq!(combine(&[Success, Damage, Damage]), Damage);
        assert_eq!(combine(&[Damage, Stale]), Failure);
        assert_eq!(combine(&[Success, Damage, Key]), Partial);
        assert_eq!(combine(&[Quiet, Failure]), Failure);
        assert_eq!(combine(&[Success, Partial]), Partial);
        assert_eq!(combine(&[Partial, Failure]), Partial);
        assert_eq!(combine(&[Partial, Partial]), Partial);
        assert_eq!(combine(&[Success, Signal(130), Key]), Signal(130));
    }
}
