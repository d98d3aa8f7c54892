//! Where the backup tests keep their repository: a local directory, or an
//! S3 bucket on a real S3 server (`s3s-fs`) that the test starts on
//! 127.0.0.1 and stops when it ends. The same tests run against both (see
//! `backup.rs`); [`TestRepo::files`] is where the objects lie as plain
//! files in both cases (`s3s-fs` stores `BUCKET/KEY` under its root), so a
//! test can damage them behind the repository's back.
//!
//! Without `s3s-fs` (installed by `.ci/run`: `cargo install s3s-fs
//! --features binary`) the S3 variant prints loudly that it was skipped; in
//! CI its absence fails the test.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A local directory.
    Dir,
    /// A bucket on a local `s3s-fs` server.
    S3,
    /// A directory served by `btrsend serve` through a real `sshd` on
    /// 127.0.0.1 (`ssh://USER@127.0.0.1:PORT/DIR`).
    Ssh,
}

const BUCKET: &str = "btrsend-test";
const ACCESS_KEY: &str = "btrsend-test-key";
const SECRET_KEY: &str = "btrsend-test-secret";

/// The `s3s-fs` binary: `$S3S_FS`, else in `PATH`, else in cargo's bin
/// directory.
fn s3s_fs() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("S3S_FS") {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.is_file())
}

/// A free port on 127.0.0.1: bound, noted, released (another process
/// could take it meanwhile: a server started on it then exits, and the
/// caller tries again; a client finds nobody listening).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `s3s-fs`, killed on drop.
pub struct S3Server {
    child: Child,
    bin: PathBuf,
    port: u16,
    root: PathBuf,
}

/// Start `s3s-fs` from `bin` on `port` with its data in `root`: the child
/// once it listens, `None` if it exited first (the port was taken).
fn spawn_s3s(bin: &Path, port: u16, root: &Path) -> Option<Child> {
    let mut child = Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl S3Server {
    /// Start a server whose data lives in `root` (created), with one
    /// bucket; `None` (after a loud notice) when `s3s-fs` is not
    /// installed, a panic in CI.
    pub fn start(test: &str, root: &Path) -> Option<S3Server> {
        let Some(bin) = s3s_fs() else {
            btrsend::testing::skip_or_fail(
                test,
                "needs s3s-fs (cargo install s3s-fs --features binary; .ci/run installs it)",
            );
            return None;
        };
        std::fs::create_dir_all(root.join(BUCKET)).unwrap();
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = spawn_s3s(&bin, port, root) {
                return Some(S3Server {
                    child,
                    bin,
                    port,
                    root: root.to_path_buf(),
                });
            }
        }
        panic!("s3s-fs did not start listening on 127.0.0.1");
    }

    /// Stop the server (its data stays), as a crash or a restart would.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Start the stopped server again, on the same port with the same data.
    pub fn start_again(&mut self) {
        self.child =
            spawn_s3s(&self.bin, self.port, &self.root).expect("s3s-fs starts again on its port");
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The variables that point a `btrsend` at this server.
    pub fn envs(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
            ("AWS_REGION", String::from("us-east-1")),
        ]
    }

    /// The access key id and secret the server accepts.
    pub fn keys() -> (&'static str, &'static str) {
        (ACCESS_KEY, SECRET_KEY)
    }

    /// The bucket the server has.
    pub fn bucket() -> &'static str {
        BUCKET
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `sshd` on 127.0.0.1 that lets the test's key in as the
/// user running the tests (with the key's options: a forced command),
/// killed on drop.
pub struct SshServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// The user the tests run as.
fn user_name() -> String {
    let out = Command::new("id").arg("-un").output().expect("id -un");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

impl SshServer {
    /// Start `sshd` with its keys and configuration in `dir` (made); the
    /// client key's line in `authorized_keys` starts with `options` (e.g.
    /// a forced command). `None` (after a loud notice) when OpenSSH's
    /// server is not installed, a panic in CI.
    pub fn start(test: &str, dir: &Path, options: &str) -> Option<SshServer> {
        let sshd = Path::new("/usr/sbin/sshd");
        if !sshd.is_file() {
            btrsend::testing::skip_or_fail(
                test,
                "needs OpenSSH's sshd (apt-get install openssh-server; .ci/run installs it)",
            );
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        for key in ["host_key", "client_key"] {
            let _ = std::fs::remove_file(dir.join(key));
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key))
                .output()
                .expect("ssh-keygen");
            assert!(out.status.success(), "ssh-keygen: {out:?}");
        }
        let public = std::fs::read_to_string(dir.join("client_key.pub")).unwrap();
        let line = if options.is_empty() {
            public
        } else {
            format!("{options} {public}")
        };
        std::fs::write(dir.join("authorized_keys"), line).unwrap();
        // The privilege-separation directory sshd wants when run as root.
        let _ = std::fs::create_dir_all("/run/sshd");
        for _ in 0..5 {
            let port = free_port();
            let config = format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
                 PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n\
                 StrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
                 AllowUsers {user}\nMaxStartups 100\n",
                d = dir.display(),
                user = user_name(),
            );
            std::fs::write(dir.join("sshd_config"), config).unwrap();
            let mut child = Command::new(sshd)
                .args(["-D", "-e", "-f"])
                .arg(dir.join("sshd_config"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("sshd.log")).unwrap())
                .spawn()
                .expect("start sshd");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20) {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(SshServer {
                        child,
                        port,
                        dir: dir.to_path_buf(),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "sshd did not start listening on 127.0.0.1: {}",
            std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        );
    }

    /// `ssh://USER@127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &Path) -> String {
        format!(
            "ssh://{}@127.0.0.1:{}{}",
            user_name(),
            self.port,
            path.display()
        )
    }

    /// The ssh command (BTRSEND_SSH) that logs in with the test's key and
    /// trusts the test's server.
    pub fn ssh_command(&self) -> String {
        format!(
            "ssh -F /dev/null -i {}/client_key -o IdentitiesOnly=yes -o BatchMode=yes \
             -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.dir.display()
        )
    }

    /// The variables that point a `btrsend` at this server and at the
    /// `btrsend` under test on the far end.
    pub fn envs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("BTRSEND_SSH", self.ssh_command()),
            (
                "BTRSEND_REMOTE_PATH",
                env!("CARGO_BIN_EXE_btrsend").to_owned(),
            ),
        ]
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a test's repositories live: directories under the test's
/// directory, or prefixes of one bucket on the test's own S3 server.
pub struct Backend {
    kind: Kind,
    dir: PathBuf,
    server: Option<S3Server>,
    ssh: Option<SshServer>,
}

/// One repository of a [`Backend`].
#[derive(Debug, Clone)]
pub struct TestRepo {
    /// `--repo` for it.
    pub spec: String,
    /// The directory where its objects lie as files.
    pub files: PathBuf,
}

impl Backend {
    /// The backend for `test`, with its data under `dir`; `None` when the
    /// S3 server is not available here (skipped loudly; a panic in CI).
    pub fn new(kind: Kind, test: &str, dir: &Path) -> Option<Backend> {
        let (server, ssh) = match kind {
            Kind::Dir => (None, None),
            Kind::S3 => (Some(S3Server::start(test, &dir.join("s3"))?), None),
            Kind::Ssh => (None, Some(SshServer::start(test, &dir.join("sshd"), "")?)),
        };
        Some(Backend {
            kind,
            dir: dir.to_path_buf(),
            server,
            ssh,
        })
    }

    /// The store kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The repository `name`: the directory `DIR/name`, or
    /// `s3://BUCKET/name`.
    pub fn repo(&self, name: &str) -> TestRepo {
        match &self.server {
            None => {
                let files = self.dir.join(name);
                let spec = match &self.ssh {
                    Some(ssh) => ssh.url(&files),
                    None => files.to_str().unwrap().to_owned(),
                };
                TestRepo { spec, files }
            }
            Some(s) => TestRepo {
                spec: format!("s3://{BUCKET}/{name}"),
                files: s.root.join(BUCKET).join(name),
            },
        }
    }

    /// Point `cmd` at the S3 server (nothing for a directory).
    pub fn apply<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.envs(self.envs())
    }

    /// The variables `btrsend` needs for this backend (none for a
    /// directory).
    pub fn envs(&self) -> Vec<(&'static str, String)> {
        let mut envs = self.server.as_ref().map(S3Server::envs).unwrap_or_default();
        envs.extend(self.ssh.as_ref().map(SshServer::envs).unwrap_or_default());
        envs
    }

    /// The parts of open multipart uploads the S3 server holds (`s3s-fs`
    /// keeps them as files `.upload_id-ID.part-N` in its root, the upload
    /// itself as `.upload-ID.json`, until it completes or is aborted); none
    /// for a directory. A part whose upload is no longer open is not
    /// counted: `s3s-fs` forgets the upload first when it completes one, so
    /// a client killed during CompleteMultipartUpload can leave part files
    /// of an upload no request can name (real S3 completes atomically).
    pub fn upload_parts(&self) -> Vec<String> {
        let Some(s) = &self.server else {
            return Vec::new();
        };
        let mut parts: Vec<String> = std::fs::read_dir(&s.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| {
                n.strip_prefix(".upload_id-")
                    .and_then(|rest| rest.split_once(".part-"))
                    .is_some_and(|(id, _)| s.root.join(format!(".upload-{id}.json")).exists())
            })
            .collect();
        parts.sort();
        parts
    }

    /// The sshd's port (an ssh backend).
    pub fn ssh_port(&self) -> Option<u16> {
        self.ssh.as_ref().map(SshServer::port)
    }

    /// The server's address, for an unreachable-port test.
    pub fn port(&self) -> Option<u16> {
        self.server.as_ref().map(|s| s.port)
    }
}
