//! The read path of a [`File`]: planning a host-memory read into tasks, and each task's choice
//! between the page cache and `O_DIRECT` (straight into the caller's memory, through the
//! worker's scratch buffer, or over-read), with the buffered fallback when direct I/O is refused.
//! Syscalls go through [`crate::sys`]; the policy (when to go direct) is [`crate::policy`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Addr, File};
use crate::config::FillReads;
use crate::error::{Op, Result};
use crate::plan::{self, Task};
use crate::policy::{self, ReadPath};
use crate::pool::{Completion, Direction, Worker};
use crate::sys;

impl File {
    /// Plans a read into host memory at `ptr` and queues it on the file's pool.
    ///
    /// # Safety
    /// As [`File::pread_raw`].
    pub(super) unsafe fn start_read(
        &self,
        ptr: *mut u8,
        len: usize,
        offset: u64,
    ) -> Result<Arc<Completion>> {
        self.check_mode(Op::Read)?;
        let fill = self.fill_shape(offset, len);
        let tasks = match fill {
            Some(shape) => self.plan_with(offset, len, shape.task_bytes)?,
            None => self.plan(offset, len)?,
        };
        let file = self.clone();
        let base = Addr(ptr as usize);
        let filling = fill.is_some();
        let run = Box::new(move |w: &mut Worker, t: &Task| {
            crate::topology::leave_gpu();
            let dst = (base.0 + t.buf_offset) as *mut u8;
            // SAFETY: the task's slice of the request's buffer lies inside `ptr..ptr+len`, which
            // the caller keeps valid and unaliased until the future is done; tasks never overlap.
            unsafe { file.read_task_of(filling, w, dst, t) }
        });
        let mut request = self.request(tasks, offset, len, Direction::Read, run);
        if let Some(shape) = fill {
            request.max_active = shape.in_flight;
        }
        Ok(self.queue(request))
    }

    /// Reads one task into `dst`: one of a read that fills the page cache (`filling`, planned
    /// by [`File::fill_shape`]) as `fill_reads` says, any other as [`File::read_task`].
    ///
    /// # Safety
    /// `dst` must be valid for writes of `t.len` bytes.
    pub(super) unsafe fn read_task_of(
        &self,
        filling: bool,
        w: &mut Worker,
        dst: *mut u8,
        t: &Task,
    ) -> Result<usize> {
        if !filling {
            // SAFETY: forwarded.
            return unsafe { self.read_task(w, dst, t) };
        }
        let map = self.populate_map();
        // A fill task is read through the page cache (`policy::fill_shape`): block by block,
        // each read into the cache by the kernel first where it can (`fill_reads=populate`),
        // then copied out. Between blocks it stops if its request was cancelled: a task is
        // 64 MiB, seconds on a slow file system, and Ctrl-C must not wait for it.
        let mut done = 0usize;
        while done < t.len {
            if w.cancelled() {
                return Err(crate::Error::Cancelled);
            }
            let off = t.offset + done as u64;
            let block_end = (off / sys::POPULATE_BLOCK + 1) * sys::POPULATE_BLOCK;
            let want = ((block_end - off) as usize).min(t.len - done);
            if let Some(map) = map {
                // Only advice: the read below finds the file as it is, populated or not.
                let _ = map.populate(off, want);
            }
            // SAFETY: `done + want <= t.len`, inside `dst`'s bytes.
            let got = unsafe { self.pread_fallback(dst.add(done), off, want)? };
            done += got;
            if got < want {
                break;
            }
        }
        Ok(done)
    }

    /// How a cold read of this file that fills the page cache would read (one of at least
    /// `fill_task_size`): `None` where none does (the file bypasses the cache, or
    /// `direct_read=on`); never `Auto`, which is `Populate` or `Readahead` by then; `Readahead`
    /// under `fill_reads=populate` where the kernel cannot map the file for it (another file
    /// system than a local one, say).
    pub fn fill_reads(&self) -> Option<FillReads> {
        if !self.inner.cache.keeps() || self.choices.direct_read == crate::DirectMode::On {
            return None;
        }
        Some(if self.populate_map().is_some() {
            FillReads::Populate
        } else {
            FillReads::Readahead
        })
    }

    /// The mapping for `fill_reads=populate` fills of a file on a local file system, made on
    /// first use; `None` where `fill_reads` is `readahead` on this machine
    /// ([`policy::fill_reads_here`]), elsewhere, or where the kernel cannot make one.
    fn populate_map(&self) -> Option<&sys::PopulateMap> {
        let here = policy::fill_reads_here(self.inner.settings.fill_reads);
        if here != FillReads::Populate || !self.inner.local {
            return None;
        }
        self.inner
            .populate
            .get_or_init(self.inner.opened_by, || {
                let size = sys::fstat(self.fd()).ok()?.st_size as u64;
                sys::PopulateMap::new(self.fd(), size).ok()
            })
            .as_ref()
    }

    /// Reads one task into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `t.len` bytes.
    pub(super) unsafe fn read_task(&self, w: &mut Worker, dst: *mut u8, t: &Task) -> Result<usize> {
        let buffered = |dst: *mut u8, off: u64, len: usize| -> Result<usize> {
            // SAFETY: callers pass sub-ranges of the task's memory.
            unsafe { self.pread_fallback(dst, off, len) }
        };
        // A file kept in the page cache reads through it (unless `direct_read=on`): it need not
        // open its direct descriptor to be told so.
        let direct = if policy::reads_may_go_direct(self.choices.direct_read, &self.inner.cache) {
            self.direct()
        } else {
            None
        };
        let path = policy::read_path(
            self.choices.direct_read,
            &self.inner.cache,
            direct.is_some(),
            self.fd(),
            t.offset,
            t.len,
        );
        let align = match (path, direct) {
            (ReadPath::Direct, Some((_, _, align))) => align,
            (ReadPath::BufferedThenDrop, _) => {
                let n = buffered(dst, t.offset, t.len)?;
                // The range was cold: nobody else had these pages, so dropping them leaves the
                // cache as it was. A failure only leaves them cached.
                let _ = sys::fadvise_dontneed(self.fd(), t.offset, t.len as u64);
                return Ok(n);
            }
            _ => return buffered(dst, t.offset, t.len),
        };
        if self.choices.overread {
            // SAFETY: forwarded: `dst` covers the task.
            return unsafe { self.read_overread(w, dst, t.offset, t.len) };
        }
        // An O_DIRECT read that crosses end of file may fill the rest of the caller's buffer
        // (past the count it returns) with whatever the last blocks hold: direct reads stop at
        // the last whole block of the file, and the bytes after it go through the page cache.
        let size = sys::fstat(self.fd())
            .map_err(|e| self.err(Op::Stat, t.offset, 0, e))?
            .st_size as u64;
        let direct_end = plan::align_down(size, align).clamp(t.offset, t.end());
        let mut parts = plan::direct_parts(t.offset, direct_end, align);
        parts.tail.end = t.end();
        let mut done = 0usize;
        for (range, direct) in [
            (parts.head, false),
            (parts.middle, true),
            (parts.tail, false),
        ] {
            let want = (range.end - range.start) as usize;
            if want == 0 {
                continue;
            }
            // SAFETY: `done` bytes precede this part in the task's memory; the part fits after.
            let at = unsafe { dst.add(done) };
            let got = if direct {
                // SAFETY: as above.
                unsafe { self.read_direct_range(w, at, range.start, want)? }
            } else {
                buffered(at, range.start, want)?
            };
            done += got;
            if got < want {
                break;
            }
        }
        Ok(done)
    }

    /// Reads the aligned range `[off, off+len)` with `O_DIRECT` into `dst`: straight into it when
    /// `dst` is aligned, else through the worker's scratch buffer.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    unsafe fn read_direct_range(
        &self,
        w: &mut Worker,
        dst: *mut u8,
        off: u64,
        len: usize,
    ) -> Result<usize> {
        let Some((_, mem_align, align)) = self.direct() else {
            // SAFETY: forwarded.
            return unsafe { self.pread_fallback(dst, off, len) };
        };
        if (dst as usize) % mem_align == 0 {
            // SAFETY: forwarded.
            return unsafe { self.pread_direct(dst, off, len) };
        }
        // Unaligned memory: through the worker's scratch buffer, which is what over-read does
        // (for an aligned range it widens nothing).
        debug_assert!(off % align == 0 && len as u64 % align == 0);
        // SAFETY: forwarded.
        unsafe { self.read_overread(w, dst, off, len) }
    }

    /// Over-read: the task's span widened to alignment is read with `O_DIRECT` into scratch
    /// memory and only the wanted bytes are copied out.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    unsafe fn read_overread(
        &self,
        w: &mut Worker,
        dst: *mut u8,
        off: u64,
        len: usize,
    ) -> Result<usize> {
        let Some((_, mem_align, align)) = self.direct() else {
            // SAFETY: forwarded.
            return unsafe { self.pread_fallback(dst, off, len) };
        };
        let Some(scratch) = w.scratch(mem_align.max(align as usize)) else {
            // SAFETY: forwarded.
            return unsafe { self.pread_fallback(dst, off, len) };
        };
        let end = off + len as u64;
        let span = plan::overread_span(off, end, align);
        let window = (scratch.len() as u64) / align * align;
        let mut pos = span.start;
        let mut copied = 0usize;
        while pos < span.end {
            let want = (span.end - pos).min(window) as usize;
            // SAFETY: scratch holds at least `window >= want` bytes.
            let got = unsafe { self.pread_direct(scratch.as_mut_ptr(), pos, want)? };
            let data_end = pos + got as u64;
            let from = pos.max(off);
            let to = data_end.min(end);
            if to > from {
                let n = (to - from) as usize;
                // SAFETY: `[from, to)` lies in both the scratch window and the caller's range.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        scratch.as_mut_ptr().add((from - pos) as usize),
                        dst.add((from - off) as usize),
                        n,
                    )
                };
                copied += n;
            }
            if got < want {
                break;
            }
            pos += want as u64;
        }
        Ok(copied)
    }

    /// One aligned `O_DIRECT` read of `len` bytes at `off` into aligned `dst`, until full or end of
    /// file. A short transfer that ends unaligned (the file's last partial block, or a file system
    /// that splits transfers) is finished through the page cache, which is always correct. A
    /// refusal (`EINVAL`) turns direct I/O off for this file and redoes the read buffered.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    unsafe fn pread_direct(&self, dst: *mut u8, off: u64, len: usize) -> Result<usize> {
        let Some((dfd, _, align)) = self.direct() else {
            // SAFETY: forwarded.
            return unsafe { self.pread_fallback(dst, off, len) };
        };
        // SAFETY: forwarded: `dst` is valid for `len` bytes.
        let (done, outcome) = unsafe { sys::pread_direct(dfd, dst, len, off, align) };
        self.pool().count_path(true, done);
        match outcome {
            Ok(()) => {}
            Err(e) if done == 0 && e.raw_os_error() == Some(libc::EINVAL) => {
                self.inner.direct_refused.store(true, Ordering::Relaxed);
                // SAFETY: forwarded.
                return unsafe { self.pread_fallback(dst, off, len) };
            }
            Err(e) => return Err(self.err(Op::Read, off + done as u64, (len - done) as u64, e)),
        }
        if done < len && (off + done as u64) % align != 0 {
            // SAFETY: the rest of the caller's memory.
            let rest =
                unsafe { self.pread_fallback(dst.add(done), off + done as u64, len - done)? };
            return Ok(done + rest);
        }
        Ok(done)
    }

    /// A buffered read, counted as such.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    unsafe fn pread_fallback(&self, dst: *mut u8, off: u64, len: usize) -> Result<usize> {
        // SAFETY: forwarded.
        let n = unsafe { sys::pread_full(self.fd(), dst, len, off) }
            .map_err(|e| self.err(Op::Read, off, len as u64, e))?;
        self.pool().count_path(false, n);
        Ok(n)
    }
}
