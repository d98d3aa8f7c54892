//! [`S3Store`]: a repository in an S3-compatible bucket, through
//! `object_store`. Its tokio runtime (two worker threads) lives inside the
//! store; every method blocks on it, so the rest of the code stays
//! synchronous.
//!
//! * Put-if-absent (the catalog, the config) is a HEAD, then a PUT with
//!   `If-None-Match: *`: on AWS S3, MinIO, Ceph RGW, R2… two writers can
//!   never both create the same key. The repository does not depend on
//!   that guarantee: only the holder of the exclusive lock writes catalogs
//!   and stream files, and lock objects need no conditional write (each
//!   process creates a lock object of its own, under a unique name, then
//!   lists the others: see [`lock`](super::lock)). So a server that checks
//!   the header without atomicity, as the `s3s-fs` test server does (0.14:
//!   a stat before the write; two racing PUTs both succeed), or one that
//!   ignores it, is still safe for btrsend.
//! * A stream file is a multipart upload: parts of 8 MiB and up (growing
//!   every 1000 parts, to stay under S3's 10000-part limit), four in
//!   flight. The object appears only when the upload completes. Before its
//!   first part, the upload's id is written to a marker object
//!   `tmp/NAME.RANDOM.upload` (`{"key","upload_id"}`), removed when the
//!   upload completes or is aborted. An upload that fails is aborted (its
//!   parts deleted) at once; one cut short by `kill -9`, a power cut or a
//!   lost connection is aborted by the next `run`, `import` or `forget`,
//!   which finds its marker. Only an upload killed between its creation and
//!   its marker's (one request, before any part) is left to the bucket's
//!   lifecycle rule (`AbortIncompleteMultipartUpload`), if one is set; it
//!   holds no data.
//! * **Continuing.** The parts of an unfinished upload cannot be read back,
//!   so what a continuation needs is recorded as they are stored. A stream
//!   file's writer hands its frames over one by one
//!   ([`Upload::write_resumable`]); a part is cut only at the end of the
//!   frame that brings the buffer to the part size (so parts are 8 MiB plus
//!   up to a frame, and never end inside one), with the state after that
//!   frame (`partial::Checkpoint`). A
//!   recorder task takes the servers' acknowledgements (in any order) and,
//!   each time the run of parts stored from the first grows past a part
//!   with a state, rewrites the marker: `{"key","upload_id","parts":
//!   [{"etag","size"}…],"state"}`. A run that fails keeps its upload (its
//!   parts in flight are awaited and recorded); one killed keeps what the
//!   marker says. The next `run` of the same snapshot and parent reads the
//!   marker ([`Store::recorded`]), checks the state against its parts and
//!   the snapshot (see [`partial`](super::partial)), probes the upload with
//!   a one-byte part at the next part number (object_store has no
//!   ListParts; the probe fails for an upload the server aborted, and is
//!   replaced by the next real part), continues the send from the recorded
//!   token and completes the upload with the recorded parts and the new
//!   ones. What a kill loses is what was not recorded: the parts in flight
//!   (up to four), the part being filled and the frames still in the
//!   writer's pipeline. The marker grows with the frame table (about 150
//!   bytes a frame of 4 MiB of raw stream) and is rewritten after every
//!   part: a quadratic cost that stays small for streams of tens of GB
//!   (a 40 GB stream: markers of up to ~1.5 MB, ~5 % more upload) but
//!   grows beyond; splitting the table into write-once objects would make
//!   it linear.
//! * Connections: credentials, region and endpoint are looked for as the
//!   AWS tools look for them, in the environment, then in the profile
//!   `AWS_PROFILE` of `~/.aws/credentials` and `~/.aws/config` (see
//!   `setup`); the other `AWS_*` variables `object_store` knows apply
//!   too. A machine with no credentials gets one line naming what to set,
//!   before any request.
//! * Retries: a request that fails to connect, is cut, or gets a 5xx
//!   answer is retried with a backoff of up to 5 seconds for 120 seconds
//!   (`BTRSEND_S3_RETRY_TIMEOUT`, at most 10 minutes, 0 for no retry), so
//!   a network blip of a minute passes unnoticed. A conditional PUT cut in
//!   flight is not retried (a retry could find its own write).
//! * Checksums: every PUT and every part carries `x-amz-checksum-sha256`
//!   (and a multipart upload declares SHA256), which buckets with Object
//!   Lock require and every server can check. `AWS_CHECKSUM_ALGORITHM=
//!   crc64nvme` picks the other algorithm `object_store` knows.
//! * Errors: a server's answer is reduced to its status, error code and a
//!   bounded message with control characters escaped (never its raw XML);
//!   the ones an admin meets first (no bucket, an unknown key, a wrong
//!   secret, a wrong region, a skewed clock, no permission) say what to
//!   check. A server that cannot be reached (after the retries) is
//!   "unreachable" (exit status 10), as is a missing bucket; a refused key
//!   is not.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, Checksum, S3ConditionalPut};
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use tokio::runtime::Runtime;

use super::store::{
    ObjectInfo, Recorded, Store, StoreError, TMP_DIR, Upload, check_key, random_u64,
};

mod errors;
mod setup;
mod upload;

use errors::clean;
use upload::{MARKER_SUFFIX, Marker, S3Upload};

use setup::{Credentials, Settings};

/// A repository in an S3 bucket, under an optional prefix.
pub struct S3Store {
    name: String,
    prefix: String,
    s3: Arc<AmazonS3>,
    rt: Arc<Runtime>,
    ctx: Arc<Context>,
}

/// What error messages name about the connection.
#[derive(Debug)]
struct Context {
    bucket: String,
    region: String,
    /// Where the credentials come from (never a key).
    credentials: String,
    retry_timeout: Duration,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store").field("name", &self.name).finish()
    }
}

impl S3Store {
    /// The store for `s3://BUCKET[/PREFIX]`, configured from the `AWS_*`
    /// environment variables and the AWS tools' shared files (see
    /// `setup`).
    ///
    /// # Errors
    ///
    /// A malformed spec ([`StoreError::Unreachable`]); no credentials, a
    /// profile that cannot be used, or a configuration `object_store`
    /// refuses ([`StoreError::Setup`]).
    pub fn new(spec: &str) -> Result<S3Store, StoreError> {
        let (bucket, prefix) = parse_spec(spec)?;
        let home = std::env::home_dir().filter(|h| !h.as_os_str().is_empty());
        let settings =
            setup::resolve(&|name| std::env::var(name).ok(), home.as_deref()).map_err(|what| {
                StoreError::Setup {
                    location: spec.to_owned(),
                    what,
                }
            })?;
        Self::with_settings(spec, bucket, prefix, settings)
    }

    fn with_settings(
        spec: &str,
        bucket: &str,
        prefix: &str,
        settings: Settings,
    ) -> Result<S3Store, StoreError> {
        let setup_err = |what: String| StoreError::Setup {
            location: spec.to_owned(),
            what,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("btrsend-s3")
            .enable_all()
            .build()
            .map_err(|e| setup_err(format!("cannot start the S3 client's runtime: {e}")))?;
        let provider = matches!(settings.credentials, Credentials::Provider(_));
        let mut b = AmazonS3Builder::new();
        let mut checksum_set = false;
        for (name, value) in std::env::vars_os() {
            let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else {
                continue;
            };
            if !name.starts_with("AWS_") || value.is_empty() {
                continue;
            }
            if let Ok(key) = name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
                && passes(&key, provider)
            {
                checksum_set |= matches!(key, AmazonS3ConfigKey::Checksum);
                b = b.with_config(key, value);
            }
        }
        if !checksum_set {
            b = b.with_checksum_algorithm(Checksum::SHA256);
        }
        b = b
            .with_bucket_name(bucket)
            .with_region(&settings.region)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(retry_config(settings.retry_timeout))
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(10))
                    .with_timeout(Duration::from_secs(300))
                    .with_allow_http(
                        settings
                            .endpoint
                            .as_deref()
                            .is_some_and(|e| e.starts_with("http://")),
                    ),
            );
        if let Some(e) = &settings.endpoint {
            b = b.with_endpoint(e);
        }
        match &settings.credentials {
            Credentials::Keys {
                key_id,
                secret,
                token,
                ..
            } => {
                b = b.with_access_key_id(key_id).with_secret_access_key(secret);
                if let Some(t) = token {
                    b = b.with_token(t);
                }
            }
            Credentials::Anonymous => b = b.with_skip_signature(true),
            Credentials::Provider(_) => {}
        }
        let s3 = {
            let _guard = rt.enter();
            b.build().map_err(|e| {
                setup_err(format!(
                    "cannot configure the S3 client: {}",
                    clean(&e.to_string())
                ))
            })?
        };
        Ok(S3Store {
            name: spec.trim_end_matches('/').to_owned(),
            prefix: prefix.to_owned(),
            s3: Arc::new(s3),
            rt: Arc::new(rt),
            ctx: Arc::new(Context {
                bucket: bucket.to_owned(),
                region: settings.region,
                credentials: settings.credentials.source().to_owned(),
                retry_timeout: settings.retry_timeout,
            }),
        })
    }

    /// The object path of a key, which is checked first
    /// ([`check_key`]): keys come from catalogs and markers someone else
    /// may have written, and must not reach outside the prefix.
    fn path(&self, key: &str) -> Result<Path, StoreError> {
        check_key(key).map_err(|why| StoreError::Other {
            op: "check",
            location: self.name.clone(),
            error: why.into(),
        })?;
        Ok(self.path_unchecked(key))
    }

    /// The object path of a checked key or a listing's directory prefix.
    fn path_unchecked(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    fn location(&self, key: &str) -> String {
        format!("{}/{key}", self.name)
    }

    fn err(&self, op: &'static str, key: &str, e: object_store::Error) -> StoreError {
        self.ctx.map_err(&self.name, op, self.location(key), e)
    }

    /// Another handle on the same bucket (for an upload).
    fn handle(&self) -> S3Store {
        S3Store {
            name: self.name.clone(),
            prefix: self.prefix.clone(),
            s3: Arc::clone(&self.s3),
            rt: Arc::clone(&self.rt),
            ctx: Arc::clone(&self.ctx),
        }
    }

    /// The marker object `tmp`.
    fn marker(&self, tmp: &str) -> Result<Marker, StoreError> {
        let body = self.get(tmp, None)?;
        serde_json::from_slice(&body).map_err(|e| StoreError::Other {
            op: "read",
            location: self.location(tmp),
            error: format!("not a marker of an upload: {e}").into(),
        })
    }

    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        match self.rt.block_on(self.s3.head(&self.path(key)?)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err("stat", key, e)),
        }
    }
}

/// The bucket and the prefix of `s3://BUCKET[/PREFIX]`.
fn parse_spec(spec: &str) -> Result<(&str, &str), StoreError> {
    let invalid = |what: String| StoreError::Unreachable {
        location: spec.to_owned(),
        error: what.into(),
    };
    let rest = spec
        .strip_prefix("s3://")
        .ok_or_else(|| invalid(String::from("not an s3://BUCKET[/PREFIX] address")))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(invalid(String::from(
            "no bucket name: use s3://BUCKET[/PREFIX]",
        )));
    }
    let prefix = prefix.trim_matches('/');
    if prefix
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
        && !prefix.is_empty()
    {
        return Err(invalid(format!(
            "the prefix {prefix:?} has an empty, . or .. component"
        )));
    }
    Ok((bucket, prefix))
}

/// Whether an `AWS_*` variable goes to `object_store` as it is: not the
/// settings `setup` resolves (credentials, region, endpoint), not the
/// client options set here, and the credential providers' settings only
/// when the credentials come from one.
fn passes(key: &AmazonS3ConfigKey, provider: bool) -> bool {
    use AmazonS3ConfigKey as K;
    match key {
        K::AccessKeyId
        | K::SecretAccessKey
        | K::Token
        | K::Region
        | K::DefaultRegion
        | K::Endpoint
        | K::S3Endpoint
        | K::Bucket
        | K::ConditionalPut
        | K::SkipSignature
        | K::Client(_) => false,
        K::ContainerCredentialsRelativeUri
        | K::ContainerCredentialsFullUri
        | K::ContainerAuthorizationTokenFile
        | K::WebIdentityTokenFile
        | K::RoleArn
        | K::RoleSessionName
        | K::StsEndpoint
        | K::MetadataEndpoint
        | K::ImdsV1Fallback => provider,
        _ => true,
    }
}

/// Retry a failed request for `timeout`, with a backoff that starts at
/// 100 ms and grows to 5 s (less for a short timeout, so that its last
/// retry does not sleep far past it).
fn retry_config(timeout: Duration) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: (timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5)),
            base: 2.0,
        },
        // The timeout is the limit; the count only stops a runaway.
        max_retries: if timeout.is_zero() { 0 } else { 10_000 },
        retry_timeout: timeout,
    }
}

impl Store for S3Store {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &str, range: Option<Range<u64>>) -> Result<Vec<u8>, StoreError> {
        let path = self.path(key)?;
        let res = self.rt.block_on(async {
            match range {
                None => self.s3.get(&path).await?.bytes().await,
                Some(r) => self.s3.get_range(&path, r).await,
            }
        });
        let bytes = res.map_err(|e| self.err("read", key, e))?;
        Ok(bytes.to_vec())
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<bool, StoreError> {
        if self.exists(key)? {
            return Ok(false);
        }
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let payload = PutPayload::from(data.to_vec());
        match self
            .rt
            .block_on(self.s3.put_opts(&self.path(key)?, payload, opts))
        {
            Ok(_) => Ok(true),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(false),
            Err(e) => Err(self.err("write", key, e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        // Keys are DIR/NAME: list DIR, keep the names that match.
        let dir = prefix.rfind('/').map_or("", |i| &prefix[..i]);
        let list_path = match (self.prefix.is_empty(), dir.is_empty()) {
            (true, true) => None,
            (false, true) => Some(Path::from(self.prefix.as_str())),
            (_, false) => Some(self.path_unchecked(dir)),
        };
        let res = self
            .rt
            .block_on(self.s3.list_with_delimiter(list_path.as_ref()))
            .map_err(|e| self.err("list", dir, e))?;
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut out: Vec<ObjectInfo> = res
            .objects
            .into_iter()
            .filter_map(|o| {
                let full = o.location.as_ref();
                let key = full.strip_prefix(strip.as_str())?;
                // A name that is no key is no object of the repository.
                (key.starts_with(prefix) && check_key(key).is_ok()).then(|| ObjectInfo {
                    key: key.to_owned(),
                    size: o.size,
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.rt.block_on(self.s3.delete(&self.path(key)?)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("delete", key, e)),
        }
    }

    fn multipart(&self, key: &str) -> Result<Box<dyn Upload>, StoreError> {
        let path = self.path(key)?;
        let id = self
            .rt
            .block_on(self.s3.create_multipart(&path))
            .map_err(|e| self.err("start upload", key, e))?;
        let base = key.rsplit('/').next().unwrap_or(key);
        let marker = format!("{TMP_DIR}/{base}.{:016x}{MARKER_SUFFIX}", random_u64());
        let m = Marker {
            key: key.to_owned(),
            upload_id: id.clone(),
            parts: Vec::new(),
            state: None,
        };
        let body = serde_json::to_vec(&m).unwrap_or_default();
        if let Err(e) = self.put_if_absent(&marker, &body) {
            let _ = self.rt.block_on(self.s3.abort_multipart(&path, &id));
            return Err(e);
        }
        Ok(Box::new(S3Upload::start(self.handle(), m, marker)))
    }

    fn continues_uploads(&self) -> bool {
        true
    }

    fn recorded(&self, tmp: &str) -> Result<Option<Recorded>, StoreError> {
        if !tmp.ends_with(MARKER_SUFFIX) {
            return Ok(None);
        }
        let m = self.marker(tmp)?;
        Ok(m.state.map(|state| Recorded {
            key: m.key,
            stored_bytes: m.parts.iter().map(|p| p.size).sum(),
            state,
        }))
    }

    fn continue_upload(
        &self,
        tmp: &str,
        keep: u64,
        key: &str,
    ) -> Result<Option<Box<dyn Upload>>, StoreError> {
        let m = self.marker(tmp)?;
        let other = |what: String| StoreError::Other {
            op: "continue upload",
            location: self.location(tmp),
            error: what.into(),
        };
        if m.key != key {
            return Err(other(format!("its upload is of {}, not {key}", m.key)));
        }
        let stored: u64 = m.parts.iter().map(|p| p.size).sum();
        if m.state.is_none() || stored != keep {
            return Err(other(format!(
                "its recorded parts hold {stored} bytes, not {keep}"
            )));
        }
        // Whether the server still has the upload (a lifecycle rule may
        // have aborted it): a one-byte part where the next one goes, which
        // that one replaces (object_store has no ListParts). An upload
        // the server no longer knows fails here.
        let path = self.path(&m.key)?;
        self.rt
            .block_on(self.s3.put_part(
                &path,
                &m.upload_id,
                m.parts.len(),
                PutPayload::from_static(b"\0"),
            ))
            .map_err(|e| self.err("continue upload of", &m.key, e))?;
        Ok(Some(Box::new(S3Upload::start(
            self.handle(),
            m,
            tmp.to_owned(),
        ))))
    }

    fn discard_unfinished(&self, key: &str) -> Result<(), StoreError> {
        if key.ends_with(MARKER_SUFFIX) {
            let marker = match self.get(key, None) {
                Ok(b) => serde_json::from_slice::<Marker>(&b).ok(),
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e),
            };
            if let Some(m) = marker {
                match self
                    .rt
                    .block_on(self.s3.abort_multipart(&self.path(&m.key)?, &m.upload_id))
                {
                    // Gone already: completed (its object is removed with
                    // the other unlisted stream files) or aborted.
                    Ok(())
                    | Err(
                        object_store::Error::NotFound { .. }
                        | object_store::Error::PermissionDenied { .. },
                    ) => {}
                    Err(e) => return Err(self.err("abort upload of", &m.key, e)),
                }
            }
        }
        self.delete(key)
    }

    fn check_reachable(&self) -> Result<(), StoreError> {
        let path = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        match self.rt.block_on(self.s3.list_with_delimiter(path.as_ref())) {
            Ok(_) => Ok(()),
            // A listing fails with 404 only for a missing bucket (some
            // servers send no body to say so).
            Err(object_store::Error::NotFound { .. }) => Err(self.ctx.no_bucket(&self.name)),
            Err(e) => match self.ctx.map_err(&self.name, "list", self.name.clone(), e) {
                StoreError::NotFound { .. } => Err(self.ctx.no_bucket(&self.name)),
                other => Err(other),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::errors::{request_host, unescape_xml, xml_element};
    use super::*;

    fn store(spec: &str) -> Result<S3Store, StoreError> {
        let (bucket, prefix) = parse_spec(spec)?;
        let settings = Settings {
            credentials: Credentials::Keys {
                key_id: String::from("id"),
                secret: String::from("secret"),
                token: None,
                source: String::from("test"),
            },
            region: String::from("us-east-1"),
            endpoint: None,
            retry_timeout: Duration::from_secs(1),
        };
        S3Store::with_settings(spec, bucket, prefix, settings)
    }

    #[test]
    fn specs_are_checked() {
        for (spec, why) in [
            ("s3://", "no bucket name"),
            ("s3:///prefix", "no bucket name"),
            ("s3://b/a//c", "empty, . or .. component"),
            ("s3://b/a/../c", "empty, . or .. component"),
            ("/local", "not an s3://"),
        ] {
            let e = store(spec).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with(spec) && text.contains(why),
                "{spec}: {text}"
            );
        }
        let s = store("s3://bucket/some/prefix/").unwrap();
        assert_eq!(s.name(), "s3://bucket/some/prefix");
        assert_eq!(
            s.path("catalog/x").unwrap().as_ref(),
            "some/prefix/catalog/x"
        );
        assert!(s.path("streams/../config").is_err());
        assert!(s.path("../other/x").is_err());
        assert_eq!(s.location("config"), "s3://bucket/some/prefix/config");
        let s = store("s3://bucket").unwrap();
        assert_eq!(s.path("config").unwrap().as_ref(), "config");
    }

    #[test]
    fn server_text_is_one_bounded_line() {
        assert_eq!(clean("a\x1b[2Jb\nc"), "a\\u{1b}[2Jb\\nc");
        assert_eq!(clean(&"x".repeat(1000)).chars().count(), 301);
        assert_eq!(
            request_host("Error performing GET http://127.0.0.1:9/b?list-type=2 in 3ms"),
            Some(String::from("http://127.0.0.1:9"))
        );
        let body = "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code>\
                    <Message>no &amp; \x07never</Message></Error>";
        assert_eq!(xml_element(body, "Code"), Some("AccessDenied"));
        assert_eq!(
            clean(&unescape_xml(xml_element(body, "Message").unwrap())),
            "no & \\u{7}never"
        );
        assert_eq!(xml_element("<Code>x", "Code"), None);
    }

    #[test]
    fn retry_policy() {
        let r = retry_config(Duration::from_secs(120));
        assert_eq!(r.retry_timeout, Duration::from_secs(120));
        assert_eq!(r.backoff.max_backoff, Duration::from_secs(5));
        let r = retry_config(Duration::from_secs(2));
        assert_eq!(r.backoff.max_backoff, Duration::from_millis(500));
        assert_eq!(retry_config(Duration::ZERO).max_retries, 0);
    }
}
