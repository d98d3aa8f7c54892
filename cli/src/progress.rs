//! Progress of `btrsend send` on standard error, behind the core
//! [`btrsend::send::Progress`] trait (style §7):
//!
//! * stderr a terminal (or `--progress` on a terminal): an indicatif bar
//!   with bytes sent of the total, rate and ETA;
//! * `--progress` with stderr not a terminal (a log file, a pipe): a plain
//!   line every [`LINE_INTERVAL`] and a summary at the end;
//! * otherwise (cron, `--no-progress`): nothing at all.

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use btrsend::send::Progress;
use indicatif::{HumanBytes, HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the plain-text reporter prints a line.
pub const LINE_INTERVAL: Duration = Duration::from_secs(5);

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
    /// The mode for `--progress` / `--no-progress` (neither: a bar when
    /// stderr is a terminal, else nothing).
    pub fn choose(progress: bool, no_progress: bool) -> Mode {
        let tty = std::io::stderr().is_terminal();
        match (progress, no_progress, tty) {
            (_, true, _) => Mode::Off,
            (_, false, true) => Mode::Bar,
            (true, false, false) => Mode::Lines,
            (false, false, false) => Mode::Off,
        }
    }
}

/// A [`Progress`] on standard error.
#[derive(Debug)]
pub struct SendProgress {
    mode: Mode,
    bar: ProgressBar,
    total: u64,
    bytes: Cell<u64>,
    start: Instant,
    last_line: Cell<Instant>,
}

impl SendProgress {
    /// A reporter in `mode` for `total` bytes of file data (0: unknown).
    pub fn new(mode: Mode, total: u64) -> SendProgress {
        let bar = if mode == Mode::Bar {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner} {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b
        } else {
            ProgressBar::hidden()
        };
        let now = Instant::now();
        SendProgress {
            mode,
            bar,
            total,
            bytes: Cell::new(0),
            start: now,
            last_line: Cell::new(now),
        }
    }

    fn rate(&self) -> f64 {
        let secs = self.start.elapsed().as_secs_f64();
        if secs > 0.0 {
            self.bytes.get() as f64 / secs
        } else {
            0.0
        }
    }

    fn line(&self) {
        let done = self.bytes.get();
        let rate = self.rate();
        let mut msg = format!("btrsend: sent {}", HumanBytes(done));
        if self.total > 0 {
            let pct = (done.min(self.total) as f64) * 100.0 / self.total as f64;
            msg.push_str(&format!(" of {} ({pct:.0}%)", HumanBytes(self.total)));
        }
        msg.push_str(&format!(", {}/s", HumanBytes(rate as u64)));
        if self.total > done && rate > 0.0 {
            let eta = Duration::from_secs_f64((self.total - done) as f64 / rate);
            msg.push_str(&format!(", eta {}", HumanDuration(eta)));
        }
        let _ = writeln!(std::io::stderr().lock(), "{msg}");
    }

    /// The send ended: clear the bar; in line mode print the summary
    /// (`stream_bytes`: the stream's size, when it succeeded).
    pub fn finish(&self, stream_bytes: Option<u64>) {
        self.bar.finish_and_clear();
        if self.mode == Mode::Lines
            && let Some(n) = stream_bytes
        {
            let _ = writeln!(
                std::io::stderr().lock(),
                "btrsend: done: {} of file data in a {} stream, {:.1}s, {}/s",
                HumanBytes(self.bytes.get()),
                HumanBytes(n),
                self.start.elapsed().as_secs_f64(),
                HumanBytes(self.rate() as u64),
            );
        }
    }
}

impl Progress for SendProgress {
    fn inode(&self, ino: u64) {
        if self.mode == Mode::Bar && ino.is_multiple_of(256) {
            self.bar.set_message(format!("inode {ino}"));
        }
    }

    fn data(&self, bytes: u64) {
        let n = self.bytes.get().saturating_add(bytes);
        self.bytes.set(n);
        match self.mode {
            Mode::Off => {}
            Mode::Bar => {
                if n > self.total {
                    // The pre-pass total is an estimate; never pass it.
                    self.bar.set_length(n);
                }
                self.bar.set_position(n);
            }
            Mode::Lines => {
                if self.last_line.get().elapsed() >= LINE_INTERVAL {
                    self.last_line.set(Instant::now());
                    self.line();
                }
            }
        }
    }
}
