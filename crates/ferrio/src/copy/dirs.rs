//! Destination directories: created owner-only, parents first, before anything goes into them,
//! and given their final mode (and, with `preserve`, owner and times) once they are full.
//!
//! Files and symlinks inside them are not its business.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use super::walk::{Entry, Kind};
use super::Copier;
use crate::error::Error;

impl Copier<'_> {
    /// Creates the destination directories, parents first. Returns which entries were created
    /// here (their final mode is set at the end) and the destinations that could not be made
    /// (nothing below them is tried).
    pub(super) fn make_dirs(&self, entries: &[Entry]) -> (Vec<bool>, Vec<PathBuf>) {
        let mut created = vec![false; entries.len()];
        let mut failed: Vec<PathBuf> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if e.kind != Kind::Dir || self.cancelled() {
                continue;
            }
            if failed.iter().any(|d| e.dst.starts_with(d)) {
                continue;
            }
            let outcome = match fs::symlink_metadata(&e.dst) {
                Ok(m) if m.is_dir() => Ok(false),
                Ok(_) => Err(Error::Fs {
                    action: "cannot replace a non-directory with a directory:",
                    path: e.dst.clone(),
                    source: io::Error::from_raw_os_error(libc::ENOTDIR),
                }),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    // Owner-only until its contents are in; the final mode is set last.
                    fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&e.dst)
                        .map(|()| true)
                        .map_err(|source| Error::Fs {
                            action: "create directory",
                            path: e.dst.clone(),
                            source,
                        })
                }
                Err(source) => Err(Error::Fs {
                    action: "stat",
                    path: e.dst.clone(),
                    source,
                }),
            };
            match outcome {
                Ok(new) => {
                    created[i] = new;
                    self.tally().dirs += 1;
                }
                Err(error) => {
                    failed.push(e.dst.clone());
                    self.fail(e, error);
                }
            }
        }
        (created, failed)
    }

    /// Sets directories' modes (and, with `preserve`, owners and times), children first, now
    /// that nothing more is written into them.
    ///
    /// After a cancel, a directory made here that is still empty is removed instead: a copy
    /// stopped by Ctrl-C leaves no empty tree behind (one with files in it stays, finished).
    pub(super) fn finish_dirs(&self, entries: &[Entry], created: &[bool]) {
        let cancelled = self.cancelled();
        for (i, e) in entries.iter().enumerate().rev() {
            if e.kind != Kind::Dir || !(created[i] || self.options.preserve) {
                continue;
            }
            // Children come first, so a tree of empty directories goes bottom up; a directory
            // that holds anything is not removed (`rmdir` refuses it).
            if cancelled && created[i] && fs::remove_dir(&e.dst).is_ok() {
                self.tally().dirs -= 1;
                continue;
            }
            if let Err(error) = self.apply_dir_meta(e) {
                self.fail(e, error);
            }
        }
    }
}
