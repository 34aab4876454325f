//! The objects under a prefix (`s3://bucket/dir/`, or a bucket's root), for copies of whole
//! trees: each one's key relative to the prefix, checked to be a safe relative path (no empty,
//! `.` or `..` component, no leading `/`), its size, and the URL that opens it.
//!
//! Only names and sizes are read here; the bytes are [`super::RemoteFile`]'s concern.

use futures::TryStreamExt;
use object_store::ObjectStoreScheme;

use crate::config::Settings;
use crate::error::{Error, Result};

use super::{runtime, store};

/// One object under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    /// Its key relative to the prefix, components joined by `/`; every component is a plain
    /// name (never empty, `.` or `..`), so it may be joined to a local directory safely.
    pub relative: String,
    /// Its size in bytes when listed.
    pub size: u64,
    /// The URL that opens it: the prefix's URL with the relative key appended.
    pub url: String,
    /// Its ETag when listed, if the store gave one.
    pub e_tag: Option<String>,
    /// Its version id when listed, if the store keeps versions.
    pub version: Option<String>,
}

/// Whether `url` names a store that can list its keys (not a plain `http(s)://` server).
pub(crate) fn can_list(url: &str) -> bool {
    store::parse_prefix(url).is_ok_and(|l| l.scheme != ObjectStoreScheme::Http)
}

/// Whether `part` may be one component of a local path: not empty, `.` or `..`, and holding no
/// `/` or NUL.
pub(crate) fn is_plain_name(part: &str) -> bool {
    !part.is_empty() && part != "." && part != ".." && !part.contains(['/', '\0'])
}

/// Bytes of a key's component that stand for themselves in a URL's path; every other byte is
/// percent-encoded, so that names holding `#`, `?`, `%` or spaces reach the store unchanged.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

/// `part` percent-encoded for one component of a URL's path.
pub(crate) fn encode_key_part(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for &b in part.as_bytes() {
        if is_unreserved(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `url` names a bucket or container and no key in it (`s3://bucket`, `az://container`):
/// a copy's destination then means the store's root, as `s3://bucket/` does.
pub(crate) fn names_a_store_only(url: &str) -> bool {
    super::store::parse_prefix(url).is_ok_and(|loc| {
        loc.scheme != object_store::ObjectStoreScheme::Http && loc.path.as_ref().is_empty()
    })
}

/// `url` ending in exactly one `/`, as a prefix that relative keys are appended to.
pub(crate) fn as_prefix(url: &str) -> String {
    format!("{}/", url.trim_end_matches('/'))
}

/// Lists every object whose key lies under the prefix `url` names (`s3://bucket/dir` and
/// `s3://bucket/dir/` both mean the keys `dir/...`; `s3://bucket/` the whole bucket), sorted by
/// key, with `settings`' timeouts and retries. Keys that end in `/` with no bytes (the
/// "directory" markers some tools create) are left out when other keys lie under them.
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed URL, an `http(s)://` URL (a server has no
/// listing), or a key under the prefix that is not a safe relative path (nothing may be copied
/// then); [`Error::Open`] naming the URL when the bucket does not exist (kind `NotFound`), may
/// not be listed (`PermissionDenied`) or cannot be reached.
pub fn list_prefix(url: &str, settings: &Settings) -> Result<Vec<ListedObject>> {
    list_prefix_until(url, settings, &|| false)
}

/// [`list_prefix`], given up as soon as `cancelled()` turns true ([`Error::Cancelled`]): a
/// listing of many pages, or one the store is slow to answer, must not hold up a Ctrl-C.
pub(crate) fn list_prefix_until(
    url: &str,
    settings: &Settings,
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<Vec<ListedObject>> {
    let location = store::parse_prefix(url)?;
    if location.scheme == ObjectStoreScheme::Http {
        return Err(Error::InvalidArgument(format!(
            "{}: http(s) servers cannot be listed; copy their objects one by one",
            store::redacted(url)
        )));
    }
    let store = store::build_with(&location, settings)?;
    let handle = runtime::handle()?;
    let prefix = location.path.clone();
    let listed = handle.block_on(runtime::unless_cancelled(
        async {
            let under = (!prefix.as_ref().is_empty()).then_some(&prefix);
            store.list(under).try_collect::<Vec<_>>().await
        },
        cancelled,
    ));
    let listed = listed.ok_or(Error::Cancelled)?;
    let listed = listed.map_err(|e| match e {
        object_store::Error::InvalidPath { source } => unsafe_key(url, &source.to_string()),
        // object_store reports a listing's 404 (S3's NoSuchBucket, say) as a generic error
        // holding the reply's XML; only the bucket can be missing for a listing.
        other if other.to_string().contains("404 Not Found") => Error::Open {
            path: url.into(),
            mode: "r".into(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such bucket or container",
            ),
        },
        other => Error::Open {
            path: url.into(),
            mode: "r".into(),
            source: store::io_error(other),
        },
    })?;
    let base = as_prefix(url);
    let mut objects = Vec::with_capacity(listed.len());
    for meta in listed {
        let Some(parts) = meta.location.prefix_match(&prefix) else {
            // The store answered with a key outside the prefix: not ours to copy.
            continue;
        };
        let parts: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
        if let Some(bad) = parts.iter().find(|p| !is_plain_name(p)) {
            return Err(unsafe_key(
                url,
                &format!("{:?} has the component {bad:?}", meta.location.as_ref()),
            ));
        }
        if parts.is_empty() {
            // The prefix itself is an object (`s3://b/dir` when `dir` is a key): not under it.
            continue;
        }
        let encoded: Vec<String> = parts.iter().map(|p| encode_key_part(p)).collect();
        objects.push(ListedObject {
            relative: parts.join("/"),
            size: meta.size,
            url: format!("{base}{}", encoded.join("/")),
            e_tag: meta.e_tag,
            version: meta.version,
        });
    }
    objects.sort_by(|a, b| a.relative.cmp(&b.relative));
    // A "directory" marker `dir/` lists as an empty object `dir` with other keys under it.
    let markers: Vec<usize> = (0..objects.len())
        .filter(|&i| objects[i].size == 0)
        .filter(|&i| {
            let under = format!("{}/", objects[i].relative);
            objects.iter().any(|o| o.relative.starts_with(&under))
        })
        .collect();
    for i in markers.into_iter().rev() {
        objects.remove(i);
    }
    Ok(objects)
}

/// Whether some object's key lies under the prefix `url` names (`s3://bucket/dir` asks for keys
/// `dir/...`): one listing page, read only as far as its first key. For messages only: any
/// failure (a store that may not be listed, a missing bucket) answers `false`.
pub(crate) fn holds_objects(url: &str, settings: &Settings) -> bool {
    let Ok(location) = store::parse_prefix(url) else {
        return false;
    };
    if location.scheme == ObjectStoreScheme::Http || location.path.as_ref().is_empty() {
        return false;
    }
    let (Ok(store), Ok(handle)) = (store::build_with(&location, settings), runtime::handle())
    else {
        return false;
    };
    handle.block_on(async {
        let mut listed = store.list(Some(&location.path));
        matches!(listed.try_next().await, Ok(Some(_)))
    })
}

fn unsafe_key(url: &str, why: &str) -> Error {
    Error::InvalidArgument(format!(
        "{url}: an object key under this prefix is not a safe relative path (an empty, '.' or \
         '..' component, or a leading '/') and would land outside the destination; nothing \
         was copied ({why})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_only() {
        for ok in ["a", "a.b", "..a", "a..", " x"] {
            assert!(is_plain_name(ok), "{ok:?}");
        }
        for bad in ["", ".", "..", "a/b", "/", "a\0"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn key_parts_survive_the_url() {
        for name in ["plain.bin", "a b#c?d%e", "ünï", "x+y=z"] {
            let url = format!("s3://bucket/dir/{}", encode_key_part(name));
            let loc = store::parse(&url).unwrap();
            assert_eq!(loc.path.as_ref(), format!("dir/{name}"), "{url}");
        }
        assert_eq!(as_prefix("s3://b/p"), "s3://b/p/");
        assert_eq!(as_prefix("s3://b/p//"), "s3://b/p/");
    }
}
