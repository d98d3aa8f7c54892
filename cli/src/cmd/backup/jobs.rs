//! A command run over a config file's jobs (`--config`): each selected job
//! in the file's order, its `before` hook, its destinations one after
//! another, then its `after` and (when it failed) `on_error` hooks; one
//! metrics file for them all, and one exit status ([`combine`]).
//!
//! A destination's failure does not stop the next one, nor a job's the
//! next job: a nightly run stores what it can and says what it could not.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use super::config::{Config, Destination, Job};
use super::metrics::{Metrics, write_all};
use crate::exit::{Exit, ExitWith, combine, set_json_context};
use crate::text::{error_text, printable};

/// What one destination of one job ended with.
struct Done {
    repo: String,
    exit: Exit,
    error: Option<String>,
}

/// How a command runs over the jobs.
pub(super) struct Each<'a> {
    /// The command's name (`run`, `forget`…), for hooks and metrics.
    pub command: &'static str,
    /// `--json`: errors and the summary as JSON.
    pub json: bool,
    /// `--metrics-file` (else the file's `[COMMAND] metrics_file`).
    pub metrics_file: Option<&'a Path>,
    /// `--job`.
    pub names: &'a [String],
}

/// Say that `what` failed: a JSON error line with `--json`, else the
/// usual error line naming the job (and destination).
fn report(json: bool, job: &str, repo: Option<&str>, err: &anyhow::Error) {
    if !Exit::prints(err) {
        return;
    }
    let text = error_text(err);
    if json {
        let mut v = json!({
            "message_type": "error",
            "job": job,
            "message": text,
            "exit_code": Exit::from_error(err).code(),
        });
        if let Some(r) = repo {
            v["destination"] = r.into();
        }
        eprintln!("{v}");
    } else {
        let at = match repo {
            Some(r) => format!("job {}, {}", printable(job), printable(r)),
            None => format!("job {}", printable(job)),
        };
        eprintln!(
            "btrsend: error: {at}: {}",
            crate::text::printable_lines(&text)
        );
    }
}

/// Run a job's hook `which` (`cmd` with `sh -c`), its output passing
/// through (standard output to standard error with `--json`, so that
/// standard output stays JSON).
fn hook(each: &Each<'_>, which: &str, cmd: &str, env: &[(&str, String)]) -> anyhow::Result<()> {
    let mut c = Command::new("sh");
    c.arg("-c").arg(cmd).env("BTRSEND_HOOK", which);
    for (k, v) in env {
        c.env(k, v);
    }
    if each.json {
        use std::os::fd::AsFd;
        let err = std::io::stderr().as_fd().try_clone_to_owned()?;
        c.stdout(Stdio::from(err));
    }
    let status = c
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run the {which} command: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        anyhow::bail!("the {which} command failed ({status})")
    }
}

/// Run `f` on every destination of every job `each.names` selects in the
/// config file `path`; `skip` leaves a destination out (forget without a
/// policy).
///
/// # Errors
///
/// The file's errors; then, after every job ran, an error carrying the
/// combined exit status when something failed.
pub(super) fn each_destination(
    path: &Path,
    each: &Each<'_>,
    skip: &dyn Fn(&Job, &Destination) -> bool,
    f: &mut dyn FnMut(&str, &Job, &Destination, &mut Metrics) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    let jobs = cfg.jobs(each.names)?;
    let metrics_file = each.metrics_file.map(Path::to_path_buf).or_else(|| {
        cfg.section(each.command)
            .and_then(|s| s.metrics_file.as_ref())
            .map(|m| m.get_ref().clone())
    });
    let mut metrics: Vec<(Metrics, Exit)> = Vec::new();
    let mut summary = Vec::new();
    let mut job_exits = Vec::new();
    let mut failures = 0usize;
    for (name, job) in &jobs {
        let dests: Vec<&Destination> = job
            .destination
            .iter()
            .map(|d| d.get_ref())
            .filter(|d| !skip(job, d))
            .collect();
        if dests.is_empty() {
            continue;
        }
        let repos: Vec<String> = dests.iter().map(|d| d.location().to_owned()).collect();
        let mut env: Vec<(&str, String)> = vec![
            ("BTRSEND_JOB", (*name).to_owned()),
            ("BTRSEND_COMMAND", each.command.to_owned()),
            ("BTRSEND_CONFIG", cfg.path.display().to_string()),
            ("BTRSEND_DESTINATIONS", repos.join("\n")),
        ];
        let mut done: Vec<Done> = Vec::new();
        let mut first_error: Option<String> = None;
        let mut hook_failed = false;
        let before = match &job.before {
            Some(cmd) => hook(each, "before", cmd, &env),
            None => Ok(()),
        };
        match before {
            Err(e) => {
                // The job is skipped, and each of its destinations counts
                // as failed (for the metrics, as for the exit status).
                report(each.json, name, None, &e);
                first_error = Some(error_text(&e));
                hook_failed = true;
                for d in &dests {
                    let mut m = Metrics::of_job(each.command, name, d.location());
                    m.end();
                    metrics.push((m, Exit::Failure));
                    done.push(Done {
                        repo: d.location().to_owned(),
                        exit: Exit::Failure,
                        error: first_error.clone(),
                    });
                }
            }
            Ok(()) => {
                for d in &dests {
                    let repo = d.location();
                    let mut ctx = serde_json::Map::new();
                    ctx.insert("job".into(), (*name).into());
                    ctx.insert("destination".into(), repo.into());
                    set_json_context(Some(ctx));
                    let mut m = Metrics::of_job(each.command, name, repo);
                    let r = f(name, job, d, &mut m);
                    m.end();
                    set_json_context(None);
                    let (exit, error) = match &r {
                        Ok(()) => (Exit::Success, None),
                        Err(e) => {
                            report(each.json, name, Some(repo), e);
                            (Exit::from_error(e), Some(error_text(e)))
                        }
                    };
                    if first_error.is_none() {
                        first_error.clone_from(&error);
                    }
                    metrics.push((m, exit));
                    done.push(Done {
                        repo: repo.to_owned(),
                        exit,
                        error,
                    });
                }
            }
        }
        let mut exit = combine(&done.iter().map(|d| d.exit).collect::<Vec<_>>());
        let failed: Vec<&Done> = done.iter().filter(|d| d.exit != Exit::Success).collect();
        let outcome = |env: &mut Vec<(&str, String)>, exit: Exit, first_error: &Option<String>| {
            env.retain(|(k, _)| {
                !k.starts_with("BTRSEND_RESULT")
                    && !matches!(
                        *k,
                        "BTRSEND_EXIT_STATUS"
                            | "BTRSEND_FAILED_DESTINATIONS"
                            | "BTRSEND_DESTINATION"
                            | "BTRSEND_ERROR"
                    )
            });
            let result = if exit == Exit::Success {
                "success"
            } else {
                "failure"
            };
            env.push(("BTRSEND_RESULT", result.to_owned()));
            env.push(("BTRSEND_EXIT_STATUS", exit.code().to_string()));
            env.push((
                "BTRSEND_FAILED_DESTINATIONS",
                failed
                    .iter()
                    .map(|d| d.repo.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            ));
            env.push((
                "BTRSEND_DESTINATION",
                failed.first().map(|d| d.repo.clone()).unwrap_or_default(),
            ));
            env.push(("BTRSEND_ERROR", first_error.clone().unwrap_or_default()));
        };
        if let Some(cmd) = &job.after {
            outcome(&mut env, exit, &first_error);
            if let Err(e) = hook(each, "after", cmd, &env) {
                report(each.json, name, None, &e);
                hook_failed = true;
                first_error.get_or_insert_with(|| error_text(&e));
                exit = combine(&[exit, Exit::Failure]);
            }
        }
        if exit != Exit::Success
            && let Some(cmd) = &job.on_error
        {
            outcome(&mut env, exit, &first_error);
            if let Err(e) = hook(each, "on_error", cmd, &env) {
                report(each.json, name, None, &e);
                hook_failed = true;
                exit = combine(&[exit, Exit::Failure]);
            }
        }
        if exit != Exit::Success {
            failures += 1;
        }
        job_exits.push(exit);
        summary.push(json!({
            "job": name,
            "exit_code": exit.code(),
            "hook_failed": hook_failed,
            "destinations": done.iter().map(|d| json!({
                "destination": d.repo,
                "exit_code": d.exit.code(),
                "error": d.error,
            })).collect::<Vec<_>>(),
        }));
    }
    if job_exits.is_empty() {
        // Only forget leaves destinations out: those without a policy.
        return Err(anyhow::Error::new(crate::exit::UsageError(format!(
            "refusing an empty policy, which would delete every backup: no destination of the jobs selected in {} has a keep_* key, and no --keep-* option is given",
            printable(&cfg.path.display().to_string())
        ))));
    }
    let exit = combine(&job_exits);
    if let Some(file) = &metrics_file {
        let items: Vec<(&Metrics, Exit)> = metrics.iter().map(|(m, e)| (m, *e)).collect();
        if let Err(w) = write_all(file, &items) {
            if exit == Exit::Success {
                return Err(w);
            }
            eprintln!("btrsend: warning: {}", printable(&w.to_string()));
        }
    }
    if each.json {
        let v = json!({
            "message_type": "jobs_summary",
            "command": each.command,
            "config": cfg.path.display().to_string(),
            "jobs": summary,
            "exit_code": exit.code(),
        });
        let mut out = crate::exit::stdout();
        let _ = std::io::Write::write_fmt(&mut out, format_args!("{v}\n"));
    }
    if exit == Exit::Success {
        return Ok(());
    }
    let msg = format!(
        "{failures} of {} jobs failed ({})",
        job_exits.len(),
        printable(&cfg.path.display().to_string())
    );
    if each.json {
        return Err(anyhow::Error::new(ExitWith::quiet(exit)));
    }
    Err(anyhow::Error::new(ExitWith::new(exit, msg)))
}
