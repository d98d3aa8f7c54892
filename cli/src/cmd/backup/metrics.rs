//! `--metrics-file FILE` of `backup run`, `forget`, `verify` and `status`:
//! what the command did, in the Prometheus text exposition format (version
//! 0.0.4), for node_exporter's textfile collector.
//!
//! Every sample has the labels `job` (the config file's job, empty for a
//! command on one `--repo`), `destination` (the repository as the user
//! named it) and `command`; the per-origin ones `origin` too. With
//! `--config` one file holds every job's and destination's samples, each
//! family once (the collector refuses a family split in two). The command label keeps the files of two
//! commands from exposing one series twice, which the collector refuses.
//! Label values come from a catalog someone else may have written: they
//! are escaped as the format says (backslash, double quote, line feed), so
//! no value can end a line or a label early. The file is replaced
//! atomically (a temporary file in the same directory, flushed, renamed),
//! so the collector never reads half of it.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use btrsend::backup::Repository;
use jiff::Timestamp;

use crate::exit::Exit;

/// The metrics one command writes.
#[derive(Debug)]
pub struct Metrics {
    command: &'static str,
    job: String,
    destination: String,
    start: Timestamp,
    clock: std::time::Instant,
    /// How long the command took, once it ended ([`Metrics::end`]).
    took: Option<std::time::Duration>,
    families: Vec<Family>,
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Vec<(Option<String>, String)>,
}

/// `s` as a label value between double quotes: `\`, `"` and a line feed
/// escaped, as the text format defines; other characters pass as they are
/// (the format allows any UTF-8).
pub fn escape_label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Seconds since the epoch, with the fraction the format allows.
fn seconds(t: Timestamp) -> String {
    format!("{:.3}", t.as_millisecond() as f64 / 1000.0)
}

impl Metrics {
    /// Metrics of `command` on the repository `destination`, starting now.
    pub fn new(command: &'static str, destination: &str) -> Metrics {
        Metrics::of_job(command, "", destination)
    }

    /// Metrics of `command` on the destination `destination` of the
    /// config file's job `job`, starting now.
    pub fn of_job(command: &'static str, job: &str, destination: &str) -> Metrics {
        Metrics {
            command,
            job: job.to_owned(),
            destination: destination.to_owned(),
            start: Timestamp::now(),
            clock: std::time::Instant::now(),
            took: None,
            families: Vec::new(),
        }
    }

    /// The command ended: its duration is what has passed until now (with
    /// `--config` the file is written after every job).
    pub fn end(&mut self) {
        self.took = Some(self.clock.elapsed());
    }

    fn put(&mut self, name: &'static str, help: &'static str, origin: Option<&str>, v: String) {
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name,
                    help,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        if let Some(f) = self.families.get_mut(i) {
            f.samples.push((origin.map(str::to_owned), v));
        }
    }

    /// A gauge with an integer value.
    pub fn int(&mut self, name: &'static str, help: &'static str, origin: Option<&str>, v: u64) {
        self.put(name, help, origin, v.to_string());
    }

    /// A gauge with a signed integer value.
    pub fn signed(&mut self, name: &'static str, help: &'static str, origin: Option<&str>, v: i64) {
        self.put(name, help, origin, v.to_string());
    }

    /// What the catalog says after the command: the repository's size,
    /// and per origin the snapshots kept, their size and the newest one's
    /// time. Nothing when the catalog cannot be read (the command's own
    /// result says why).
    pub fn catalog(&mut self, repo: &Repository) {
        let Ok(rep) = repo.status(Timestamp::now(), None) else {
            return;
        };
        self.catalog_of(&rep);
    }

    /// [`Metrics::catalog`] of a status already made.
    pub fn catalog_of(&mut self, rep: &btrsend::backup::StatusReport) {
        self.int(
            "btrsend_repository_size_bytes",
            "Bytes the repository's stream files take, as its catalog counts them.",
            None,
            rep.stored_bytes,
        );
        for o in &rep.origins {
            let origin = Some(o.origin.as_str());
            self.int(
                "btrsend_snapshots_kept",
                "Snapshots of the origin stored in the repository.",
                origin,
                o.entries as u64,
            );
            self.int(
                "btrsend_snapshots_kept_bytes",
                "Bytes the stream files of the origin's stored snapshots take.",
                origin,
                o.stored_bytes,
            );
            if let Some(t) = o.newest.timestamp() {
                self.signed(
                    "btrsend_newest_snapshot_timestamp_seconds",
                    "Creation time of the origin's newest stored snapshot.",
                    origin,
                    t.as_second(),
                );
            }
        }
    }

    fn labels(&self, origin: Option<&str>) -> String {
        let mut s = format!(
            "job=\"{}\",destination=\"{}\",command=\"{}\"",
            escape_label(&self.job),
            escape_label(&self.destination),
            self.command
        );
        if let Some(o) = origin {
            let _ = write!(s, ",origin=\"{}\"", escape_label(o));
        }
        s
    }

    /// The file's text for a command that ended with `exit`; on failure
    /// the last success time is `previous` (from the file it replaces).
    #[cfg(test)]
    fn render(&self, exit: Exit, previous: Option<String>) -> String {
        render_all(&[(self, exit, previous)])
    }

    /// The samples of the gauges every command writes.
    fn base(
        &self,
        exit: Exit,
        previous: Option<String>,
    ) -> [(&'static str, &'static str, Option<String>); 4] {
        let success = if exit == Exit::Success {
            Some(seconds(Timestamp::now()))
        } else {
            previous
        };
        [
            (
                "btrsend_last_attempt_timestamp_seconds",
                "When the command last started.",
                Some(seconds(self.start)),
            ),
            (
                "btrsend_last_attempt_exit_status",
                "The command's last exit status (0: success).",
                Some(exit.code().to_string()),
            ),
            (
                "btrsend_last_success_timestamp_seconds",
                "When the command last ended with exit status 0.",
                success,
            ),
            (
                "btrsend_duration_seconds",
                "How long the command's last run took.",
                Some(format!(
                    "{:.3}",
                    self.took
                        .unwrap_or_else(|| self.clock.elapsed())
                        .as_secs_f64()
                )),
            ),
        ]
    }

    /// The last success time the file at `path` records for these labels,
    /// if it is a file this code wrote.
    fn previous_success(&self, path: &Path) -> Option<String> {
        let text = fs::read_to_string(path).ok()?;
        let head = format!(
            "btrsend_last_success_timestamp_seconds{{{}}} ",
            self.labels(None)
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&head))
            .filter(|v| v.parse::<f64>().is_ok_and(f64::is_finite))
            .map(str::to_owned)
    }

    /// Write the file for a command that ended with `exit`, atomically.
    ///
    /// # Errors
    ///
    /// I/O errors, naming the file.
    pub fn write(&self, path: &Path, exit: Exit) -> anyhow::Result<()> {
        write_all(path, &[(self, exit)])
    }
}

/// The text of several commands' metrics (one per job and destination),
/// each family's samples together.
fn render_all(items: &[(&Metrics, Exit, Option<String>)]) -> String {
    let mut families: Vec<(&str, &str, Vec<String>)> = Vec::new();
    let mut add = |name: &'static str, help: &'static str, line: String| match families
        .iter_mut()
        .find(|f| f.0 == name)
    {
        Some(f) => f.2.push(line),
        None => families.push((name, help, vec![line])),
    };
    for (m, exit, previous) in items {
        let base = m.labels(None);
        for (name, help, v) in m.base(*exit, previous.clone()) {
            if let Some(v) = v {
                add(name, help, format!("{name}{{{base}}} {v}"));
            }
        }
    }
    for (m, _, _) in items {
        for f in &m.families {
            for (origin, v) in &f.samples {
                add(
                    f.name,
                    f.help,
                    format!("{}{{{}}} {v}", f.name, m.labels(origin.as_deref())),
                );
            }
        }
    }
    let mut out = String::new();
    for (name, help, lines) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
    }
    out
}

/// Write the metrics of `items` (each with how its command ended) to
/// `path`, atomically; each keeps the last success time the file held
/// for its labels.
///
/// # Errors
///
/// I/O errors, naming the file.
pub fn write_all(path: &Path, items: &[(&Metrics, Exit)]) -> anyhow::Result<()> {
    let with_previous: Vec<_> = items
        .iter()
        .map(|(m, e)| (*m, *e, m.previous_success(path)))
        .collect();
    let text = render_all(&with_previous);
    write_atomic(path, text.as_bytes())
        .map_err(|e| anyhow::anyhow!("cannot write the metrics file {}: {e}", path.display()))
}

/// Replace `path` with `bytes`: a temporary file beside it (its name does
/// not end in `.prom`, so the collector skips it), flushed to disk, then
/// renamed over `path`, and the directory flushed.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        // A file left by a killed process of the same id: ours to remove.
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    };
    write().inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Run `f` and, with `file`, write the metrics it recorded whatever its
/// outcome. A command that succeeded but whose metrics cannot be written
/// fails (monitoring would otherwise go stale silently); a failed command
/// keeps its own error and warns about the file.
pub fn with_metrics(
    file: Option<&Path>,
    command: &'static str,
    destination: Option<String>,
    f: impl FnOnce(&mut Metrics) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut m = Metrics::new(command, destination.as_deref().unwrap_or(""));
    let r = f(&mut m);
    let Some(path) = file else { return r };
    let exit = match &r {
        Ok(()) => Exit::Success,
        Err(e) => Exit::from_error(e),
    };
    match (m.write(path, exit), r) {
        (Ok(()), r) => r,
        (Err(w), Ok(())) => Err(w),
        (Err(w), Err(e)) => {
            eprintln!(
                "btrsend: warning: {}",
                crate::text::printable(&w.to_string())
            );
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\\b\"c\nd\te"), "a\\\\b\\\"c\\nd\te");
    }

    #[test]
    fn render_groups_families() {
        let mut m = Metrics::new("status", "/r\"x");
        m.int("btrsend_snapshots_kept", "h", Some("a"), 1);
        m.int("btrsend_repository_size_bytes", "h", None, 5);
        m.int("btrsend_snapshots_kept", "h", Some("b\n"), 2);
        let t = m.render(Exit::Stale, Some(String::from("12.5")));
        assert!(t.contains(
            "btrsend_last_success_timestamp_seconds{job=\"\",destination=\"/r\\\"x\",command=\"status\"} 12.5\n"
        ));
        assert!(t.contains("btrsend_last_attempt_exit_status{job=\"\",destination=\"/r\\\"x\",command=\"status\"} 14\n"));
        assert_eq!(t.matches("# TYPE btrsend_snapshots_kept gauge").count(), 1);
        assert!(t.contains("origin=\"a\"} 1\nbtrsend_snapshots_kept{"));
        assert!(t.contains("origin=\"b\\n\"} 2\n"));
    }
}
