//! Rendering the core's [`btrsend::progress::Progress`] reports on standard
//! error, for `send` and `receive` alike:
//!
//! * stderr a terminal (and not `--no-progress`/`-q`): an indicatif bar —
//!   bytes of the total, rate and ETA when the total is known (send: the
//!   stream's exact size, from `--estimate`'s pass, which runs beside the
//!   send and sets the total when it is done, see [`Reporter::set_total`];
//!   receive: a stream file's size), else bytes, rate and elapsed time
//!   (receive from a pipe: no made-up total);
//! * `--progress` with stderr not a terminal (a log file, a pipe): a plain
//!   line every [`line_interval`] and a summary at the end;
//! * otherwise (cron, `--no-progress`, `-q`): nothing.
//!
//! Notes and non-fatal errors the core reports are printed above the bar
//! (or as plain lines) in every mode but `-q`'s, which keeps only errors.
//!
//! The backup commands render the same trait's backup reports in
//! [`backup`] (JSON lines, one bar over the whole operation).

pub mod backup;

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use btrsend::progress::Progress;
use indicatif::{HumanBytes, HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the plain-text reporter prints a line: 5 s
/// (`BTRSEND_PROGRESS_INTERVAL_MS` overrides it, for tests).
pub fn line_interval() -> Duration {
    std::env::var("BTRSEND_PROGRESS_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis)
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing on stderr.
    Off,
    /// An indicatif bar (stderr is a terminal).
    Bar,
    /// A plain line every few seconds and a final summary.
    Lines,
}

impl Mode {
    /// The mode for `--progress` / `--no-progress` / `-q` (none of them: a
    /// bar when stderr is a terminal, else nothing; `-q` means nothing
    /// unless `--progress` is given too).
    pub fn choose(progress: bool, no_progress: bool, quiet: bool) -> Mode {
        Mode::pick(
            progress,
            no_progress,
            quiet,
            std::io::stderr().is_terminal(),
        )
    }

    fn pick(progress: bool, no_progress: bool, quiet: bool, tty: bool) -> Mode {
        match (progress, no_progress || (quiet && !progress), tty) {
            (_, true, _) => Mode::Off,
            (_, false, true) => Mode::Bar,
            (true, false, false) => Mode::Lines,
            (false, false, false) => Mode::Off,
        }
    }
}

/// Which operation is reported: its wording and how its bytes arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `send`: [`Reporter::wrote`] adds stream bytes ([`Progress::data`]
    /// counts file data, for the summary).
    Send,
    /// `receive`: [`Progress::position`] gives the input offset.
    Receive,
}

/// The indicatif template: with a total, bytes of it, a bar and the ETA;
/// without, bytes, rate and elapsed time only.
fn template(has_total: bool) -> &'static str {
    if has_total {
        "{spinner} {msg} {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}"
    } else {
        "{spinner} {msg} {bytes} {bytes_per_sec} {elapsed}"
    }
}

/// The bar's style, with a total or without.
fn style(has_total: bool) -> ProgressStyle {
    ProgressStyle::with_template(template(has_total))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// [`Reporter::total`] before the total is known.
const UNKNOWN: u64 = u64::MAX;

/// A [`Progress`] sink on standard error.
#[derive(Debug)]
pub struct Reporter {
    mode: Mode,
    op: Op,
    quiet: bool,
    bar: ProgressBar,
    /// The total bytes expected; [`UNKNOWN`] until known.
    total: AtomicU64,
    /// Bytes done: of the stream (send) or of the input (receive).
    bytes: AtomicU64,
    /// send: file data bytes, for the summary.
    data: AtomicU64,
    start: Instant,
    interval: Duration,
    last_line: Mutex<Instant>,
}

impl Reporter {
    /// A reporter in `mode` for `op`, `total` bytes expected when known;
    /// `quiet` drops notes.
    pub fn new(mode: Mode, op: Op, total: Option<u64>, quiet: bool) -> Reporter {
        let bar = if mode == Mode::Bar {
            let b = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
            b.set_style(style(total.is_some()));
            b.enable_steady_tick(Duration::from_millis(200));
            b
        } else {
            ProgressBar::hidden()
        };
        let now = Instant::now();
        Reporter {
            mode,
            op,
            quiet,
            bar,
            total: AtomicU64::new(total.unwrap_or(UNKNOWN)),
            bytes: AtomicU64::new(0),
            data: AtomicU64::new(0),
            start: now,
            interval: line_interval(),
            last_line: Mutex::new(now),
        }
    }

    /// The total, once known (send: the estimate's pass ended). The bar
    /// gains its total and ETA; never below the bytes already done.
    pub fn set_total(&self, total: u64) {
        let total = total.min(UNKNOWN - 1);
        self.total.store(total, Ordering::Relaxed);
        if self.mode == Mode::Bar {
            self.bar.set_style(style(true));
            self.bar
                .set_length(total.max(self.bytes.load(Ordering::Relaxed)));
        }
    }

    fn total(&self) -> Option<u64> {
        Some(self.total.load(Ordering::Relaxed)).filter(|&t| t != UNKNOWN)
    }

    /// send: `n` more bytes of the stream were written.
    pub fn wrote(&self, n: u64) {
        let done = self.bytes.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        self.moved(done);
    }

    /// A line of raw bytes on stderr (paths as a stream has them), above
    /// the bar if one is drawn.
    pub fn println_bytes(&self, msg: &[u8]) {
        let msg = crate::text::printable_bytes(msg);
        let line = |mut e: std::io::StderrLock<'_>| {
            let _ = e.write_all(&msg).and_then(|()| e.write_all(b"\n"));
        };
        if self.mode == Mode::Bar {
            self.bar.suspend(|| line(std::io::stderr().lock()));
        } else {
            line(std::io::stderr().lock());
        }
    }

    /// A message on stderr, above the bar if one is drawn.
    pub fn println(&self, msg: &str) {
        let msg = crate::text::printable_lines(msg);
        if self.mode == Mode::Bar {
            self.bar.suspend(|| eprintln!("{msg}"));
        } else {
            let _ = writeln!(std::io::stderr().lock(), "{msg}");
        }
    }

    fn rate(&self) -> f64 {
        let secs = self.start.elapsed().as_secs_f64();
        if secs > 0.0 {
            self.bytes.load(Ordering::Relaxed) as f64 / secs
        } else {
            0.0
        }
    }

    fn verb(&self) -> &'static str {
        match self.op {
            Op::Send => "sent",
            Op::Receive => "received",
        }
    }

    /// The text of a progress line.
    fn line_text(&self) -> String {
        let done = self.bytes.load(Ordering::Relaxed);
        let rate = self.rate();
        let mut msg = format!("btrsend: {} {}", self.verb(), HumanBytes(done));
        if let Some(total) = self.total().filter(|t| *t > 0) {
            let pct = (done.min(total) as f64) * 100.0 / total as f64;
            msg.push_str(&format!(" of {} ({pct:.0}%)", HumanBytes(total)));
        }
        msg.push_str(&format!(
            ", {}/s, {} elapsed",
            HumanBytes(rate as u64),
            HumanDuration(self.start.elapsed())
        ));
        if let Some(total) = self.total()
            && total > done
            && rate > 0.0
        {
            let eta = Duration::from_secs_f64((total - done) as f64 / rate);
            msg.push_str(&format!(", eta {}", HumanDuration(eta)));
        }
        msg
    }

    /// Bytes done moved to `n`: update the bar, or print a line when due.
    fn moved(&self, n: u64) {
        match self.mode {
            Mode::Off => {}
            Mode::Bar => {
                if self.total().is_none_or(|t| n > t) {
                    // No total yet, or (receive from a file that grows) a
                    // total passed: the bar's length follows.
                    self.bar.set_length(n);
                }
                self.bar.set_position(n);
            }
            Mode::Lines => {
                let mut last = self
                    .last_line
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if last.elapsed() >= self.interval {
                    *last = Instant::now();
                    self.println(&self.line_text());
                }
            }
        }
    }

    /// The operation ended: clear the bar; in line mode print the summary
    /// (`stream_bytes`: a send's stream size; `ok`: it succeeded).
    pub fn finish(&self, ok: bool, stream_bytes: Option<u64>) {
        self.bar.finish_and_clear();
        if self.mode != Mode::Lines || !ok {
            return;
        }
        let done = HumanBytes(self.bytes.load(Ordering::Relaxed));
        let secs = self.start.elapsed().as_secs_f64();
        let rate = HumanBytes(self.rate() as u64);
        let msg = match (self.op, stream_bytes) {
            (Op::Send, Some(n)) => format!(
                "btrsend: done: {} of file data in a {} stream, {secs:.1}s, {rate}/s",
                HumanBytes(self.data.load(Ordering::Relaxed)),
                HumanBytes(n)
            ),
            _ => format!(
                "btrsend: done: {} {done}, {secs:.1}s, {rate}/s",
                self.verb()
            ),
        };
        self.println(&msg);
    }
}

impl Progress for Reporter {
    fn subvol_start(&self, name: &[u8], incremental: bool) {
        if self.mode == Mode::Bar {
            let kind = if incremental { "snapshot" } else { "subvol" };
            self.bar
                .set_message(format!("{kind} {}", name.escape_ascii()));
        }
    }

    fn inode(&self, ino: u64) {
        if self.mode == Mode::Bar && ino.is_multiple_of(256) && self.op == Op::Send {
            self.bar.set_message(format!("inode {ino}"));
        }
    }

    fn data(&self, bytes: u64) {
        self.data.fetch_add(bytes, Ordering::Relaxed);
    }

    fn position(&self, offset: u64, _commands: u64) {
        if self.op == Op::Receive {
            self.bytes.fetch_max(offset, Ordering::Relaxed);
            self.moved(offset);
        }
    }

    fn note(&self, msg: &str) {
        if !self.quiet {
            self.println(&format!("btrsend: note: {msg}"));
        }
    }

    fn error(&self, err: &dyn std::error::Error) {
        self.println(&format!("btrsend: error: {err}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_follows_flags_and_terminal() {
        assert_eq!(Mode::pick(false, false, false, true), Mode::Bar);
        assert_eq!(Mode::pick(false, false, false, false), Mode::Off, "cron");
        assert_eq!(Mode::pick(true, false, false, false), Mode::Lines);
        assert_eq!(Mode::pick(false, true, false, true), Mode::Off);
        assert_eq!(Mode::pick(false, false, true, true), Mode::Off, "-q");
        assert_eq!(
            Mode::pick(true, false, true, false),
            Mode::Lines,
            "-q --progress"
        );
    }

    #[test]
    fn no_total_no_made_up_total() {
        assert!(!template(false).contains("total"));
        assert!(!template(false).contains("eta"));
        assert!(template(true).contains("{total_bytes}"));
        let r = Reporter::new(Mode::Off, Op::Receive, None, false);
        r.position(1000, 3);
        let line = r.line_text();
        assert!(line.starts_with("btrsend: received 1000 B, "), "{line}");
        assert!(!line.contains(" of ") && !line.contains("eta"), "{line}");
        let s = Reporter::new(Mode::Off, Op::Send, Some(4000), false);
        s.wrote(1000);
        s.wrote(1000);
        s.data(700);
        let line = s.line_text();
        assert!(
            line.starts_with("btrsend: sent 1.95 KiB of 3.91 KiB (50%), "),
            "{line}"
        );
    }

    #[test]
    fn send_total_arrives_later() {
        let s = Reporter::new(Mode::Off, Op::Send, None, false);
        s.wrote(3000);
        let line = s.line_text();
        assert!(line.starts_with("btrsend: sent 2.93 KiB, "), "{line}");
        assert!(!line.contains(" of ") && !line.contains("eta"), "{line}");
        s.set_total(12000);
        s.wrote(3000);
        let line = s.line_text();
        assert!(
            line.starts_with("btrsend: sent 5.86 KiB of 11.72 KiB (50%), "),
            "{line}"
        );
        // The bar's length: the total, never below what is done.
        let b = Reporter::new(Mode::Bar, Op::Send, None, false);
        b.wrote(5000);
        assert_eq!(b.bar.length(), Some(5000));
        b.set_total(4000);
        assert_eq!(b.bar.length(), Some(5000));
        b.set_total(9000);
        assert_eq!(b.bar.length(), Some(9000));
        b.wrote(1000);
        assert_eq!((b.bar.position(), b.bar.length()), (6000, Some(9000)));
        b.finish(true, None);
    }
}
