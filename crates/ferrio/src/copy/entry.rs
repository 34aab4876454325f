//! One file or symlink copied from start to end: a temporary name next to the destination, the
//! data moved by the method that fits, flushed and verified when asked, metadata set, then the
//! rename into place, with the counts added to the report.
//!
//! It decides the order of the steps; the steps themselves live in their own files.

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::data::data_extents;
use super::meta::times;
use super::ring::Ring;
use super::temp::TempPath;
use super::walk::{Entry, Kind};
use super::{Copier, CopyMethod};
use crate::config::DirectMode;
use crate::error::{Error, Op, Result};
use crate::file::File;
use crate::sys;

impl Copier<'_> {
    pub(super) fn copy_entry(&self, e: &Entry, ring: &mut Ring) {
        let outcome = match e.kind {
            Kind::File => self.copy_file(e, ring).map(|done| {
                let mut t = self.tally();
                t.files += 1;
                t.bytes += done.bytes;
                t.bytes_cfr += done.bytes_cfr;
                t.verified += u64::from(done.verified);
                let r = t.devices.entry(done.src_pool).or_default();
                r.0 += done.bytes;
                let w = t.devices.entry(done.dst_pool).or_default();
                w.1 += done.bytes;
            }),
            Kind::Symlink => self.copy_symlink(e).map(|()| self.tally().symlinks += 1),
            Kind::Dir => Ok(()),
        };
        match outcome {
            Ok(()) => {}
            // A cancelled file is not an error of that file: the report says cancelled.
            Err(Error::Cancelled) if self.cancelled() => {}
            Err(error) => self.fail(e, error),
        }
        self.progress.files_done.fetch_add(1, Ordering::Relaxed);
    }

    fn copy_symlink(&self, e: &Entry) -> Result<()> {
        self.existing_dest(e)?;
        self.sweep_stale(&e.dst);
        let target = fs::read_link(&e.src).map_err(|source| Error::Fs {
            action: "read symlink",
            path: e.src.clone(),
            source,
        })?;
        let temp = TempPath::create(&e.dst, |p| std::os::unix::fs::symlink(&target, p))?;
        if self.options.preserve {
            self.chown_path(temp.path(), &e.meta)?;
            let (a, m) = times(&e.meta);
            sys::lutimens(temp.path(), a, m).map_err(|source| Error::Fs {
                action: "set times of",
                path: e.dst.clone(),
                source,
            })?;
        }
        temp.commit(&e.dst)
    }

    fn copy_file(&self, e: &Entry, ring: &mut Ring) -> Result<FileDone> {
        let existing = self.existing_dest(e)?;
        let target = super::dest::write_target(&e.dst, existing.as_ref())?;
        self.sweep_stale(&target);
        let mut created = None;
        let temp = TempPath::create(&target, |p| {
            let f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(p)?;
            created = Some(f);
            Ok(())
        })?;
        let handle = Arc::new(created.ok_or_else(|| Error::Fs {
            action: "create temporary file for",
            path: e.dst.clone(),
            source: io::Error::other("no file handle"),
        })?);
        let on_dst = |err: Error| repath(err, temp.path(), &e.dst);
        let dst_io = |op, offset, source| Error::io(op, &e.dst, offset, 0, source);
        let dst_dev = sys::fstat(handle.as_fd()).map_or(0, |st| st.st_dev);
        let try_cfr = match self.options.method {
            CopyMethod::ReadWrite => false,
            CopyMethod::CopyFileRange => true,
            // Where source and destination share a file system the kernel copies.
            CopyMethod::Auto => dst_dev == e.meta.dev(),
        };
        // Only descriptors that will be used are opened (a small file's copy is mostly opens):
        // no O_DIRECT source when the kernel copies, the copy opened as a `File` only when bytes
        // pass through memory or it is verified.
        let opts = File::options().settings(self.settings.clone());
        let src_opts = if try_cfr {
            opts.clone().direct_read(DirectMode::Off)
        } else {
            opts.clone()
        };
        let src = src_opts.open(&e.src, "r")?;
        let size = src.len()?;
        let extents = data_extents(&src, size)?;
        let data: u64 = extents.iter().map(|(s, end)| end - s).sum();
        let open_out = |mode: &str| {
            let o = opts.clone().direct_read(DirectMode::Off);
            o.open(temp.path(), mode).map_err(on_dst)
        };
        let mut bytes_cfr = 0;
        let mut out = None;
        // procfs says 0 for files that have content, sysfs 4096 whatever they hold: read those
        // to their end.
        let to_eof = size == 0 || sys::statfs::content_is_generated(&e.src);
        let moved = if to_eof {
            // Opened only for its pool, which the report credits with the bytes written.
            out = Some(open_out("r+")?);
            self.copy_to_eof(&src, &handle, &e.dst)?
        } else if try_cfr && data > 0 {
            match self.copy_cfr(&src, &handle, &e.dst, &extents) {
                Ok(n) => {
                    bytes_cfr = n;
                    n
                }
                Err(Error::Io {
                    op: Op::Copy,
                    source,
                    ..
                }) if sys::copy_unsupported(&source) => {
                    let o = out.insert(open_out("r+")?);
                    self.copy_rw(&src, o, &extents, ring).map_err(on_dst)?
                }
                Err(err) => return Err(on_dst(err)),
            }
        } else {
            let o = out.insert(open_out("r+")?);
            self.copy_rw(&src, o, &extents, ring).map_err(on_dst)?
        };
        if extents.last().map_or(0, |&(_, end)| end) < size {
            // A trailing hole: the data written so far ends before the file does.
            sys::ftruncate(handle.as_fd(), size).map_err(|err| dst_io(Op::Write, size, err))?;
        }
        if self.options.sync || self.options.verify {
            sys::fdatasync(handle.as_fd()).map_err(|err| dst_io(Op::Sync, 0, err))?;
        }
        let mut verified = false;
        if self.options.verify {
            // Drop the copy's pages so that the comparison reads what the device holds.
            let _ = sys::fadvise_dontneed(handle.as_fd(), 0, 0);
            let copy = opts.open(temp.path(), "r").map_err(on_dst)?;
            if to_eof {
                // Such content is made anew on each read (a clock, a counter): only the length
                // written can be checked.
                let len = copy.len().map_err(on_dst)?;
                if len != moved {
                    return Err(Error::io(
                        Op::Copy,
                        &e.dst,
                        len.min(moved),
                        0,
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("the copy has {len} bytes, {moved} were written"),
                        ),
                    ));
                }
            } else {
                self.verify_same(&src, &copy, size, ring).map_err(on_dst)?;
            }
            verified = true;
        }
        self.apply_file_meta(&handle, e, existing.as_ref())?;
        // What closing the copy says comes before it replaces anything: a network or FUSE file
        // system may report only then that its bytes did not reach storage.
        if let Some(o) = out.clone() {
            o.close().map_err(on_dst)?;
        }
        sys::close_checked(handle.as_fd()).map_err(|err| dst_io(Op::Close, 0, err))?;
        temp.commit(&target)?;
        self.progress.add_bytes(size.saturating_sub(data));
        let src_pool = src.pool().key().to_string();
        Ok(FileDone {
            bytes: moved,
            bytes_cfr,
            verified,
            // `copy_file_range` needs one file system, so one pool.
            dst_pool: out.map_or_else(|| src_pool.clone(), |o| o.pool().key().to_string()),
            src_pool,
        })
    }
}

/// The outcome of one file.
struct FileDone {
    bytes: u64,
    bytes_cfr: u64,
    verified: bool,
    src_pool: String,
    dst_pool: String,
}

/// Moves errors about the temporary file onto the destination's name, which the user knows.
fn repath(e: Error, temp: &Path, dst: &Path) -> Error {
    match e {
        Error::Io {
            op,
            path,
            offset,
            len,
            source,
        } if path == temp => Error::Io {
            op,
            path: dst.to_path_buf(),
            offset,
            len,
            source,
        },
        Error::Open { path, mode, source } if path == temp => Error::Open {
            path: dst.to_path_buf(),
            mode,
            source,
        },
        other => other,
    }
}
