//! Which store a URL names, and the store itself: `object_store`'s own URL parsing
//! ([`ObjectStoreScheme::parse`]) and builders, configured from the environment the way each
//! store's users expect (`AWS_*`, `GOOGLE_*`, `AZURE_*`), with the retries and timeouts of
//! [`Settings`], and the cap on requests in flight that all objects of one store share. Also the
//! one place that turns `object_store` errors into [`io::Error`]s of the right kind.
//!
//! No bytes move here; ranges are `fetch.rs`'s concern.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreScheme, RetryConfig};
use tokio::sync::Semaphore;
use url::Url;

use crate::config::Settings;
use crate::error::{Error, Result};

/// A parsed remote URL: the store kind and the object's path inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    /// The URL as parsed.
    pub url: Url,
    /// Which store serves it.
    pub scheme: ObjectStoreScheme,
    /// The object's key in its store.
    pub path: Path,
    /// Whether the query string is part of the object's name: an `http(s)://` URL with a query,
    /// such as an S3 presigned URL, a GCS signed URL or an Azure SAS URL, whose query is its
    /// authorization. Such a URL is read as a plain HTTP object, whatever its host: the whole
    /// URL is the store, the path is empty, and it is opened with a GET (a presigned URL is
    /// signed for its method, so a HEAD is refused).
    pub signed: bool,
    /// Whether the whole URL is the store and the path is empty: a signed URL, and a plain HTTP
    /// one whose path an object path would not give back as written (`%2F` or `%2B` in a
    /// segment, an empty segment, a trailing `/`), so that the server is asked for exactly the
    /// path the user wrote. Such an object shares no client with others of its server.
    pub whole_url: bool,
}

impl Location {
    /// The part of the URL that names the store: scheme, host and port (and bucket, for stores
    /// whose host holds it), or the whole URL where that is the store ([`Location::whole_url`]).
    pub(crate) fn store_part(&self) -> &str {
        if self.whole_url {
            self.url.as_str()
        } else {
            &self.url[..url::Position::BeforePath]
        }
    }
}

/// Whether `s` looks like a URL ferrio reads remotely (`s3://`, `gs://`, `az://`, `abfs://`,
/// `http://`, `https://`, ...), as opposed to a local path.
pub fn is_remote_url(s: &str) -> bool {
    const SCHEMES: &[&str] = &[
        "s3://", "s3a://", "gs://", "az://", "adl://", "azure://", "abfs://", "abfss://",
        "http://", "https://",
    ];
    let lower = s.trim_start().to_ascii_lowercase();
    SCHEMES.iter().any(|p| lower.starts_with(p))
}

/// `url` as it may be shown in a message: a password in it replaced by `***`
/// (`http://u:***@host/x`), also where the URL does not parse.
pub fn redacted(url: &str) -> std::borrow::Cow<'_, str> {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.into();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    // The last '@' of the authority ends the user part (a password may hold '@' unencoded).
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.into();
    };
    let Some(colon) = rest[..at].find(':') else {
        return url.into();
    };
    let (start, end) = (scheme_end + colon + 1, scheme_end + at);
    format!("{}***{}", &url[..start], &url[end..]).into()
}

/// The local path a `file:/` URL names (`file:///data/x%20y.bin` is `/data/x y.bin`), read by
/// the local engine as the path itself is; `None` where `s` is no `file:/` URL (`file:x` is a
/// relative name like any other). The path is taken as written, percent-decoded byte for byte:
/// `.` and `..` segments and a trailing `/` keep their meaning for the file system (`cp -r
/// file:///src/. DST` copies the contents), where a URL parser would resolve or drop them.
///
/// # Errors
/// [`Error::InvalidArgument`] for a `file:` URL that names no local path: another host
/// (`file://server/share/x`), a query or a fragment, a control character, a bad escape, or a
/// NUL (`%00`).
pub fn file_url_path(s: &str) -> Option<Result<std::path::PathBuf>> {
    use std::os::unix::ffi::OsStringExt;
    let scheme = s.get(..6)?;
    if !scheme.eq_ignore_ascii_case("file:/") {
        return None;
    }
    let bad = |why: &str| Error::InvalidArgument(format!("bad file URL {s:?}: {why}"));
    let rest = &s[5..];
    // `file://host/path` or `file:/path`.
    let path = match rest.strip_prefix("//") {
        Some(authority_and_path) => {
            let (host, path) = match authority_and_path.find('/') {
                Some(at) => authority_and_path.split_at(at),
                None => (authority_and_path, ""),
            };
            if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
                return Some(Err(bad(
                    "it names another host; only this machine's files are opened",
                )));
            }
            if path.is_empty() {
                return Some(Err(bad("it names no path")));
            }
            path
        }
        None => rest,
    };
    if path.contains(['?', '#']) {
        return Some(Err(bad(
            "a '?' or '#' is not part of a path here: percent-encode them as %3F and %23",
        )));
    }
    if path.chars().any(char::is_control) {
        return Some(Err(bad(
            "control characters are not kept in a URL: percent-encode them (%09, ...)",
        )));
    }
    let raw = path.as_bytes();
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = raw
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(0) => return Some(Err(bad("%00 cannot be in a path"))),
                Some(b) => bytes.push(b),
                None => return Some(Err(bad("a '%' that starts no escape: write it as %25"))),
            }
            i += 3;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    Some(Ok(std::ffi::OsString::from_vec(bytes).into()))
}

/// Where `s` reads as a URL (`scheme://...`) of a scheme ferrio does not open (`ftp`, say),
/// a sentence saying so, for an error that would otherwise say only "No such file or
/// directory".
pub fn unsupported_url_scheme(s: &str) -> Option<String> {
    if file_url_path(s).is_some() {
        return None;
    }
    let (scheme, _) = s.split_once("://")?;
    let mut chars = scheme.chars();
    let is_scheme = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    (is_scheme && !is_remote_url(s)).then(|| {
        format!("{scheme}:// is not a URL scheme ferrio opens (s3://, gs://, az://, http(s)://)")
    })
}

/// Parses `url` into a store kind and a path; a malformed or unsupported URL is
/// [`Error::InvalidArgument`] naming it.
pub(crate) fn parse(url: &str) -> Result<Location> {
    parse_any(url, false)
}

/// Parses `url` as a prefix of keys (`s3://bucket/dir/`, or a bucket's root `s3://bucket/`):
/// as [`parse`], but the path may be empty.
pub(crate) fn parse_prefix(url: &str) -> Result<Location> {
    parse_any(url, true)
}

fn parse_any(url: &str, prefix: bool) -> Result<Location> {
    let bad =
        |why: String| Error::InvalidArgument(format!("bad object URL {:?}: {why}", redacted(url)));
    let parsed = Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let http = matches!(parsed.scheme(), "http" | "https");
    if http && (!parsed.username().is_empty() || parsed.password().is_some()) {
        // object_store's HTTP client sends no Authorization from the URL: the server would
        // answer "access denied" with no hint why.
        return Err(bad(
            "a user or password in an http(s) URL is not sent: ferrio has no HTTP \
             authentication (use a signed URL, or a server that needs none)"
                .into(),
        ));
    }
    if !http {
        literal_key(url, prefix).map_err(|why| bad(why.into()))?;
        // `s3://user:secret@bucket/k` or `s3://bucket:99/k` would be read with neither (an
        // `abfs://` URL names its file system as the user part).
        let bucket_url = matches!(parsed.scheme(), "s3" | "s3a" | "gs" | "az");
        let extra =
            !parsed.username().is_empty() || parsed.password().is_some() || parsed.port().is_some();
        if bucket_url && extra {
            return Err(bad(
                "a bucket URL takes no user, password or port: credentials and endpoints come \
                 from the store's variables (AWS_*, GOOGLE_*, AZURE_*)"
                    .into(),
            ));
        }
    }
    // A key is the URL's path alone: a `#...` (or, outside http(s), a `?...`) would be left
    // out of it silently, and `s3://b/k#1` would read or write the object `k`.
    if parsed.fragment().is_some() || (!http && parsed.query().is_some()) {
        return Err(bad(
            "'#' and '?' are not part of an object's key in a URL: percent-encode them as %23 \
             and %3F"
                .into(),
        ));
    }
    let signed = http && parsed.query().is_some();
    if signed {
        if prefix {
            return Err(bad(
                "a URL with a query string names one object: it cannot be listed".into(),
            ));
        }
        return Ok(Location {
            url: parsed,
            scheme: ObjectStoreScheme::Http,
            path: Path::default(),
            signed,
            whole_url: true,
        });
    }
    if http && !prefix && !http_path_kept(&parsed) {
        return Ok(Location {
            url: parsed,
            scheme: ObjectStoreScheme::Http,
            path: Path::default(),
            signed: false,
            whole_url: true,
        });
    }
    let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(e.to_string()))?;
    match scheme {
        ObjectStoreScheme::AmazonS3
        | ObjectStoreScheme::GoogleCloudStorage
        | ObjectStoreScheme::MicrosoftAzure
        | ObjectStoreScheme::Http => {}
        other => {
            return Err(bad(format!(
                "{other:?} is not a remote store (open local files by path)"
            )))
        }
    }
    // `az://container/key`: object_store's scheme parser takes the first segment of the path
    // for a container too (as in `https://account.blob.core.windows.net/container/key`), while
    // its Azure builder takes the host for the container; the key is the whole path.
    let path = if parsed.scheme() == "az" {
        Path::from_url_path(parsed.path()).map_err(|e| bad(e.to_string()))?
    } else {
        path
    };
    if path.as_ref().is_empty() && !prefix {
        return Err(bad("no object key".into()));
    }
    Ok(Location {
        url: parsed,
        scheme,
        path,
        signed,
        whole_url: false,
    })
}

/// Whether a plain `http(s)://` URL (no query) would be asked for as written by a store of its
/// server given the URL's object path: `object_store` decodes the path into segments
/// (`%2F` becomes a separator, `%2B` a `+`), drops empty ones (`a//b`, a trailing `/`) and
/// encodes them again, which asks a web server for another resource, or refuses the URL. A URL
/// of S3, GCS or Azure by its host is always kept (`%2F` in a key is its `/`).
fn http_path_kept(url: &Url) -> bool {
    let Ok((scheme, path)) = ObjectStoreScheme::parse(url) else {
        // An empty segment or a bad escape: only an HTTP server's path can be taken as it is.
        let mut origin = url.clone();
        origin.set_path("/");
        return !matches!(
            ObjectStoreScheme::parse(&origin),
            Ok((ObjectStoreScheme::Http, _))
        );
    };
    if scheme != ObjectStoreScheme::Http {
        return true;
    }
    // What object_store's HTTP client asks for: the server's URL with the path's parts.
    let mut asked = url.clone();
    asked.set_path("/");
    if let Ok(mut segments) = asked.path_segments_mut() {
        segments.clear().extend(path.parts());
    }
    asked.path() == url.path()
}

/// Checks that the key written in a bucket URL (`s3://`, `gs://`, `az://`) is the key that will
/// be read or written. A URL parser resolves `.` and `..` segments and drops tabs, newlines
/// and surrounding spaces, and an object path has no empty segment, so `s3://b/a/../k`,
/// `s3://b/k ` and `s3://b/k/` would all silently name the object `k`. Such keys are refused
/// (`prefix`: a listing, whose trailing `/` is the usual way to write it, may end in one).
fn literal_key(url: &str, prefix: bool) -> std::result::Result<(), &'static str> {
    if url.chars().any(|c| c.is_control()) || url.trim() != url {
        return Err(
            "control characters, and spaces at either end, are not kept in a URL: \
                    percent-encode them (%09, %20, ...)",
        );
    }
    // The key: after `scheme://bucket/`, up to a query or fragment (refused elsewhere).
    let Some((_, rest)) = url.split_once("://") else {
        return Ok(());
    };
    let Some((_, key)) = rest.split_once('/') else {
        return Ok(());
    };
    let key = key.split(['?', '#']).next().unwrap_or(key);
    let segments: Vec<&str> = key.split('/').collect();
    let dot = |s: &&str| {
        let s = s.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    };
    if segments.iter().any(dot) {
        return Err(
            "'.' and '..' segments of a key would be resolved away by URL parsing: \
                    ferrio opens keys as written, so it cannot name this one",
        );
    }
    let last = segments.len() - 1;
    let empty = segments
        .iter()
        .enumerate()
        .any(|(i, s)| s.is_empty() && !(prefix && i == last) && !(i == 0 && key.is_empty()));
    if empty {
        return Err(
            "a key with an empty segment ('a//b', or ending in '/') cannot be named \
                    exactly through object_store: ferrio would open another key",
        );
    }
    Ok(())
}

/// Retries of one request: object_store backs off with jitter on 429, 5xx and dropped
/// connections; the count and the total time are bounded (`remote_retries`,
/// `remote_retry_timeout`) so that a dead endpoint fails.
fn retry_config(settings: &Settings) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: settings.remote_retries,
        retry_timeout: settings.remote_retry_timeout,
    }
}

/// Timeouts of one request (`remote_connect_timeout`, `remote_timeout`): connecting must be
/// quick; a whole ranged GET gets longer, since its body may be large on a slow link.
fn client_options(settings: &Settings, allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(settings.remote_connect_timeout)
        .with_timeout(settings.remote_timeout)
        .with_allow_http(allow_http)
}

/// The caps on requests in flight, one per store and cap size, for as long as an object of that
/// store is open.
static IN_FLIGHT: Mutex<Vec<(String, Weak<Semaphore>)>> = Mutex::new(Vec::new());

/// The cap on ranged GETs in flight that every object of `loc`'s store shares, of
/// `settings.remote_concurrency` permits: a store (bucket, container, server) limits a client's
/// connections and serves each at a fraction of the link, so ten objects read at once must not
/// open ten times as many. Objects opened with another `remote_concurrency`, and forked
/// children, get caps of their own.
pub(crate) fn in_flight_cap(loc: &Location, settings: &Settings) -> Arc<Semaphore> {
    let n = settings.remote_concurrency.max(1);
    let key = format!(
        "{}|{}|{n}",
        crate::sys::process_id(),
        &loc.url[..url::Position::BeforePath]
    );
    // Entries are only ever pushed or removed whole, so a poisoned lock holds a valid list.
    let mut caps = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
    caps.retain(|(_, cap)| cap.strong_count() > 0);
    if let Some(cap) = caps
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, c)| c.upgrade())
    {
        return cap;
    }
    let cap = Arc::new(Semaphore::new(n));
    caps.push((key, Arc::downgrade(&cap)));
    cap
}

/// The process environment's variables that start with `prefix`, as lowercase config keys.
fn env_options(prefix: &str) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

/// `builder` with every option whose key the store knows (`set` applies one), the rest skipped:
/// the environment holds variables of other tools under the same prefix.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the variable, for a value the store would fail on in the
/// middle of a request (see [`check_variable`]).
fn configured<B, K: std::str::FromStr>(
    builder: B,
    options: Vec<(String, String)>,
    set: impl Fn(B, K, String) -> B,
) -> Result<B> {
    options
        .into_iter()
        .try_fold(builder, |b, (k, v)| match k.parse::<K>() {
            Ok(key) => {
                check_variable(&k, &v)?;
                Ok(set(b, key, v))
            }
            Err(_) => Ok(b),
        })
}

/// Refuses a store variable's value that `object_store` takes at build time and then cannot
/// make a request from (it panics there): an endpoint that is not an absolute `http(s)://` URL
/// (`localhost:9000`, an empty value, a stray space), or a control character (a `\r` left by a
/// file written on Windows) in any value, which would go into a header. `key` is the
/// variable's lowercase name.
fn check_variable(key: &str, value: &str) -> Result<()> {
    let name = key.to_ascii_uppercase();
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Error::InvalidArgument(format!(
            "the variable {name} holds the control character {c:?}: remove it (a line ending \
             copied with the value?)"
        )));
    }
    let relative = key.ends_with("relative_uri");
    // `AZURE_USE_FABRIC_ENDPOINT` is a flag (`true`), not an endpoint.
    let is_flag = key.ends_with("use_fabric_endpoint");
    let is_url = !is_flag
        && (key.contains("endpoint")
            || key.ends_with("_url")
            || key.ends_with("_uri")
            || key.ends_with("authority_host"));
    if is_url && !relative && !is_http_url(value) {
        return Err(Error::InvalidArgument(format!(
            "the variable {name}={value:?} is not an http(s) URL: write it as \
             http://host:port or https://host"
        )));
    }
    // The store appends each request's path to the endpoint as text: `http://h/?x=1` asked
    // for `http://h/?x=1/bucket/key`.
    if is_url
        && !relative
        && Url::parse(value).is_ok_and(|u| u.query().is_some() || u.fragment().is_some())
    {
        return Err(Error::InvalidArgument(format!(
            "the variable {name}={value:?} holds a '?' or '#': an endpoint is \
             http(s)://host[:port][/path], each request's path is added after it"
        )));
    }
    // Names that become part of a host or a URL's path (`s3.REGION.amazonaws.com`,
    // `login.../TENANT/...`, `ACCOUNT.blob.core.windows.net`).
    let names_a_host_part = key.ends_with("_region")
        || key.contains("tenant_id")
        || key.ends_with("authority_id")
        || key.ends_with("account_name");
    let plain = |c: char| c.is_ascii_alphanumeric() || "-._".contains(c);
    if names_a_host_part && !value.chars().all(plain) {
        return Err(Error::InvalidArgument(format!(
            "the variable {name}={value:?} cannot be part of the store's address: it takes \
             letters, digits, '-', '.' and '_' only"
        )));
    }
    Ok(())
}

/// Whether `s` is, exactly as written, an absolute `http://` or `https://` URL with a host.
fn is_http_url(s: &str) -> bool {
    s.trim() == s
        && Url::parse(s).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
}

/// Whether S3 requests should say `UNSIGNED-PAYLOAD` rather than sign a SHA-256 of each body,
/// where `AWS_UNSIGNED_PAYLOAD` does not say: over HTTPS (the default endpoint, or an
/// `https://` one), where TLS guards the bytes, as boto3 does. Hashing every part cost about half
/// of an upload's CPU (dev VM, `benchmarks/remote_upload.py`: 0.70 against 1.38–1.67 CPU-s/GiB,
/// 1.5–1.9× the rate). A plain `http://` endpoint keeps signed bodies.
fn payload_unsigned_by_default(options: &[(String, String)]) -> bool {
    let plain_http = options
        .iter()
        .any(|(k, v)| (k == "aws_endpoint_url" || k == "aws_endpoint") && is_plain_http(v));
    !plain_http && !has_any(options, &["aws_unsigned_payload"])
}

/// Plain HTTP for a store whose endpoint variable (one of `endpoints`) is an `http://` address,
/// as boto3 and the Azure SDK take it: naming one is the user's choice of plain HTTP (a local
/// MinIO, moto or Azurite). `object_store` would refuse every request with only "builder error"
/// unless `<prefix>ALLOW_HTTP` is also set.
///
/// # Errors
/// [`Error::InvalidArgument`] naming both variables when `<prefix>ALLOW_HTTP` forbids what the
/// endpoint asks for.
fn allow_http_endpoint(
    options: &mut Vec<(String, String)>,
    prefix: &str,
    endpoints: &[&str],
) -> Result<()> {
    let Some((name, _)) = options
        .iter()
        .find(|(k, v)| endpoints.contains(&k.as_str()) && is_plain_http(v))
    else {
        return Ok(());
    };
    let name = name.to_ascii_uppercase();
    let allow_key = format!("{}allow_http", prefix.to_ascii_lowercase());
    match options.iter().find(|(k, _)| *k == allow_key) {
        None => options.push((allow_key, "true".into())),
        Some((_, v)) if v.trim().eq_ignore_ascii_case("true") => {}
        Some((_, v)) => {
            return Err(Error::InvalidArgument(format!(
                "{name} is a plain http:// address but {prefix}ALLOW_HTTP is {v:?}: set it to \
                 true, or use an https:// endpoint"
            )))
        }
    }
    Ok(())
}

fn is_plain_http(url: &str) -> bool {
    url.trim()
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
}

/// Whether any of `keys` (lowercase) is among `options`.
fn has_any(options: &[(String, String)], keys: &[&str]) -> bool {
    options.iter().any(|(k, _)| keys.contains(&k.as_str()))
}

/// Stores already built, each with what it was built from (see [`store_key`]), newest last, at
/// most [`KEPT_STORES`]: objects of one bucket or server share one client, so a recursive copy
/// or a loader opening many objects reuses connections (and their TLS sessions) and credentials
/// instead of making a client per object.
static STORES: Mutex<Vec<(String, Arc<dyn ObjectStore>)>> = Mutex::new(Vec::new());

/// How many stores [`STORES`] keeps; the least recently used goes first.
const KEPT_STORES: usize = 16;

/// Everything a store of `loc` is built from: the process (a forked child's connections are its
/// parent's), the store's part of the URL (scheme, bucket or server), the settings it takes, and
/// the environment it reads (its variables, `AZURITE_BLOB_STORAGE_URL` that object_store reads
/// for the Azure emulator's endpoint, and the gcloud credentials file), so a changed endpoint,
/// credential or timeout gets a store of its own.
fn store_key(loc: &Location, settings: &Settings) -> String {
    let mut env: Vec<(String, String)> = ["AWS_", "GOOGLE_", "AZURE_", "AZURITE_"]
        .into_iter()
        .flat_map(env_options)
        .collect();
    env.sort();
    format!(
        "{}|{}|{:?}|{:?}|{}|{:?}|{:?}|{:?}",
        crate::sys::process_id(),
        loc.store_part(),
        settings.remote_connect_timeout,
        settings.remote_timeout,
        settings.remote_retries,
        settings.remote_retry_timeout,
        std::env::var_os("HOME"),
        env,
    )
}

/// The store for `loc`: one built before from the same URL part, settings and environment, or
/// a new one (see [`build_new`]).
///
/// # Errors
/// As [`build_new`].
pub(crate) fn build_with(loc: &Location, settings: &Settings) -> Result<Arc<dyn ObjectStore>> {
    let key = store_key(loc, settings);
    {
        // Entries are only pushed, moved or removed whole, so a poisoned lock holds a valid list.
        let mut stores = STORES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = stores.iter().position(|(k, _)| *k == key) {
            let entry = stores.remove(i);
            let store = entry.1.clone();
            stores.push(entry);
            return Ok(store);
        }
    }
    // Built outside the lock (it may read files); two threads may both build, and both stores
    // work: the later one is kept.
    let store = build_new(loc, settings)?;
    let mut stores = STORES.lock().unwrap_or_else(|p| p.into_inner());
    stores.retain(|(k, _)| *k != key);
    if stores.len() >= KEPT_STORES {
        stores.remove(0);
    }
    stores.push((key, store.clone()));
    Ok(store)
}

/// Builds the store for `loc` from the environment. Without credentials in the environment the
/// requests go unsigned (public buckets); a user of instance credentials (EC2, GCE, managed
/// identity) turns signing on with `AWS_SKIP_SIGNATURE=false` (or the GOOGLE_/AZURE_ twin).
/// Timeouts and retries come from `settings`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the URL when the store's builder refuses it.
fn build_new(loc: &Location, settings: &Settings) -> Result<Arc<dyn ObjectStore>> {
    let url = loc.url.as_str();
    let bad = |e: object_store::Error| {
        Error::InvalidArgument(format!("cannot use object URL {url:?}: {e}"))
    };
    let store: Arc<dyn ObjectStore> = match loc.scheme {
        ObjectStoreScheme::AmazonS3 => {
            let mut opts = env_options("AWS_");
            let signed = [
                "aws_access_key_id",
                "aws_web_identity_token_file",
                "aws_container_credentials_relative_uri",
                "aws_container_credentials_full_uri",
                "aws_skip_signature",
            ];
            if !has_any(&opts, &signed) {
                opts.push(("aws_skip_signature".into(), "true".into()));
            }
            if payload_unsigned_by_default(&opts) {
                opts.push(("aws_unsigned_payload".into(), "true".into()));
            }
            allow_http_endpoint(&mut opts, "AWS_", &["aws_endpoint_url", "aws_endpoint"])?;
            let builder = AmazonS3Builder::new()
                .with_client_options(client_options(settings, false))
                .with_retry(retry_config(settings));
            let builder = configured(builder, opts, |b, key, v| b.with_config(key, v))?;
            Arc::new(builder.with_url(url).build().map_err(bad)?)
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            let mut opts = env_options("GOOGLE_");
            let signed = [
                "google_service_account",
                "google_service_account_path",
                "google_service_account_key",
                "google_application_credentials",
                "google_skip_signature",
            ];
            let adc = std::env::var_os("HOME").is_some_and(|h| {
                std::path::Path::new(&h)
                    .join(".config/gcloud/application_default_credentials.json")
                    .exists()
            });
            if !adc && !has_any(&opts, &signed) {
                opts.push(("google_skip_signature".into(), "true".into()));
            }
            let builder = GoogleCloudStorageBuilder::new()
                .with_client_options(client_options(settings, false))
                .with_retry(retry_config(settings));
            let builder = configured(builder, opts, |b, key, v| b.with_config(key, v))?;
            Arc::new(builder.with_url(url).build().map_err(bad)?)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            // The emulator's endpoint, which object_store reads from the environment itself.
            for (k, v) in env_options("AZURITE_BLOB_STORAGE_URL") {
                check_variable(&k, &v)?;
            }
            let mut opts = env_options("AZURE_");
            let signed = [
                "azure_storage_account_key",
                "azure_storage_access_key",
                "azure_storage_sas_key",
                "azure_storage_sas_token",
                "azure_storage_token",
                "azure_client_id",
                "azure_storage_client_id",
                "azure_federated_token_file",
                "azure_use_azure_cli",
                "azure_storage_use_emulator",
                "azure_skip_signature",
            ];
            if !has_any(&opts, &signed) {
                opts.push(("azure_skip_signature".into(), "true".into()));
            }
            allow_http_endpoint(
                &mut opts,
                "AZURE_",
                &["azure_storage_endpoint", "azure_endpoint"],
            )?;
            let builder = MicrosoftAzureBuilder::new()
                .with_client_options(client_options(settings, false))
                .with_http_connector(AzureConnector)
                .with_retry(retry_config(settings));
            let builder = configured(builder, opts, |b, key, v| b.with_config(key, v))?;
            Arc::new(builder.with_url(url).build().map_err(bad)?)
        }
        _ => {
            // The store is the server, and the object's path is relative to it; for a signed
            // URL the store is the URL itself, query included, and the path is empty.
            let base = loc.store_part();
            let builder = HttpBuilder::new()
                .with_client_options(client_options(settings, loc.url.scheme() == "http"))
                .with_retry(retry_config(settings))
                .with_url(base);
            Arc::new(builder.build().map_err(bad)?)
        }
    };
    Ok(store)
}

/// What an answer from Azure said of the blob's last Copy Blob (its `x-ms-copy-*` headers, see
/// [`watching_azure_copies`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AzureCopy {
    /// `x-ms-copy-id`: which copy.
    pub id: Option<String>,
    /// `x-ms-copy-status`: `success`, `pending`, `aborted` or `failed`.
    pub status: Option<String>,
    /// `x-ms-copy-status-description`: why a copy failed or is held up.
    pub description: Option<String>,
    /// `x-ms-copy-progress`: bytes copied and bytes in all (`copied/total`).
    pub progress: Option<String>,
}

tokio::task_local! {
    /// The `x-ms-copy-*` headers of the last successful answer that a task running inside
    /// [`watching_azure_copies`] got from an Azure store.
    static AZURE_COPY: RefCell<Option<AzureCopy>>;
}

/// Runs `f` with the `x-ms-copy-*` headers of each successful Azure answer it gets kept for
/// [`take_azure_copy`]: object_store's Copy Blob returns nothing of them, and its `head` only
/// the size, date and ETag, yet Azure may answer a copy `pending` and finish it later. The
/// requests stay object_store's own (signed and retried by it); [`AzureConnector`] only reads
/// the answers.
pub(crate) async fn watching_azure_copies<F: Future>(f: F) -> F::Output {
    AZURE_COPY.scope(RefCell::new(None), f).await
}

/// The copy headers of the last Azure answer inside [`watching_azure_copies`], forgotten here;
/// `None` when no answer came since (or outside it).
pub(crate) fn take_azure_copy() -> Option<AzureCopy> {
    AZURE_COPY.try_with(|seen| seen.take()).ok().flatten()
}

/// object_store's HTTP client for Azure, with [`AzureCopyWatch`] reading the answers.
#[derive(Debug)]
struct AzureConnector;

impl HttpConnector for AzureConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(AzureCopyWatch(inner)))
    }
}

/// Passes every request on unchanged; inside [`watching_azure_copies`] it keeps the copy
/// headers of each successful answer.
#[derive(Debug)]
struct AzureCopyWatch(HttpClient);

#[async_trait::async_trait]
impl HttpService for AzureCopyWatch {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        let answer = self.0.execute(req).await?;
        if answer.status().is_success() {
            let header = |name: &str| {
                let value = answer.headers().get(name)?.to_str().ok()?;
                Some(value.to_owned())
            };
            let copy = AzureCopy {
                id: header("x-ms-copy-id"),
                status: header("x-ms-copy-status"),
                description: header("x-ms-copy-status-description"),
                progress: header("x-ms-copy-progress"),
            };
            // Outside `watching_azure_copies` there is no one to tell.
            let _ = AZURE_COPY.try_with(|seen| seen.replace(Some(copy)));
        }
        Ok(answer)
    }
}

/// The [`io::Error`] for a failed store call, of the kind a local file's error would have (not
/// found, permission denied), so that callers and Python map it the same way. The message leaves
/// the URL out: the [`Error`] that carries this one names it.
pub(crate) fn io_error(e: object_store::Error) -> io::Error {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, "no such object"),
        E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("access denied: {source}"),
        ),
        E::Precondition { .. } | E::NotModified { .. } => changed("the store refused the read"),
        // A server that answers a Range GET with the whole object (`python -m http.server`);
        // reads ask it for the whole object instead (`fetch.rs`), so only a store call made
        // outside them ends here.
        ref e if ignores_range(e) => io::Error::new(
            io::ErrorKind::Unsupported,
            "the server does not answer range requests (it sent the whole object for a \
                 Range GET), and ferrio reads remote objects in ranges: serve it from a server \
                 that supports them (nginx, Apache, any object store)",
        ),
        // object_store reads no body without its length (a chunked reply).
        other if other.to_string().contains("Content-Length Header missing") => io::Error::other(
            "the server sent its reply without a Content-Length (chunked), which ferrio's HTTP \
             client cannot read: serve the object from a server that sends the length",
        ),
        other if timed_out(&other) => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("timed out ({other}; see remote_timeout)"),
        ),
        other => io::Error::other(other.to_string()),
    }
}

/// Whether a ranged GET failed because the server ignored `Range` and sent the whole object
/// (object_store refuses such an answer: as `NotSupported` from a GET, wrapped in a `Generic`
/// error from its resume of a broken body).
pub(crate) fn ignores_range(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotSupported { .. } | object_store::Error::Generic { .. }
    ) && e.to_string().contains("Range request not supported")
}

/// Whether a request got no answer at all: it timed out ([`timed_out`]) or could not connect.
/// Asking the same server another way would only wait as long again.
pub(crate) fn no_answer(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_connect)
        {
            return true;
        }
        next = e.source();
    }
    timed_out(e)
}

/// Whether a request's error came from a timeout: some error of its chain says so. A body that
/// stopped coming shows as object_store's `HttpError`; a request that got no answer at all (a
/// GET, a part upload, a completion) shows only as the reqwest error under object_store's
/// private retry error, which hides the `HttpError` that wraps it.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        let timeout = e
            .downcast_ref::<object_store::client::HttpError>()
            .is_some_and(|h| h.kind() == object_store::client::HttpErrorKind::Timeout)
            || e.downcast_ref::<reqwest::Error>()
                .is_some_and(reqwest::Error::is_timeout)
            || e.downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut);
        if timeout {
            return true;
        }
        next = e.source();
    }
    false
}

/// The error for an object that is no longer the one opened.
pub(crate) fn changed(why: &str) -> io::Error {
    io::Error::other(format!(
        "the object changed since it was opened ({why}); reopen it to read the new version"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept stores are one list for the process: these tests take turns with it.
    static KEPT: Mutex<()> = Mutex::new(());

    #[test]
    fn store_variables_named_endpoint_are_checked_as_urls_unless_they_are_flags() {
        for (key, value) in [
            ("aws_endpoint_url", "localhost:9000"),
            ("azure_msi_endpoint", "169.254.169.254"),
            ("aws_metadata_endpoint", ""),
            ("azure_storage_authority_host", "login"),
        ] {
            let err = check_variable(key, value).unwrap_err().to_string();
            assert!(err.contains("not an http(s) URL"), "{key}: {err}");
        }
        for (key, value) in [
            ("aws_endpoint_url", "http://127.0.0.1:9000"),
            ("azure_use_fabric_endpoint", "true"),
            ("azure_use_fabric_endpoint", "false"),
            (
                "aws_container_credentials_relative_uri",
                "/v2/credentials/x",
            ),
        ] {
            assert!(check_variable(key, value).is_ok(), "{key}={value}");
        }
    }

    #[test]
    fn a_file_url_names_its_local_path() {
        use std::path::PathBuf;
        for (url, path) in [
            ("file:///data/x.bin", "/data/x.bin"),
            ("FILE:///data/x%20y%23.bin", "/data/x y#.bin"),
            ("file://localhost/data/x", "/data/x"),
        ] {
            assert_eq!(
                file_url_path(url).unwrap().unwrap(),
                PathBuf::from(path),
                "{url}"
            );
        }
        // As written: `.`, `..` and a trailing `/` kept, bytes that are no UTF-8 too.
        for (url, path) in [
            ("file:///src/.", "/src/."),
            ("file:///a/link/../b/", "/a/link/../b/"),
            ("file:/x%2Fy", "/x/y"),
            ("file:///a%5Cb", "/a\\b"),
        ] {
            assert_eq!(
                file_url_path(url).unwrap().unwrap(),
                PathBuf::from(path),
                "{url}"
            );
        }
        use std::os::unix::ffi::OsStrExt;
        let latin1 = file_url_path("file:///caf%E9").unwrap().unwrap();
        assert_eq!(latin1.as_os_str().as_bytes(), b"/caf\xe9");
        for bad in [
            "file://server/share/x",
            "file:///x?y",
            "file:///x#y",
            "file:///x%00y",
            "file:///x\ty",
            "file:///x%zz",
            "file://localhost",
        ] {
            assert!(file_url_path(bad).unwrap().is_err(), "{bad}");
        }
        for not in [
            "/data/x",
            "s3://b/k",
            "files/x",
            "fil",
            "file:x",
            "file:",
            "file:sub/x",
        ] {
            assert!(file_url_path(not).is_none(), "{not}");
        }
    }

    #[test]
    fn only_a_url_of_a_scheme_not_opened_is_named() {
        let why = unsupported_url_scheme("ftp://host/x").expect("ftp");
        assert!(why.starts_with("ftp:// is not a URL scheme"), "{why}");
        // file:// is opened, by the local engine (`file_url_path`).
        assert!(unsupported_url_scheme("file:///etc/x").is_none());
        for not in [
            "s3://b/k",
            "HTTPS://h/x",
            "/data/x",
            "a:b",
            "dir/x://y",
            "1ftp://x",
            "",
        ] {
            assert_eq!(unsupported_url_scheme(not), None, "{not}");
        }
    }

    #[test]
    fn s3_bodies_go_unsigned_over_https_unless_the_environment_says() {
        let opts = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(payload_unsigned_by_default(&opts(&[])), "AWS itself");
        let https = [("aws_endpoint_url", "https://s3.example.com")];
        assert!(payload_unsigned_by_default(&opts(&https)));
        let http = [("aws_endpoint_url", "HTTP://127.0.0.1:9000")];
        assert!(
            !payload_unsigned_by_default(&opts(&http)),
            "plain HTTP signs"
        );
        let asked = [
            ("aws_endpoint", "https://x"),
            ("aws_unsigned_payload", "false"),
        ];
        assert!(
            !payload_unsigned_by_default(&opts(&asked)),
            "the user's word wins"
        );
        // The keys are ones the S3 builder knows.
        for key in ["aws_endpoint_url", "aws_endpoint", "aws_unsigned_payload"] {
            assert!(
                key.parse::<object_store::aws::AmazonS3ConfigKey>().is_ok(),
                "{key}"
            );
        }
    }

    #[test]
    fn objects_of_one_store_share_one_client_until_what_it_was_built_from_changes() {
        let _turn = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        let settings = Settings::default();
        let a = parse("http://127.0.0.1:9/d/a.bin").unwrap();
        let b = parse("http://127.0.0.1:9/other/b.bin").unwrap();
        let first = build_with(&a, &settings).unwrap();
        assert!(Arc::ptr_eq(&first, &build_with(&b, &settings).unwrap()));
        // Another server, and other timeouts, get stores of their own.
        let c = parse("http://127.0.0.1:10/d/a.bin").unwrap();
        assert!(!Arc::ptr_eq(&first, &build_with(&c, &settings).unwrap()));
        let mut slow = settings.clone();
        slow.remote_timeout = Duration::from_secs(7);
        let other = build_with(&a, &slow).unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert!(Arc::ptr_eq(&other, &build_with(&b, &slow).unwrap()));
    }

    #[test]
    fn the_kept_stores_are_bounded() {
        let _turn = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        let settings = Settings::default();
        for port in 20_000..20_000 + 2 * KEPT_STORES {
            let loc = parse(&format!("http://127.0.0.1:{port}/f")).unwrap();
            build_with(&loc, &settings).unwrap();
        }
        assert!(STORES.lock().unwrap().len() <= KEPT_STORES);
    }

    #[test]
    fn a_url_with_a_query_is_one_signed_http_object_whatever_its_host() {
        for url in [
            "https://bucket.s3.us-east-1.amazonaws.com/k/model.bin?X-Amz-Signature=abc",
            "https://storage.googleapis.com/b/k?X-Goog-Signature=abc&X-Goog-Expires=60",
            "https://acct.blob.core.windows.net/c/k?sv=2022-11-02&sig=abc",
            "http://127.0.0.1:9/d/a.bin?token=1",
        ] {
            let loc = parse(url).unwrap();
            assert!(loc.signed, "{url}");
            assert_eq!(loc.scheme, ObjectStoreScheme::Http, "{url}");
            assert_eq!(loc.path.as_ref(), "", "{url}");
            assert_eq!(loc.store_part(), url);
            assert!(parse_prefix(url).is_err(), "{url} cannot be listed");
        }
        // Without a query the host decides, and the store is the URL's part before the path.
        let loc = parse("https://bucket.s3.us-east-1.amazonaws.com/k/model.bin").unwrap();
        assert!(!loc.signed);
        assert_eq!(loc.scheme, ObjectStoreScheme::AmazonS3);
        assert_eq!(
            loc.store_part(),
            "https://bucket.s3.us-east-1.amazonaws.com"
        );
    }

    #[test]
    fn passwords_are_not_shown() {
        for (url, shown) in [
            ("http://u:secret@h:9/x", "http://u:***@h:9/x"),
            ("s3://u:p@ss@bucket/k?x#y", "s3://u:***@bucket/k?x#y"),
            ("https://u@h/x", "https://u@h/x"),
            ("http://h/a:b@c", "http://h/a:b@c"),
            ("http://u:secret@h:9", "http://u:***@h:9"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
        }
        for url in [
            "s3://u:secret@bucket/x",
            "http://u:secret@h:99999/x",
            "gs://u:secret@b/",
        ] {
            let err = parse(url).unwrap_err().to_string();
            assert!(!err.contains("secret"), "{url}: {err}");
            let err = parse_prefix(url).unwrap_err().to_string();
            assert!(!err.contains("secret"), "{url}: {err}");
        }
    }

    #[test]
    fn an_http_url_with_a_user_or_password_is_refused() {
        for url in [
            "http://user:secret@127.0.0.1:9/x",
            "https://user@example.com/x",
            "http://:pw@127.0.0.1:9/x",
        ] {
            let err = parse(url).unwrap_err().to_string();
            assert!(err.contains("user or password"), "{url}: {err}");
            assert!(!err.contains("secret") && !err.contains(":pw"), "{err}");
        }
    }

    #[test]
    fn an_http_path_that_an_object_path_would_change_makes_the_whole_url_the_store() {
        for url in [
            "http://127.0.0.1:9/api/group%2Fproj/raw",
            "http://127.0.0.1:9/dir/",
            "http://127.0.0.1:9/a//b",
            "https://example.com/c%2Bd",
        ] {
            let loc = parse(url).unwrap();
            assert!(loc.whole_url && !loc.signed, "{url}");
            assert_eq!(loc.scheme, ObjectStoreScheme::Http, "{url}");
            assert_eq!((loc.store_part(), loc.path.as_ref()), (url, ""), "{url}");
        }
        for url in [
            "http://127.0.0.1:9/a/b",
            "http://127.0.0.1:9/a%20b/c+d/%C3%A9",
            // S3 by its host: `%2F` in a key is its `/`.
            "https://bucket.s3.us-east-1.amazonaws.com/a%2Fb",
        ] {
            let loc = parse(url).unwrap();
            assert!(!loc.whole_url, "{url}");
            assert_eq!(loc.store_part(), &url[..url.find("/a").unwrap()], "{url}");
        }
    }

    #[test]
    fn parses_each_store_kind() {
        for (url, scheme, key) in [
            (
                "s3://bucket/a/b.bin",
                ObjectStoreScheme::AmazonS3,
                "a/b.bin",
            ),
            ("gs://bucket/x", ObjectStoreScheme::GoogleCloudStorage, "x"),
            (
                "az://container/x/y",
                ObjectStoreScheme::MicrosoftAzure,
                "x/y",
            ),
            (
                "abfs://fs@account.dfs.core.windows.net/x",
                ObjectStoreScheme::MicrosoftAzure,
                "x",
            ),
            (
                "http://127.0.0.1:8080/d/f.bin",
                ObjectStoreScheme::Http,
                "d/f.bin",
            ),
            ("https://example.com/f", ObjectStoreScheme::Http, "f"),
        ] {
            let loc = parse(url).unwrap();
            assert_eq!(loc.scheme, scheme, "{url}");
            assert_eq!(loc.path.as_ref(), key, "{url}");
            assert!(is_remote_url(url));
        }
    }

    #[test]
    fn refuses_malformed_and_local_urls() {
        for url in [
            "s3:/bucket",
            "not a url",
            "file:///tmp/x",
            "memory:///x",
            "s3://bucket",
            "s3://bucket/k#1",
            "s3://bucket/k?versionId=1",
            "gs://bucket/dir/?x",
            "https://host/k#1",
            // Keys a URL parser or an object path would change into another key.
            "s3://bucket/k/",
            "s3://bucket/a/../k",
            "s3://bucket/a/%2E%2E/k",
            "s3://bucket/./k",
            "s3://bucket/a//k",
            "s3://bucket/k ",
            "s3://bucket/ta\tb",
            "s3://bucket/k\n",
            "gs://bucket/k\0",
            "az://container/k/",
            "s3://user:secret@bucket/k",
            "s3://bucket:99/k",
        ] {
            match parse(url) {
                Err(Error::InvalidArgument(msg)) => {
                    // Named as written, but for a password.
                    assert!(msg.contains(&format!("{:?}", redacted(url))), "{msg}")
                }
                other => panic!("{url:?}: {other:?}"),
            }
        }
        assert!(!is_remote_url("/tmp/x"));
        assert!(!is_remote_url("relative/s3://x"));
        // Keys kept as written: encoded spaces and dots, dots inside a segment; a listing's
        // trailing '/'; an http(s) URL's path, which a server resolves as URLs do.
        for url in [
            "s3://b/a%20b",
            "s3://b/a%2Fb",
            "s3://b/.hidden",
            "s3://b/v1..2",
            "s3://b/k...",
        ] {
            assert!(parse(url).is_ok(), "{url}");
        }
        assert!(parse_prefix("s3://b/dir/").is_ok());
        assert!(parse_prefix("s3://b/").is_ok());
        assert!(parse("https://host/a/../k").is_ok());
    }
}
