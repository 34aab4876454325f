//! Moving a file's bytes: its data extents (holes skipped), cut into windows copied through memory
//! on the two devices' pools, or into segments the kernel copies with `copy_file_range` on the
//! copy's own threads.
//!
//! It moves bytes only: names, metadata and the decision which way to copy belong to the caller.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::ring::{Ring, Window};
use super::Copier;
use crate::error::{Error, Op, Result};
use crate::file::File;
use crate::pool::IoFuture;
use crate::sys;

impl Copier<'_> {
    /// Copies the extents through memory: windows read on the source's pool and written on the
    /// destination's, up to `depth` windows in flight. Returns the bytes moved.
    pub(super) fn copy_rw(
        &self,
        src: &File,
        out: &File,
        extents: &[(u64, u64)],
        ring: &mut Ring,
    ) -> Result<u64> {
        let mut windows = windows(extents, self.window as u64);
        let mut next = windows.next();
        let mut reads: VecDeque<(u64, usize, IoFuture<Window>)> = VecDeque::new();
        let mut writes: VecDeque<(usize, IoFuture<Window>)> = VecDeque::new();
        let mut moved = 0u64;
        let result = loop {
            // Finished writes give their windows back.
            let mut failed = None;
            while writes.front().is_some_and(|(_, f)| f.is_done()) {
                let Some((len, f)) = writes.pop_front() else {
                    break;
                };
                let (r, w) = f.into_buffer();
                ring.give(w);
                match r {
                    Ok(_) => {
                        moved += len as u64;
                        self.progress.add_bytes(len as u64);
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                break Err(e);
            }
            if self.cancelled() {
                break Err(Error::Cancelled);
            }
            while reads.len() + writes.len() < self.depth {
                let Some((off, len)) = next else {
                    break;
                };
                let w = match ring.take(len) {
                    Ok(w) => w,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                };
                reads.push_back((off, len, src.pread(w, off)));
                next = windows.next();
            }
            if let Some(e) = failed {
                break Err(e);
            }
            if let Some((off, len, f)) = reads.pop_front() {
                let (r, w) = f.into_buffer();
                match r {
                    Ok(n) if n == len => writes.push_back((len, out.pwrite(w, off))),
                    Ok(n) => {
                        ring.give(w);
                        break Err(shrank(src.path(), off + n as u64));
                    }
                    Err(e) => {
                        ring.give(w);
                        break Err(e);
                    }
                }
            } else if let Some((len, f)) = writes.pop_front() {
                let (r, w) = f.into_buffer();
                ring.give(w);
                match r {
                    Ok(_) => {
                        moved += len as u64;
                        self.progress.add_bytes(len as u64);
                    }
                    Err(e) => break Err(e),
                }
            } else {
                break Ok(moved);
            }
        };
        if result.is_err() {
            // Stop what has not started, wait for what has, and keep the windows.
            for (_, _, f) in &reads {
                f.cancel();
            }
            for (_, f) in &writes {
                f.cancel();
            }
            for (_, _, f) in reads {
                ring.give(f.into_buffer().1);
            }
            for (_, f) in writes {
                ring.give(f.into_buffer().1);
            }
        }
        result
    }

    /// Copies `src` into `out` by plain sequential reads until end of file, for a source whose
    /// size says 0: procfs and sysfs files report 0 yet have content, generated as it is read
    /// (and small). An empty regular file costs one read. Returns the bytes moved.
    pub(super) fn copy_to_eof(&self, src: &File, out: &fs::File, dst: &Path) -> Result<u64> {
        let mut buf = vec![0u8; TO_EOF_CHUNK];
        let mut moved = 0u64;
        loop {
            if self.cancelled() {
                return Err(Error::Cancelled);
            }
            // SAFETY: `buf` is an owned vector of `buf.len()` bytes, alive for the call.
            let n = unsafe { sys::pread_full(src.as_fd(), buf.as_mut_ptr(), buf.len(), moved) }
                .map_err(|e| Error::io(Op::Read, src.path(), moved, buf.len() as u64, e))?;
            if n == 0 {
                return Ok(moved);
            }
            out.write_all_at(&buf[..n], moved)
                .map_err(|e| Error::io(Op::Write, dst, moved, n as u64, e))?;
            moved += n as u64;
            self.progress.add_bytes(n as u64);
        }
    }

    /// Copies the extents with `copy_file_range` into `out`. Returns the bytes moved.
    ///
    /// The data is cut into up to `depth` contiguous segments (one per [`CFR_SEGMENT_MIN`] of
    /// data), copied at once, each by its own thread (this one for the first) as one sequential
    /// stream of window-sized calls through its own open file description of the source. The
    /// kernel copies through the page cache, whose readahead state belongs to the file
    /// description: one sequential reader per description keeps readahead running ahead of each
    /// segment. The calls block in the kernel and move no bytes through ferrio, so they run on
    /// the copy's own threads rather than as tasks on the device's pool, which was faster
    /// (measured: see benchmarks/RESULTS.md).
    pub(super) fn copy_cfr(
        &self,
        src: &File,
        out: &Arc<fs::File>,
        dst: &Path,
        extents: &[(u64, u64)],
    ) -> Result<u64> {
        let data: u64 = extents.iter().map(|&(start, end)| end - start).sum();
        let k = usize::try_from(data / CFR_SEGMENT_MIN)
            .unwrap_or(usize::MAX)
            .clamp(1, self.depth.max(1));
        let segments = split_extents(extents, k, self.window as u64);
        let readers = segment_readers(src, segments.len());
        let failed = AtomicBool::new(false);
        let copy = |seg: &[(u64, u64)], reader: &dyn AsFd| -> Result<u64> {
            let mut moved = 0;
            for &(start, end) in seg {
                let mut off = start;
                while off < end {
                    if self.cancelled() || failed.load(Ordering::Relaxed) {
                        return Err(Error::Cancelled);
                    }
                    let len = (end - off).min(self.window as u64);
                    let n = sys::copy_file_range(reader.as_fd(), off, out.as_fd(), off, len)
                        .map_err(|e| Error::io(Op::Copy, dst, off, len, e))?;
                    self.progress.add_bytes(n);
                    moved += n;
                    if n < len {
                        return Err(shrank(src.path(), off + n));
                    }
                    off += n;
                }
            }
            Ok(moved)
        };
        let outcomes: Vec<Result<u64>> = std::thread::scope(|s| {
            let copy = &copy;
            let failed = &failed;
            let helpers: Vec<_> = segments[1..]
                .iter()
                .zip(&readers[1..])
                .map(|(seg, reader)| {
                    s.spawn(move || {
                        let r = copy(seg, &**reader);
                        failed.fetch_or(r.is_err(), Ordering::Relaxed);
                        r
                    })
                })
                .collect();
            let first = copy(&segments[0], &*readers[0]);
            failed.fetch_or(first.is_err(), Ordering::Relaxed);
            std::iter::once(first)
                .chain(helpers.into_iter().map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::InvalidArgument("a copy thread panicked".into()))
                    })
                }))
                .collect()
        });
        // The first real error; `Cancelled` only if that is all there is (the user's cancel, or
        // segments stopped because another failed).
        let mut moved = 0;
        let mut cancelled = None;
        for outcome in outcomes {
            match outcome {
                Ok(n) => moved += n,
                Err(Error::Cancelled) => cancelled = Some(Error::Cancelled),
                Err(e) => return Err(e),
            }
        }
        cancelled.map_or(Ok(moved), Err)
    }
}

/// Bytes of data per `copy_file_range` segment of one file, at least (smaller files are one
/// sequential stream).
const CFR_SEGMENT_MIN: u64 = 64 << 20;

/// Bytes per read of [`Copier::copy_to_eof`]: procfs and sysfs files fit in one or a few.
const TO_EOF_CHUNK: usize = 64 << 10;

/// The extents cut into `k` contiguous parts of about equal data, cut at multiples of `unit`
/// (at least one part, none empty).
fn split_extents(extents: &[(u64, u64)], k: usize, unit: u64) -> Vec<Vec<(u64, u64)>> {
    let data: u64 = extents.iter().map(|&(start, end)| end - start).sum();
    let share = data.div_ceil(k.max(1) as u64).div_ceil(unit.max(1)) * unit.max(1);
    let mut parts = vec![Vec::new()];
    let mut room = share;
    for &(mut start, end) in extents {
        while start < end {
            if room == 0 {
                parts.push(Vec::new());
                room = share;
            }
            let stop = end.min(start + room);
            parts
                .last_mut()
                .expect("one part at least")
                .push((start, stop));
            room -= stop - start;
            start = stop;
        }
    }
    parts
}

/// `n` descriptors to read the source through: the source's own for the first, fresh opens of
/// the same open file (through `/proc/self/fd`, so no other file can take its place) for the
/// others, each with its own readahead state. Where `/proc` is missing they share the source's.
fn segment_readers(src: &File, n: usize) -> Vec<Arc<dyn AsFd + Send + Sync>> {
    let mut readers: Vec<Arc<dyn AsFd + Send + Sync>> = vec![Arc::new(src.clone())];
    let again = PathBuf::from(format!("/proc/self/fd/{}", src.as_raw_fd()));
    for _ in 1..n {
        match sys::open(&again, libc::O_RDONLY, 0) {
            Ok(fd) => readers.push(Arc::new(fd)),
            Err(_) => readers.push(Arc::new(src.clone())),
        }
    }
    readers
}

/// The data extents `(start, end)` of `f` up to `size`, from `SEEK_DATA`/`SEEK_HOLE`; the whole
/// file where the file system does not track holes.
pub(super) fn data_extents(f: &File, size: u64) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut off = 0u64;
    let err = |off, e| Error::io(Op::Read, f.path(), off, 0, e);
    while off < size {
        let start = match sys::seek_data(f.as_fd(), off) {
            Ok(Some(s)) => s,
            Ok(None) => break,
            Err(e)
                if off == 0
                    && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) =>
            {
                return Ok(vec![(0, size)]);
            }
            Err(e) => return Err(err(off, e)),
        };
        if start >= size {
            break;
        }
        let hole = sys::seek_hole(f.as_fd(), start).map_err(|e| err(start, e))?;
        let end = if hole <= start { size } else { hole.min(size) };
        out.push((start, end));
        off = end;
    }
    Ok(out)
}

/// The extents cut into windows of at most `window` bytes.
fn windows(extents: &[(u64, u64)], window: u64) -> impl Iterator<Item = (u64, usize)> + '_ {
    extents.iter().flat_map(move |&(start, end)| {
        let n = (end - start).div_ceil(window);
        (0..n).map(move |k| {
            let off = start + k * window;
            (off, (end - off).min(window) as usize)
        })
    })
}

/// The error for a source that ended before the size it had when its copy started.
pub(super) fn shrank(path: &Path, at: u64) -> Error {
    Error::io(
        Op::Read,
        path,
        at,
        0,
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the source file shrank while it was being copied",
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_extents_in_order_in_about_equal_parts() {
        // Three extents, 1000 bytes of data, four parts cut at multiples of 10.
        let ext = [(0u64, 300u64), (500, 900), (1000, 1300)];
        let parts = split_extents(&ext, 4, 10);
        assert_eq!(
            parts,
            vec![
                vec![(0, 250)],
                vec![(250, 300), (500, 700)],
                vec![(700, 900), (1000, 1050)],
                vec![(1050, 1300)],
            ]
        );
        // Fewer parts than asked when the data runs out first; one part for k = 1 or no data.
        assert_eq!(split_extents(&[(0, 25)], 4, 10).len(), 3);
        assert_eq!(split_extents(&ext, 1, 4096), vec![ext.to_vec()]);
        assert_eq!(split_extents(&[], 3, 10), vec![Vec::<(u64, u64)>::new()]);
    }

    #[test]
    fn windows_cover_extents_exactly() {
        let ext = [(0u64, 10u64), (4096, 4096 + 25), (100, 100)];
        let w: Vec<_> = windows(&ext, 8).collect();
        assert_eq!(
            w,
            vec![(0, 8), (8, 2), (4096, 8), (4104, 8), (4112, 8), (4120, 1)]
        );
    }
}
