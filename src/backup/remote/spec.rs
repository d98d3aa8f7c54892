//! Where a remote repository is (`ssh://[USER@]HOST[:PORT]/PATH`) and the
//! command line that reaches it: the ssh command (`ssh`, or `BTRSEND_SSH` /
//! `--ssh-command` split on whitespace, as borg's `BORG_RSH`), its port
//! and destination, then the remote program and `serve`. The repository's
//! path is not on that line: it travels in the handshake, so a forced
//! command in `authorized_keys` still serves any path it allows.

/// A parsed `ssh://` repository address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshSpec {
    /// The user, if given.
    pub user: Option<String>,
    /// The host name or address (an IPv6 address without its brackets).
    pub host: String,
    /// The port, if given.
    pub port: Option<u16>,
    /// The repository's absolute path on the host.
    pub path: String,
}

impl SshSpec {
    /// Parse `spec`; `None` when it does not start with `ssh://`.
    ///
    /// # Errors
    ///
    /// What is wrong with the address, as text.
    pub fn parse(spec: &str) -> Option<Result<SshSpec, String>> {
        let rest = spec.strip_prefix("ssh://")?;
        Some(parse_rest(rest).map_err(|why| format!("repository {spec:?}: {why}")))
    }

    /// The command line that starts `serve` on the host: `ssh` (the
    /// program and its options), then `-p PORT`, `[USER@]HOST`, the remote
    /// program and `serve`.
    pub fn command(&self, ssh: &str, remote_path: &str) -> Vec<String> {
        let mut line: Vec<String> = ssh.split_whitespace().map(str::to_owned).collect();
        if line.is_empty() {
            line.push("ssh".into());
        }
        if let Some(port) = self.port {
            line.push("-p".into());
            line.push(port.to_string());
        }
        // `--` ends ssh's options: a host cannot pass for one.
        line.push("--".into());
        line.push(match &self.user {
            Some(user) => format!("{user}@{}", self.host),
            None => self.host.clone(),
        });
        line.push(remote_path.into());
        line.push("serve".into());
        line
    }
}

fn parse_rest(rest: &str) -> Result<SshSpec, String> {
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => return Err("no path after the host".into()),
    };
    if path.len() < 2 {
        return Err("no path after the host".into());
    }
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (Some(user), host_port),
        None => (None, authority),
    };
    if let Some(user) = user
        && (user.is_empty() || !user.bytes().all(plain))
    {
        return Err("an empty user or one with unusual characters".into());
    }
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("an unclosed '['")?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or("junk after ']'")?)),
        }
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() || host.starts_with('-') || !host.bytes().all(|b| plain(b) || b == b':') {
        return Err("an empty host or one with unusual characters".into());
    }
    let port = port
        .map(|port| {
            port.parse::<u16>()
                .map_err(|_| format!("port {port:?} is not a number"))
        })
        .transpose()?;
    if path.contains('\0') || path.bytes().any(|b| b.is_ascii_control()) {
        return Err("a path with control characters".into());
    }
    Ok(SshSpec {
        user: user.map(str::to_owned),
        host: host.into(),
        port,
        path: path.into(),
    })
}

/// A byte of a user or host name.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let spec = SshSpec::parse("ssh://backup@host.example:2222/srv/repo")
            .unwrap()
            .unwrap();
        assert_eq!(
            spec,
            SshSpec {
                user: Some("backup".into()),
                host: "host.example".into(),
                port: Some(2222),
                path: "/srv/repo".into(),
            }
        );
        let spec = SshSpec::parse("ssh://[::1]/r").unwrap().unwrap();
        assert_eq!((spec.host.as_str(), spec.port), ("::1", None));
        assert!(SshSpec::parse("/srv/repo").is_none());
        for bad in [
            "ssh://host",
            "ssh://host/",
            "ssh://-oProxyCommand=x/r",
            "ssh://@host/r",
            "ssh://host:port/r",
            "ssh://a b/r",
            "ssh://host/r\n",
        ] {
            assert!(SshSpec::parse(bad).unwrap().is_err(), "{bad}");
        }
    }

    #[test]
    fn command_lines() {
        let spec = SshSpec::parse("ssh://u@h:22/r").unwrap().unwrap();
        assert_eq!(
            spec.command("ssh -i key  -o X=1", "btrsend"),
            [
                "ssh", "-i", "key", "-o", "X=1", "-p", "22", "--", "u@h", "btrsend", "serve"
            ]
        );
        let spec = SshSpec::parse("ssh://h/r").unwrap().unwrap();
        assert_eq!(
            spec.command("", "/opt/btrsend"),
            ["ssh", "--", "h", "/opt/btrsend", "serve"]
        );
    }
}
