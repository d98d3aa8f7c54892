//! What S3 errors become: a server's answer reduced to its status, error
//! code and a bounded, escaped message, classified (unreachable, no bucket,
//! refused) and told with what to check.
//!
//! It only reads errors and the connection's context; it never makes a
//! request, and never shows a server's raw XML or a secret.

use super::{Context, StoreError};

/// Text from a server or a library that wraps it, for a message: one line,
/// control characters escaped, at most `MAX_TEXT` characters.
pub(super) fn clean(s: &str) -> String {
    const MAX_TEXT: usize = 300;
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == MAX_TEXT {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What a failed request met.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// No answer: the connection failed or was cut. `host` is where the
    /// request went (`http://host:port`), `why` the innermost error.
    Transport { host: Option<String>, why: String },
    /// An error answer: its HTTP status, and the `Code` and `Message` of
    /// its XML body when it has them (cleaned).
    Answer {
        status: u16,
        code: Option<String>,
        message: Option<String>,
    },
    /// Neither (a malformed answer, a local error).
    Other,
}

/// Classify an `object_store` error by its chain: the transport error
/// (`object_store::client::HttpError`) or the error answer its retry
/// layer describes ("Server returned non-2xx status code: 404 Not Found:
/// BODY"; that type is not public, so its text is read).
fn classify(e: &object_store::Error) -> Failure {
    let mut host = None;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = err.to_string();
        if host.is_none() {
            host = request_host(&text);
        }
        if err
            .downcast_ref::<object_store::client::HttpError>()
            .is_some()
        {
            let mut inner: &(dyn std::error::Error + 'static) = err;
            while let Some(next) = inner.source() {
                inner = next;
            }
            return Failure::Transport {
                host,
                why: clean(&inner.to_string()),
            };
        }
        for marker in [
            "Server returned non-2xx status code: ",
            "Server returned error response: ",
        ] {
            if let Some(at) = text.find(marker) {
                let rest = &text[at + marker.len()..];
                let status = rest
                    .get(..3)
                    .and_then(|n| n.parse::<u16>().ok())
                    .unwrap_or(200);
                let code = xml_element(rest, "Code")
                    .filter(|c| {
                        c.len() <= 64 && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '.')
                    })
                    .map(str::to_owned);
                let message = xml_element(rest, "Message").map(|m| clean(&unescape_xml(m)));
                return Failure::Answer {
                    status,
                    code,
                    message,
                };
            }
        }
        cur = err.source();
    }
    Failure::Other
}

/// `http://host:port` of the URL in "Error performing GET URL in …".
pub(super) fn request_host(text: &str) -> Option<String> {
    let rest = text.split("Error performing ").nth(1)?;
    let url = rest.split_whitespace().nth(1)?;
    let (scheme, after) = url.split_once("://")?;
    let authority = after.split(['/', '?']).next()?;
    (!authority.is_empty()).then(|| clean(&format!("{scheme}://{authority}")))
}

/// The text of the first `<name>…</name>` in `xml`.
pub(super) fn xml_element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&close)?;
    Some(xml[start..start + len].trim())
}

pub(super) fn unescape_xml(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

impl Context {
    /// The retry policy, for messages.
    pub(super) fn retried(&self) -> String {
        format!(
            "retried for {}s; {} sets how long",
            self.retry_timeout.as_secs(),
            super::setup::RETRY_ENV
        )
    }

    pub(super) fn no_bucket(&self, repo: &str) -> StoreError {
        StoreError::Missing {
            location: repo.to_owned(),
            what: format!(
                "bucket {:?} does not exist: create it first (e.g. `aws s3 mb s3://{}`), or check \
                 the bucket name, AWS_ENDPOINT_URL and AWS_REGION",
                self.bucket, self.bucket
            ),
        }
    }

    /// The error for a failed operation `op` on `location`, in the
    /// repository `repo`.
    pub(super) fn map_err(
        &self,
        repo: &str,
        op: &'static str,
        location: String,
        e: object_store::Error,
    ) -> StoreError {
        if matches!(
            e,
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }
        ) {
            return StoreError::Exists { location };
        }
        let failure = classify(&e);
        let setup = |what: String| StoreError::Setup {
            location: repo.to_owned(),
            what,
        };
        let src = &self.credentials;
        match failure {
            Failure::Answer { ref code, .. } if code.as_deref() == Some("NoSuchBucket") => {
                self.no_bucket(repo)
            }
            _ if matches!(e, object_store::Error::NotFound { .. }) => {
                StoreError::NotFound { location }
            }
            Failure::Transport { host, why } => StoreError::Unreachable {
                location: repo.to_owned(),
                error: format!(
                    "cannot reach {}: {why} ({})",
                    host.as_deref().unwrap_or("the S3 server"),
                    self.retried()
                )
                .into(),
            },
            Failure::Answer {
                status,
                code,
                message,
            } => {
                let code_str = code.as_deref().unwrap_or("");
                match (status, code_str) {
                    (_, "InvalidAccessKeyId" | "NotSignedUp" | "InvalidClientTokenId") => {
                        setup(format!(
                            "the S3 server does not know the access key id ({code_str}) from \
                             {src}: check the key id, and that the endpoint is the server \
                             that issued it"
                        ))
                    }
                    (_, "SignatureDoesNotMatch") => setup(format!(
                        "the S3 server rejected the request signature (SignatureDoesNotMatch): \
                         the secret access key from {src} does not belong to its access key id"
                    )),
                    (_, "ExpiredToken" | "TokenRefreshRequired") => setup(format!(
                        "the session token from {src} has expired ({code_str}): renew the \
                         credentials"
                    )),
                    (_, "InvalidToken") => setup(format!(
                        "the S3 server refused the session token from {src} (InvalidToken)"
                    )),
                    (_, "RequestTimeTooSkewed") => setup(String::from(
                        "this machine's clock is too far from the S3 server's \
                         (RequestTimeTooSkewed): set it right, e.g. with NTP",
                    )),
                    (301, _) | (_, "PermanentRedirect" | "AuthorizationHeaderMalformed") => {
                        setup(format!(
                            "the bucket {:?} is not in the region {}: set AWS_REGION (or \
                             region in the profile) to the bucket's region",
                            self.bucket, self.region
                        ))
                    }
                    (_, "InvalidBucketName") => setup(format!(
                        "{:?} is not a valid bucket name (InvalidBucketName)",
                        self.bucket
                    )),
                    (401 | 403, _) => StoreError::Setup {
                        location,
                        what: format!(
                            "access denied to {op} ({status}{}): the credentials from {src} \
                             lack the permission; check the key's policy and the bucket's{}",
                            code.as_deref().map_or(String::new(), |c| format!(" {c}")),
                            message.map_or(String::new(), |m| format!(" (the server says: {m})"))
                        ),
                    },
                    (500..=599, _) => StoreError::Unreachable {
                        location: repo.to_owned(),
                        error: format!(
                            "the S3 server keeps failing: {status}{}{} ({})",
                            code.as_deref().map_or(String::new(), |c| format!(" {c}")),
                            message.map_or(String::new(), |m| format!(": {m}")),
                            self.retried()
                        )
                        .into(),
                    },
                    _ => StoreError::Other {
                        op,
                        location,
                        error: format!(
                            "the S3 server answered {status}{}{}",
                            code.map_or(String::new(), |c| format!(" {c}")),
                            message.map_or(String::new(), |m| format!(": {m}"))
                        )
                        .into(),
                    },
                }
            }
            Failure::Other => StoreError::Other {
                op,
                location,
                error: clean(&e.to_string()).into(),
            },
        }
    }
}
