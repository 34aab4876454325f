//! Metadata of a copy: mode (the source's, less the umask unless preserved), owner and access and
//! modification times, set on directories by path and on files through their open handle.
//!
//! It never touches file data or names.

use std::fs::{self, Metadata};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::walk::Entry;
use super::Copier;
use crate::error::{Error, Result};
use crate::sys::{self, Timestamp};

impl Copier<'_> {
    pub(super) fn apply_dir_meta(&self, e: &Entry) -> Result<()> {
        let fs_err = |action: &'static str| {
            let path = e.dst.clone();
            move |source| Error::Fs {
                action,
                path,
                source,
            }
        };
        let mut mode = self.new_mode(&e.meta);
        if self.options.preserve && !self.chown_path(&e.dst, &e.meta)? {
            mode &= !0o6000;
        }
        fs::set_permissions(&e.dst, fs::Permissions::from_mode(mode))
            .map_err(fs_err("set permissions of"))?;
        if self.options.preserve {
            let (a, m) = times(&e.meta);
            sys::lutimens(&e.dst, a, m).map_err(fs_err("set times of"))?;
        }
        Ok(())
    }

    /// The mode a new copy of something with `meta` gets: the source's with `preserve`, else
    /// the source's permission bits less the umask (as `cp`).
    fn new_mode(&self, meta: &Metadata) -> u32 {
        if self.options.preserve {
            meta.mode() & 0o7777
        } else {
            meta.mode() & 0o777 & !self.umask
        }
    }

    /// `lchown` to the owner in `meta`; `Ok(false)` when not permitted (not root).
    pub(super) fn chown_path(&self, path: &Path, meta: &Metadata) -> Result<bool> {
        match std::os::unix::fs::lchown(path, Some(meta.uid()), Some(meta.gid())) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(false),
            Err(source) => Err(Error::Fs {
                action: "set owner of",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Owner, mode and (with `preserve`) times of the new file, through its open handle.
    pub(super) fn apply_file_meta(
        &self,
        f: &fs::File,
        e: &Entry,
        existing: Option<&Metadata>,
    ) -> Result<()> {
        let fs_err = |action: &'static str| {
            let path = e.dst.clone();
            move |source| Error::Fs {
                action,
                path,
                source,
            }
        };
        // Replacing a file without -p keeps that file's mode and owner, as cp (which writes into
        // it) does; through a symlink, the mode and owner of the file it names (replaced below).
        let followed = existing
            .filter(|m| m.file_type().is_symlink())
            .and_then(|_| fs::metadata(&e.dst).ok());
        let existing = followed
            .as_ref()
            .or(existing)
            .filter(|m| m.is_file() && !self.options.preserve);
        let (mut mode, owner) = match existing {
            Some(m) => (m.mode() & 0o7777, Some((m.uid(), m.gid()))),
            None if self.options.preserve => {
                (e.meta.mode() & 0o7777, Some((e.meta.uid(), e.meta.gid())))
            }
            None => (self.new_mode(&e.meta), None),
        };
        if let Some((uid, gid)) = owner {
            match std::os::unix::fs::fchown(f, Some(uid), Some(gid)) {
                Ok(()) => {}
                // Not root: keep our own owner, and drop set-id bits that would now be wrong.
                Err(err) if err.raw_os_error() == Some(libc::EPERM) => mode &= !0o6000,
                Err(source) => return Err(fs_err("set owner of")(source)),
            }
        }
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(fs_err("set permissions of"))?;
        if self.options.preserve {
            let (a, m) = times(&e.meta);
            sys::futimens(f.as_fd(), a, m).map_err(fs_err("set times of"))?;
        }
        Ok(())
    }
}

/// Access and modification times of `meta`.
pub(super) fn times(meta: &Metadata) -> (Timestamp, Timestamp) {
    (
        Timestamp {
            secs: meta.atime(),
            nanos: meta.atime_nsec(),
        },
        Timestamp {
            secs: meta.mtime(),
            nanos: meta.mtime_nsec(),
        },
    )
}
