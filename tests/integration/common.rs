//! Helpers shared by the core library's integration tests.

use std::process::{Command, Stdio};

/// Run `script` with `bash -ec`; panic with its standard error unless it
/// succeeds; its standard output.
#[track_caller]
pub fn shell(script: &str) -> String {
    let out = Command::new("bash")
        .arg("-ec")
        .arg(script)
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
