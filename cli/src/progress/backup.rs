//! Rendering a backup's [`Progress`] reports: JSON Lines on standard output
//! (`backup run --json`), a bar over the whole operation on a terminal, or
//! nothing (cron); warnings reach standard error in every mode.
//!
//! It renders and counts, nothing more: exit statuses are
//! [`crate::exit`]'s, and per-snapshot error lines are made there too.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use btrsend::backup::plan::FullReason;
use btrsend::backup::{Entry, Kind};
use btrsend::progress::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::text::{error_text_of, printable};

/// Progress of `run`, `import`, `verify` and `restore`: JSON Lines, a bar
/// on a terminal, or nothing.
///
/// The bar covers the whole run: its total is the size of every stream the
/// run stores (exact estimates made first), its message names the snapshot
/// being stored and how many of them there are, so its ETA is the run's.
pub struct BackupReporter {
    json: bool,
    bar: Option<ProgressBar>,
    out: Mutex<crate::exit::Watch<std::io::Stdout>>,
    /// Snapshots the run stores, and the number of the current one.
    count: std::sync::atomic::AtomicUsize,
    current: std::sync::atomic::AtomicUsize,
    /// The stream bytes kept from an interrupted run for the snapshot
    /// being stored (for its `stored` message).
    resumed: Mutex<Option<u64>>,
    /// Why the snapshot being stored is full (for its `stored` message).
    full: Mutex<Option<FullReason>>,
    /// A test hook (`BTRSEND_TEST_PAUSE_AT`): stop the run's sender for
    /// good once this many stream bytes are stored, so that a test can kill
    /// it at a known point.
    pause_at: Option<u64>,
    streamed: std::sync::atomic::AtomicU64,
    /// Stream bytes kept from interrupted runs, over the whole run.
    kept: std::sync::atomic::AtomicU64,
}

impl BackupReporter {
    /// Progress for `--json` (lines on stdout), a bar on a terminal, or
    /// nothing. Until the total is known (the run's estimates) the bar is a
    /// spinner saying `waiting` (no empty `0 B/0 B` bar).
    pub fn new(json: bool, waiting: &str) -> BackupReporter {
        let mut p = BackupReporter::bar(!json, waiting);
        p.json = json;
        p
    }

    /// A bar on a terminal when `show`, and nothing else.
    pub fn bar(show: bool, waiting: &str) -> BackupReporter {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.set_message(waiting.to_owned());
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        BackupReporter {
            json: false,
            bar,
            out: Mutex::new(crate::exit::Watch(std::io::stdout())),
            count: std::sync::atomic::AtomicUsize::new(0),
            current: std::sync::atomic::AtomicUsize::new(0),
            resumed: Mutex::new(None),
            full: Mutex::new(None),
            pause_at: std::env::var("BTRSEND_TEST_PAUSE_AT")
                .ok()
                .and_then(|v| v.parse().ok()),
            streamed: std::sync::atomic::AtomicU64::new(0),
            kept: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Stream bytes kept from interrupted runs (not sent again).
    pub fn kept(&self) -> u64 {
        self.kept.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One JSON line on standard output.
    pub fn line(&self, v: serde_json::Value) {
        let v = crate::exit::with_json_context(v);
        if let Ok(mut out) = self.out.lock() {
            let _ = writeln!(out, "{v}");
            let _ = out.flush();
        }
    }

    /// Whether a bar is drawn (standard error is a terminal).
    pub fn has_bar(&self) -> bool {
        self.bar.is_some()
    }

    /// Clear the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl Progress for BackupReporter {
    fn notice(&self, msg: &str) {
        if self.json {
            self.line(json!({"message_type": "status", "notice": msg}));
        } else if let Some(b) = &self.bar {
            b.println(format!("btrsend: notice: {}", printable(msg)));
        }
    }

    fn warning(&self, msg: &str) {
        if self.json {
            self.line(json!({"message_type": "status", "warning": msg}));
        } else {
            // Cron mails what reaches stderr: this is printed without a
            // terminal too.
            let line = format!("btrsend: warning: {}", printable(msg));
            match &self.bar {
                Some(b) => b.println(line),
                None => eprintln!("{line}"),
            }
        }
    }

    fn full(&self, _path: &str, why: FullReason) {
        if let Ok(mut f) = self.full.lock() {
            *f = Some(why);
        }
    }

    fn plan(&self, snapshots: usize, stream_bytes: u64) {
        use std::sync::atomic::Ordering;
        self.count.store(snapshots, Ordering::Relaxed);
        if let Some(b) = self.bar.as_ref().filter(|_| snapshots > 0) {
            b.disable_steady_tick();
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} {msg} {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.set_length(stream_bytes);
            b.set_position(0);
            b.reset_eta();
        }
    }

    fn start(&self, path: &str, kind: Kind, stream_total: u64) {
        use std::sync::atomic::Ordering;
        if self.json {
            let mut v = json!({"message_type": "status", "snapshot": path, "kind": kind.as_str()});
            if stream_total > 0 {
                v["stream_bytes"] = stream_total.into();
            }
            self.line(v);
        }
        let n = self.current.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(b) = &self.bar {
            let count = self.count.load(Ordering::Relaxed).max(n);
            b.set_message(format!(
                "[{n}/{count}] {} ({})",
                printable(path),
                kind.as_str()
            ));
        }
    }

    fn stream(&self, bytes: u64) {
        if let Some(at) = self.pause_at {
            use std::sync::atomic::Ordering;
            let now = self.streamed.fetch_add(bytes, Ordering::Relaxed) + bytes;
            if now >= at {
                eprintln!("btrsend: test: paused after {now} stream bytes");
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
        if let Some(b) = &self.bar {
            b.inc(bytes);
            // An estimate is exact, but never let the bar run past its end
            // (a snapshot stored full against the plan).
            if b.length().is_some_and(|l| b.position() > l) {
                b.set_length(b.position());
            }
        }
    }

    fn resumed(&self, path: &str, stream_bytes: u64, stored_bytes: u64) {
        if let Ok(mut r) = self.resumed.lock() {
            *r = Some(stream_bytes);
        }
        if self.json {
            self.line(json!({
                "message_type": "status",
                "snapshot": path,
                "resumed_from_bytes": stream_bytes,
                "resumed_stored_bytes": stored_bytes,
            }));
        } else if let Some(b) = &self.bar {
            b.println(format!(
                "btrsend: continuing {} where an interrupted run stopped: {stream_bytes} bytes of its stream kept",
                printable(path)
            ));
        }
    }

    fn stored(&self, e: &Entry) {
        let resumed = self.resumed.lock().ok().and_then(|mut r| r.take());
        self.kept
            .fetch_add(resumed.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
        let full = self.full.lock().ok().and_then(|mut f| f.take());
        if self.json {
            let mut v = serde_json::to_value(e).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("message_type".into(), "stored".into());
                // What this run sent of the stream, and what an interrupted
                // run had stored already.
                let kept = resumed.unwrap_or(0);
                o.insert("resumed_from_bytes".into(), kept.into());
                o.insert(
                    "sent_bytes".into(),
                    e.stream_bytes.saturating_sub(kept).into(),
                );
                if let Some(why) = full.filter(|_| e.kind == Kind::Full) {
                    o.insert("full_reason".into(), why.as_str().into());
                }
            }
            self.line(v);
        }
    }

    fn unchanged(&self, subvol: &std::path::Path, snapshot: &std::path::Path) {
        if self.json {
            self.line(json!({
                "message_type": "status",
                "subvolume": subvol.display().to_string(),
                "unchanged": true,
                "newest_snapshot": snapshot.display().to_string(),
            }));
        } else if let Some(b) = &self.bar {
            b.println(format!(
                "btrsend: {} has not changed since {}: no snapshot taken",
                printable(&subvol.display().to_string()),
                printable(&snapshot.display().to_string())
            ));
        }
    }

    fn skipped(&self, path: &str, e: &Entry) {
        if self.json {
            self.line(json!({"message_type": "status", "snapshot": path, "already_stored": e.id}));
        }
    }

    fn failed(&self, path: &str, err: &(dyn std::error::Error + 'static)) {
        if let Ok(mut r) = self.resumed.lock() {
            *r = None;
        }
        if let Ok(mut f) = self.full.lock() {
            *f = None;
        }
        if self.json {
            crate::exit::json_snapshot_error(path, err);
        } else {
            if let Some(b) = &self.bar {
                b.suspend(|| ());
            }
            // Most errors name the snapshot already.
            let text = error_text_of(err);
            if text.contains(path) {
                eprintln!("btrsend: error: {}", printable(&text));
            } else {
                eprintln!("btrsend: error: {}: {}", printable(path), printable(&text));
            }
        }
    }

    fn wants_total(&self) -> bool {
        self.bar.is_some()
    }
}
