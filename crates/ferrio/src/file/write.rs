//! The write path of a [`File`]: the offset a write goes to (append modes), preallocation before
//! a direct write that extends the file, how many tasks of a write run at once, and each task's
//! choice between the page cache and `O_DIRECT`, with the buffered fallback when direct I/O is
//! refused. Syscalls go through [`crate::sys`]; the policy (when to go direct) is
//! [`crate::policy`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::{Addr, Appends, File};
use crate::error::{Op, Result};
use crate::plan::{self, Task};
use crate::policy;
use crate::pool::{Completion, Direction, Worker};
use crate::sys;

/// The range an append goes to, reserved while the lock is held; see [`File::append_slot`].
pub(super) struct AppendSlot<'a> {
    appends: MutexGuard<'a, Appends>,
    /// Where the write goes.
    pub(super) offset: u64,
}

impl AppendSlot<'_> {
    /// Records the queued write of `len` bytes at the slot's offset, which the file's size may
    /// not show until `completion` is done.
    pub(super) fn queued(mut self, completion: &Arc<Completion>, len: usize) {
        self.appends.end = self.offset + len as u64;
        self.appends.running.push(Arc::downgrade(completion));
    }
}

/// Where a write moved the end of the file before it ran ([`File::extend_for_direct_write`]).
#[derive(Clone, Copy)]
pub(super) struct Extended {
    /// The size before.
    before: u64,
    /// The size it was given: the write's end.
    end: u64,
}

/// One write request among the file's writes ([`File::prepare_write`]), until it is done
/// ([`File::finish_write`]).
pub(super) struct WriteTicket {
    /// Its number among the writes started through the file.
    number: u64,
    /// No other write of the file was running when it started.
    alone: bool,
    /// Where it moved the end of the file, if it did.
    extended: Option<Extended>,
}

/// Tasks of one buffered write request to a local file that may run at once (see
/// `File::write_cap`).
const BUFFERED_WRITES_IN_FLIGHT: usize = 2;

impl File {
    /// Plans a write from host memory at `ptr` (at the end of the file in append modes) and
    /// queues it on the file's pool.
    ///
    /// # Safety
    /// As [`File::pwrite_raw`].
    pub(super) unsafe fn start_write(
        &self,
        ptr: *const u8,
        len: usize,
        offset: u64,
    ) -> Result<Arc<Completion>> {
        self.check_mode(Op::Write)?;
        let append = self.append_slot();
        let offset = append.as_ref().map_or(offset, |a| a.offset);
        let tasks = self.plan(offset, len)?;
        let ticket = self.prepare_write(offset, len, tasks.len())?;
        let file = self.clone();
        let base = Addr(ptr as usize);
        let run = Box::new(move |w: &mut Worker, t: &Task| {
            crate::topology::leave_gpu();
            let src = (base.0 + t.buf_offset) as *const u8;
            // SAFETY: the task's slice lies inside `ptr..ptr+len`, which the caller keeps valid
            // and unchanged until the future is done.
            unsafe { file.write_task(w, src, t) }
        });
        let completion = self.queue(self.request(tasks, offset, len, Direction::Write, run));
        self.finish_write(&completion, ticket);
        if let Some(append) = append {
            append.queued(&completion, len);
        }
        Ok(completion)
    }

    /// Counts a write request as started and running ([`WriteTicket`]); waits while a failed
    /// write of the file puts the end back (`shrink_back`), so that this one sees the size after.
    fn begin_write(&self) -> (u64, bool) {
        let inner = &self.inner;
        let alone = inner.writes_running.fetch_add(1, Ordering::SeqCst) == 0;
        let number = inner.writes_started.fetch_add(1, Ordering::SeqCst) + 1;
        // A forked child may have inherited the flag set by a thread it does not have.
        while inner.shrinking.load(Ordering::SeqCst) && inner.opened_by == sys::process_id() {
            std::thread::yield_now();
        }
        (number, alone)
    }

    /// Once the write of `ticket` is done: where it moved the end of the file
    /// ([`File::extend_for_direct_write`]) and then failed or was cancelled, puts the end back
    /// where it was (before its future resolves), if no other write of the file ran while it did
    /// and the size is still what it made it. The file would otherwise keep zeros it was never
    /// given, and appends would land after them. (Another handle or process writing into that
    /// range meanwhile is not seen: its bytes there would go with the undone end.)
    pub(super) fn finish_write(&self, completion: &Arc<Completion>, ticket: WriteTicket) {
        let file = self.clone();
        completion.on_done(Box::new(move |outcome| {
            if let (Err(_), Some(extended), true) = (outcome, ticket.extended, ticket.alone) {
                file.shrink_back(extended, ticket.number);
            }
            file.inner.writes_running.fetch_sub(1, Ordering::SeqCst);
        }));
    }

    /// Truncates the file back to `extended.before` if write `number` is still the last one
    /// started and the size is still `extended.end` (best effort).
    fn shrink_back(&self, extended: Extended, number: u64) {
        let inner = &self.inner;
        let last = || inner.writes_started.load(Ordering::SeqCst) == number;
        if !last()
            || inner
                .shrinking
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return;
        }
        // Checked again with the flag set: a write that starts from here on waits for it.
        if last() && sys::fstat(self.fd()).is_ok_and(|st| st.st_size as u64 == extended.end) {
            let _ = sys::ftruncate(self.fd(), extended.before);
        }
        inner.shrinking.store(false, Ordering::SeqCst);
    }

    /// In append modes, where the next write goes: the end of the file now, or past this
    /// handle's appends still running. The slot holds the handle's append lock until
    /// [`AppendSlot::queued`], so that appends from several threads take ranges one after
    /// another; a write that fails before it is queued reserves nothing.
    pub(super) fn append_slot(&self) -> Option<AppendSlot<'_>> {
        if !self.inner.mode.appends() {
            return None;
        }
        let mut appends = self.appends().lock().unwrap_or_else(|p| p.into_inner());
        appends
            .running
            .retain(|c| c.upgrade().is_some_and(|c| !c.is_done()));
        // Without a size (fstat failed) the handle's own end is the best guess.
        let size = self.len().unwrap_or(appends.end);
        let offset = if appends.running.is_empty() {
            size
        } else {
            size.max(appends.end)
        };
        Some(AppendSlot { appends, offset })
    }

    /// This handle's appends in this process: each forked process starts from a state of its
    /// own (the parent's appends still running are not the child's to wait for, and the
    /// parent's lock may have been held at the fork by a thread the child does not have).
    fn appends(&self) -> &std::sync::Mutex<Appends> {
        if self.inner.opened_by == sys::process_id() {
            &self.inner.appends
        } else {
            self.inner.forked_appends.get_or_init(sys::process_id(), Default::default)
        }
    }

    /// Before a write is queued: measures the device's writes where the policy needs that to
    /// choose the write's path ([`File::write_probe`]), then preallocates for a direct write
    /// that extends the file ([`File::extend_for_direct_write`]).
    /// The ticket of the write, to be handed to [`File::finish_write`] once it is queued.
    pub(super) fn prepare_write(
        &self,
        offset: u64,
        len: usize,
        tasks: usize,
    ) -> Result<WriteTicket> {
        // A write smaller than the probe itself does not pay for it: until a larger one has
        // measured the device, it goes as an unmeasured device's writes do (direct when cold).
        if len as u64 >= policy::WRITE_PROBE_MIN_WRITE {
            self.write_probe(offset + len as u64);
        }
        let (number, alone) = self.begin_write();
        match self.extend_for_direct_write(offset, len, tasks, (number, alone)) {
            Ok(extended) => Ok(WriteTicket {
                number,
                alone,
                extended,
            }),
            Err(e) => {
                self.inner.writes_running.fetch_sub(1, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// The device's write probe ([`policy::WriteProbe`]), measured now (once per process and
    /// device, in the file's directory) when a write ending at `end` needs it to choose between
    /// the page cache and `O_DIRECT`; else whatever was measured before, if anything.
    pub(super) fn write_probe(&self, end: u64) -> Option<policy::WriteProbe> {
        if self.inner.assumed_write_probe.is_some() {
            return self.inner.assumed_write_probe;
        }
        if !policy::write_needs_probe(
            self.choices.direct_write,
            &self.inner.cache,
            self.inner.local,
            self.direct_may_work(),
            end,
        ) {
            return self.measured_writes();
        }
        self.pool().write_probe(|| {
            let dir = match self.inner.path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => std::path::Path::new("."),
            };
            crate::direct::measure_writes(dir, self.inner.dev)
        })
    }

    /// Before a direct write of several tasks that ends past the end of the file, allocates
    /// the part past the end in one `fallocate`, which also moves the end. Local file systems
    /// serialise direct writes that extend a file (each holds the inode lock until its I/O is
    /// done, so that the end moves in order), and allocate blocks write by write; one
    /// `fallocate` first lets the writes run side by side and is faster than an `ftruncate`
    /// first (measured: see benchmarks/RESULTS.md). Where the file system cannot preallocate,
    /// nothing changes; a full disk (or quota) fails the write before it starts, and leaves the
    /// size as it was (a file system may keep what it could allocate, and move the end there).
    /// Returns where the end moved from and to, for [`File::undo_if_failed`].
    pub(super) fn extend_for_direct_write(
        &self,
        offset: u64,
        len: usize,
        tasks: usize,
        (number, alone): (u64, bool),
    ) -> Result<Option<Extended>> {
        let end = offset + len as u64;
        if tasks < 2
            || !self.inner.local
            || !self.writes_may_go_direct(end)
            || self.direct().is_none()
        {
            return Ok(None);
        }
        let size = match sys::fstat(self.fd()) {
            Ok(st) => st.st_size as u64,
            Err(_) => return Ok(None),
        };
        if end <= size {
            return Ok(None);
        }
        let from = offset.max(size);
        match self.fallocate(from, end - from) {
            Ok(true) => Ok(Some(Extended { before: size, end })),
            Ok(false) => Ok(None),
            Err(e)
                if e.os_error()
                    .and_then(|e| e.raw_os_error())
                    .is_some_and(|c| c == libc::ENOSPC || c == libc::EDQUOT) =>
            {
                if let Ok(st) = sys::fstat(self.fd()) {
                    let now = st.st_size as u64;
                    if alone && now > size && now <= end {
                        let extended = Extended {
                            before: size,
                            end: now,
                        };
                        self.shrink_back(extended, number);
                    }
                }
                Err(e)
            }
            // Refused for another reason: the writes allocate as they go and report their own
            // errors.
            Err(_) => Ok(None),
        }
    }

    /// `fallocate` of `[offset, offset+len)`; `Ok(false)` where the file system cannot.
    pub(super) fn fallocate(&self, offset: u64, len: u64) -> Result<bool> {
        match sys::fallocate(self.fd(), offset, len) {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(self.err(Op::Write, offset, len, e)),
        }
    }

    /// Most tasks of one write request running at once. Buffered writes to one file serialise
    /// on the inode's lock in local file systems, so more than two in flight only adds lock
    /// spinning and CPU time (measured: see benchmarks/RESULTS.md); direct writes and file
    /// systems without a block device (NFS, FUSE) run on every thread.
    pub(super) fn write_cap(&self, end: u64) -> usize {
        if !self.writes_may_go_direct(end) && self.inner.local {
            BUFFERED_WRITES_IN_FLIGHT
        } else {
            usize::MAX
        }
    }

    /// How a write of cold data to this file ending at `end` would go, and why (`ferrio info`):
    /// measures the device's writes first where the answer depends on them (once per process
    /// and device: 16 MiB written to an unnamed temporary file in the file's directory).
    pub fn describe_write(&self, end: u64) -> policy::WriteChoice {
        let probe = self.write_probe(end);
        policy::describe_write(
            self.choices.direct_write,
            &self.inner.cache,
            probe.as_ref(),
            self.inner.local,
            self.direct().is_some(),
            end,
        )
    }

    /// What the device's write probe measured (or a test assumed), if it has run.
    pub fn measured_writes(&self) -> Option<policy::WriteProbe> {
        self.inner
            .assumed_write_probe
            .or_else(|| self.pool().measured_writes())
    }

    /// Whether writes of this file ending at `end` may go direct ([`policy::writes_may_go_direct`]
    /// with the device's measured writes).
    fn writes_may_go_direct(&self, end: u64) -> bool {
        policy::writes_may_go_direct(
            self.choices.direct_write,
            &self.inner.cache,
            self.measured_writes().as_ref(),
            end,
        )
    }

    /// Writes one task from `src`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `t.len` bytes.
    pub(super) unsafe fn write_task(
        &self,
        w: &mut Worker,
        src: *const u8,
        t: &Task,
    ) -> Result<usize> {
        // The direct descriptor is opened only for a write that goes direct; where direct I/O
        // cannot work the range's cache residency is not asked.
        let goes_direct = || {
            policy::write_direct(
                self.choices.direct_write,
                &self.inner.cache,
                self.measured_writes().as_ref(),
                self.inner.local,
                self.fd(),
                t.offset,
                t.len,
            )
        };
        let direct = if self.direct_may_work() && goes_direct() {
            self.direct()
        } else {
            None
        };
        let Some((_, _, align)) = direct else {
            // An `auto` write that could have gone direct: its cost refines the device's verdict.
            let chosen = policy::write_needs_probe(
                self.choices.direct_write,
                &self.inner.cache,
                self.inner.local,
                self.direct_may_work(),
                t.end(),
            );
            // SAFETY: forwarded.
            let write = || unsafe { self.pwrite_buffered(src, t.offset, t.len) };
            if chosen {
                self.pool().time_buffered_write(t.len as u64, write)?;
            } else {
                write()?;
            }
            return Ok(t.len);
        };
        let parts = plan::direct_parts(t.offset, t.end(), align);
        let mut done = 0usize;
        for (range, direct) in [
            (parts.head, false),
            (parts.middle, true),
            (parts.tail, false),
        ] {
            let n = (range.end - range.start) as usize;
            if n == 0 {
                continue;
            }
            // SAFETY: `done` bytes precede this part in the task's memory.
            let at = unsafe { src.add(done) };
            if direct {
                // SAFETY: forwarded.
                unsafe { self.write_direct_range(w, at, range.start, n)? };
            } else {
                // SAFETY: forwarded.
                unsafe { self.pwrite_buffered(at, range.start, n)? };
            }
            done += n;
        }
        Ok(done)
    }

    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    unsafe fn pwrite_buffered(&self, src: *const u8, off: u64, len: usize) -> Result<()> {
        // Local file systems let one buffered write of a file run at a time (the inode's lock),
        // and a writer waiting there spins while the holder runs: 3.5 CPU-s/GiB for a save of
        // many tensors on the H100 machine (a request per tensor, each with its own cap). Taking
        // turns here first, the waiters sleep (in the process that opened the file: see
        // `Inner::buffered_write`).
        let turns = self.inner.local && self.inner.opened_by == sys::process_id();
        let _turn =
            turns.then(|| self.inner.buffered_write.lock().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: forwarded.
        unsafe { sys::pwrite_full(self.fd(), src, len, off) }
            .map_err(|e| self.err(Op::Write, off, len as u64, e))?;
        self.pool().count_path(false, len);
        Ok(())
    }

    /// Writes the aligned range with `O_DIRECT`, from `src` when it is aligned, else through the
    /// worker's scratch buffer; a refusal turns direct I/O off for this file and writes buffered.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    unsafe fn write_direct_range(
        &self,
        w: &mut Worker,
        src: *const u8,
        off: u64,
        len: usize,
    ) -> Result<()> {
        let Some((dfd, mem_align, align)) = self.direct() else {
            // SAFETY: forwarded.
            return unsafe { self.pwrite_buffered(src, off, len) };
        };
        let scratch = if (src as usize) % mem_align == 0 {
            None
        } else {
            w.scratch(mem_align.max(align as usize))
        };
        let window = scratch
            .as_ref()
            .map_or(len, |s| s.len() / align as usize * align as usize);
        let scratch_ptr = scratch.map(|s| s.as_mut_ptr());
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(window);
            // SAFETY: `src + done .. + n` is inside the caller's memory.
            let from = unsafe { src.add(done) };
            let data = match scratch_ptr {
                Some(p) => {
                    // SAFETY: scratch holds `window >= n` bytes; the source is the caller's.
                    unsafe { std::ptr::copy_nonoverlapping(from, p, n) };
                    p as *const u8
                }
                None => from,
            };
            // SAFETY: `data` is valid for `n` bytes (caller's memory or our scratch).
            match unsafe { sys::pwrite_full(dfd, data, n, off + done as u64) } {
                Ok(()) => self.pool().count_path(true, n),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.inner.direct_refused.store(true, Ordering::Relaxed);
                    // SAFETY: the rest of the caller's memory.
                    return unsafe { self.pwrite_buffered(from, off + done as u64, len - done) };
                }
                Err(e) => return Err(self.err(Op::Write, off + done as u64, n as u64, e)),
            }
            done += n;
        }
        Ok(())
    }
}
