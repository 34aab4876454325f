//! Where things go: `cp`'s rules that turn the sources and the destination the caller named into
//! one destination path per source, the device a destination will be on (for scheduling), the
//! check that what is already at a destination may be replaced, and where a file's bytes land
//! when the destination is a symlink.
//!
//! It reads metadata only; it creates, writes and removes nothing.

use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::walk::Entry;
use super::{Copier, CopyOptions};
use crate::error::{Error, Result};

/// A source named by the caller and where it goes.
pub(super) struct Root {
    pub(super) src: PathBuf,
    pub(super) dst: PathBuf,
    pub(super) meta: Metadata,
}

/// Applies `cp`'s destination rules; every error here is the caller's (nothing copied yet).
pub(super) fn plan_roots(sources: &[PathBuf], dest: &Path, o: &CopyOptions) -> Result<Vec<Root>> {
    if sources.is_empty() {
        return Err(Error::InvalidArgument("no source to copy".into()));
    }
    let dest_is_dir = fs::metadata(dest).is_ok_and(|m| m.is_dir());
    if sources.len() > 1 && !dest_is_dir {
        return Err(Error::InvalidArgument(format!(
            "copying {} sources needs a directory as destination, and {} is not one",
            sources.len(),
            dest.display()
        )));
    }
    let trailing_slash = dest.as_os_str().as_bytes().ends_with(b"/");
    let mut roots: Vec<Root> = Vec::with_capacity(sources.len());
    for src in sources {
        let follow = o.follow_symlinks || !o.recursive;
        let meta = if follow {
            fs::metadata(src)
        } else {
            fs::symlink_metadata(src)
        }
        .map_err(|source| Error::Open {
            path: src.clone(),
            mode: "r".into(),
            // `file:///...`, `ftp://...`: say why such a "path" is not found.
            source: crate::file::unknown_scheme_hint(src, source),
        })?;
        let dst = if dest_is_dir && names_contents(src) {
            // `cp -r src/. dst`: the contents of `src` merge into `dst`, as in GNU cp.
            dest.to_path_buf()
        } else if dest_is_dir {
            dest.join(base_name(src)?)
        } else {
            dest.to_path_buf()
        };
        if meta.is_dir() {
            if !o.recursive {
                return Err(super::needs_recursive(src));
            }
            if !dest_is_dir && fs::symlink_metadata(&dst).is_ok() {
                return Err(Error::InvalidArgument(format!(
                    "cannot overwrite {}, which is not a directory, with directory {}",
                    dst.display(),
                    src.display()
                )));
            }
            if is_inside(src, &dst) {
                return Err(Error::InvalidArgument(format!(
                    "cannot copy directory {} into itself ({})",
                    src.display(),
                    dst.display()
                )));
            }
        } else if !dest_is_dir && trailing_slash {
            return Err(Error::InvalidArgument(format!(
                "{} is not a directory",
                dest.display()
            )));
        }
        // Two files named alike (`s1/n s2/n` into `out`): the second would replace the first's
        // copy. The same file given twice is copied once.
        if !meta.is_dir() {
            if let Some(earlier) = roots.iter().find(|r| r.dst == dst && !r.meta.is_dir()) {
                if (earlier.meta.dev(), earlier.meta.ino()) == (meta.dev(), meta.ino()) {
                    continue;
                }
                return Err(Error::InvalidArgument(format!(
                    "{} and {} would both be copied to {}",
                    earlier.src.display(),
                    src.display(),
                    dst.display()
                )));
            }
        }
        roots.push(Root {
            src: src.clone(),
            dst,
            meta,
        });
    }
    Ok(roots)
}

/// Whether `src` ends in `/.` (or is `.`): it names a directory's contents, not the directory.
fn names_contents(src: &Path) -> bool {
    let raw = src.as_os_str().as_bytes();
    raw == b"." || raw.ends_with(b"/.") || raw.ends_with(b"/./")
}

/// The last component of `src`, resolving `.`, `..` and `/`-ended paths as `cp` does.
fn base_name(src: &Path) -> Result<OsString> {
    if let Some(name) = src.file_name() {
        if !src.as_os_str().as_bytes().ends_with(b"/..") && src.as_os_str() != ".." {
            return Ok(name.to_os_string());
        }
    }
    let canon = fs::canonicalize(src).map_err(|source| Error::Fs {
        action: "resolve",
        path: src.to_path_buf(),
        source,
    })?;
    canon
        .file_name()
        .map(|n| n.to_os_string())
        .ok_or_else(|| Error::InvalidArgument(format!("cannot copy {} by name", src.display())))
}

/// Whether `dst` (which may not exist yet) is `dir` or lies inside it. Directories are compared
/// by identity (device and inode), not by name: a bind mount shows one directory under two
/// names that no resolution of symlinks makes equal.
fn is_inside(dir: &Path, dst: &Path) -> bool {
    let Ok(dir) = fs::metadata(dir) else {
        return false;
    };
    let dst = match fs::canonicalize(dst) {
        Ok(d) => d,
        Err(_) => {
            let parent = match dst.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let (Ok(parent), Some(name)) = (fs::canonicalize(parent), dst.file_name()) else {
                return false;
            };
            parent.join(name)
        }
    };
    dst.ancestors()
        .any(|a| fs::metadata(a).is_ok_and(|m| m.dev() == dir.dev() && m.ino() == dir.ino()))
}

impl Copier<'_> {
    /// What is at the destination now; an error if it cannot be replaced by a file or link.
    pub(super) fn existing_dest(&self, e: &Entry) -> Result<Option<Metadata>> {
        let existing = match fs::symlink_metadata(&e.dst) {
            Ok(m) => Some(m),
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(Error::Fs {
                    action: "stat",
                    path: e.dst.clone(),
                    source,
                })
            }
        };
        let Some(m) = &existing else {
            return Ok(None);
        };
        if m.is_dir() {
            return Err(Error::Fs {
                action: "cannot replace a directory with a non-directory:",
                path: e.dst.clone(),
                source: io::Error::from_raw_os_error(libc::EISDIR),
            });
        }
        let target = if m.file_type().is_symlink() {
            fs::metadata(&e.dst).ok()
        } else {
            Some(m.clone())
        };
        if let Some(m) = target {
            if m.dev() == e.meta.dev() && m.ino() == e.meta.ino() {
                return Err(Error::SameFile {
                    src: e.src.clone(),
                    dst: e.dst.clone(),
                });
            }
        }
        Ok(existing)
    }
}

/// Where a regular file's copy is renamed to, given what is at its destination `dst` now.
///
/// As with GNU cp: a symlink to a file is written through (the copy replaces the link's target,
/// and the link stays); a dangling symlink is refused rather than followed into a new file; an
/// existing file this process may not write is refused, because renaming over it would replace
/// a file whose permissions forbid writing it. Local copies and downloads both ask here.
pub(super) fn write_target(dst: &Path, existing: Option<&Metadata>) -> Result<PathBuf> {
    let Some(existing) = existing else {
        return Ok(dst.to_path_buf());
    };
    let target = if existing.file_type().is_symlink() {
        match fs::canonicalize(dst) {
            Ok(t) => t,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                return Err(Error::Fs {
                    action: "not writing through dangling symlink",
                    path: dst.to_path_buf(),
                    source: err,
                })
            }
            Err(source) => {
                return Err(Error::Fs {
                    action: "resolve symlink",
                    path: dst.to_path_buf(),
                    source,
                })
            }
        }
    } else {
        dst.to_path_buf()
    };
    // A device, FIFO or socket is not a file to replace: renaming over it would swap the node
    // itself (`/dev/null`, a disk) for a regular file. GNU cp writes into it instead, which a
    // copy through a temporary name cannot do, so it is refused.
    if let Ok(m) = fs::metadata(&target) {
        let t = m.file_type();
        let kind = if t.is_char_device() {
            Some("not replacing character device")
        } else if t.is_block_device() {
            Some("not replacing block device")
        } else if t.is_fifo() {
            Some("not replacing FIFO")
        } else if t.is_socket() {
            Some("not replacing socket")
        } else {
            None
        };
        if let Some(action) = kind {
            return Err(Error::Fs {
                action,
                path: dst.to_path_buf(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a copy replaces regular files only",
                ),
            });
        }
    }
    let refused = crate::sys::write_refused(&target).map_err(|source| Error::Fs {
        action: "check write permission of",
        path: target.clone(),
        source,
    })?;
    if let Some(source) = refused {
        let action = if source.raw_os_error() == Some(libc::EROFS) {
            "cannot replace a file on a read-only file system:"
        } else {
            "cannot replace a file this user may not write:"
        };
        return Err(Error::Fs {
            action,
            path: dst.to_path_buf(),
            source,
        });
    }
    Ok(target)
}

/// `st_dev` of the closest existing ancestor of `path` (of `path` itself if it exists).
pub(super) fn nearest_dev(path: &Path) -> u64 {
    let mut p = Some(path);
    while let Some(q) = p {
        let q = if q.as_os_str().is_empty() {
            Path::new(".")
        } else {
            q
        };
        if let Ok(m) = fs::metadata(q) {
            return m.dev();
        }
        p = q.parent();
    }
    0
}
