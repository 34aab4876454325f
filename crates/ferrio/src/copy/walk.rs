//! The walk of the sources: every directory, file and symlink to copy, depth first with
//! children in name order, symlink loops refused.
//!
//! It only lists and stats the sources; it writes nothing.

use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::Copier;
use crate::error::Error;

/// What an entry of the walk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Dir,
    File,
    Symlink,
}

/// One thing to copy.
pub(super) struct Entry {
    pub(super) src: PathBuf,
    pub(super) dst: PathBuf,
    pub(super) meta: Metadata,
    pub(super) kind: Kind,
    /// Bytes to copy: the file's size (a block device's is the device's, not `stat`'s 0).
    pub(super) len: u64,
    /// Device of the destination's file system (of its root's parent), for scheduling.
    pub(super) dst_dev: u64,
}

impl Copier<'_> {
    /// Walks `src` depth first, children in name order, appending what to copy.
    pub(super) fn walk(
        &self,
        src: PathBuf,
        dst: PathBuf,
        meta: Metadata,
        dst_dev: u64,
        out: &mut Vec<Entry>,
        ancestors: &mut Vec<(u64, u64)>,
    ) {
        if self.cancelled() {
            return;
        }
        let ft = meta.file_type();
        let mut len = meta.len();
        let kind = if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_block_device() && ancestors.is_empty() {
            // Named as a source (not met inside a tree): its content is copied into a file, as
            // `cp /dev/sdb1 disk.img` does.
            match block_device_len(&src) {
                Ok(n) => len = n,
                Err(source) => {
                    let error = Error::Fs {
                        action: "open",
                        path: src.clone(),
                        source,
                    };
                    self.fail_paths(&src, &dst, error);
                    return;
                }
            }
            Kind::File
        } else {
            self.fail_paths(
                &src,
                &dst,
                Error::InvalidArgument(format!(
                    "{} is not a regular file, directory or symlink: not copied{}",
                    src.display(),
                    if ft.is_block_device() {
                        " (a block device is copied when named as a source)"
                    } else {
                        ""
                    }
                )),
            );
            return;
        };
        if kind != Kind::Dir {
            out.push(Entry {
                src,
                dst,
                meta,
                kind,
                len,
                dst_dev,
            });
            return;
        }
        let id = (meta.dev(), meta.ino());
        if ancestors.contains(&id) {
            let error = Error::Fs {
                action: "follow symlinks into a loop at",
                path: src.clone(),
                source: io::Error::from_raw_os_error(libc::ELOOP),
            };
            self.fail_paths(&src, &dst, error);
            return;
        }
        let names = match read_names(&src) {
            Ok(n) => n,
            Err(source) => {
                let error = Error::Fs {
                    action: "list directory",
                    path: src.clone(),
                    source,
                };
                self.fail_paths(&src, &dst, error);
                return;
            }
        };
        out.push(Entry {
            src: src.clone(),
            dst: dst.clone(),
            meta,
            kind,
            len,
            dst_dev,
        });
        ancestors.push(id);
        for name in names {
            let csrc = src.join(&name);
            let cdst = dst.join(&name);
            let cmeta = if self.options.follow_symlinks {
                // A dangling link cannot be followed: an error naming it, as `cp -rL` says
                // "cannot stat" (copying the link would break the promise of -L).
                fs::metadata(&csrc)
            } else {
                fs::symlink_metadata(&csrc)
            };
            match cmeta {
                Ok(m) => self.walk(csrc, cdst, m, dst_dev, out, ancestors),
                Err(source) => {
                    let error = Error::Fs {
                        action: "stat",
                        path: csrc.clone(),
                        source,
                    };
                    self.fail_paths(&csrc, &cdst, error);
                }
            }
        }
        ancestors.pop();
    }
}

/// The bytes a block device holds (`stat` says 0): where reading it ends.
fn block_device_len(path: &Path) -> io::Result<u64> {
    use std::os::fd::AsFd;
    crate::sys::block_device_size(fs::File::open(path)?.as_fd())
}

/// The names in a directory, sorted (so copies are made in a predictable order).
fn read_names(dir: &Path) -> io::Result<Vec<OsString>> {
    let mut names = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<Vec<_>>>()?;
    names.sort();
    Ok(names)
}
