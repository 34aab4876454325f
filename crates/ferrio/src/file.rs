//! [`File`]: open modes, the buffered and `O_DIRECT` descriptors, and the parallel read and write
//! entry points. A request is planned into tasks ([`crate::plan`]) and queued on the file's
//! device pool ([`crate::pool`]); each task decides its own path (page cache or `O_DIRECT`,
//! [`crate::direct`]) and runs its syscalls through [`crate::sys`].

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::bounce;
use crate::buffer::{IoBuf, IoBufMut};
use crate::config::{DirectMode, Settings};
use crate::cuda::{self, DevicePtr, Memory};
use crate::direct::{self, DirectSupport};
use crate::error::{Error, Op, Result};
use crate::plan::{self, Task};
use crate::pool::{self, Completion, DevicePool, Direction, IoFuture, Request, Worker};
use crate::sys;

/// How a file is opened, in the words of `fopen`/Python's `open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `r`: read; the file must exist.
    Read,
    /// `r+`: read and write; the file must exist.
    ReadWrite,
    /// `w`: write; created, or truncated if it exists.
    Write,
    /// `w+`: read and write; created, or truncated if it exists.
    WriteRead,
    /// `a`: write at the end; created if missing. Offsets given to writes are ignored.
    Append,
    /// `a+`: read anywhere, write at the end; created if missing.
    AppendRead,
}

impl Mode {
    /// The accepted spellings, for error messages.
    pub const FORMS: &'static str = "r, r+, w, w+, a, a+ (a trailing or inner 'b' is allowed)";

    /// The mode's name, as it would be written to `open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "r",
            Mode::ReadWrite => "r+",
            Mode::Write => "w",
            Mode::WriteRead => "w+",
            Mode::Append => "a",
            Mode::AppendRead => "a+",
        }
    }

    /// Whether reads are allowed.
    pub fn readable(self) -> bool {
        !matches!(self, Mode::Write | Mode::Append)
    }

    /// Whether writes are allowed.
    pub fn writable(self) -> bool {
        self != Mode::Read
    }

    /// Whether writes go to the end of the file.
    pub fn appends(self) -> bool {
        matches!(self, Mode::Append | Mode::AppendRead)
    }

    fn flags(self) -> libc::c_int {
        match self {
            Mode::Read => libc::O_RDONLY,
            Mode::ReadWrite => libc::O_RDWR,
            Mode::Write => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            Mode::WriteRead => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
            Mode::Append => libc::O_WRONLY | libc::O_CREAT,
            Mode::AppendRead => libc::O_RDWR | libc::O_CREAT,
        }
    }

    /// Flags for the second, `O_DIRECT` descriptor: same access, never create or truncate.
    fn direct_flags(self) -> libc::c_int {
        let access = match self {
            Mode::Read => libc::O_RDONLY,
            Mode::Write | Mode::Append => libc::O_WRONLY,
            _ => libc::O_RDWR,
        };
        access | libc::O_DIRECT
    }
}

impl FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Mode> {
        let m: String = s.chars().filter(|&c| c != 'b').collect();
        Ok(match m.as_str() {
            "r" => Mode::Read,
            "r+" => Mode::ReadWrite,
            "w" => Mode::Write,
            "w+" => Mode::WriteRead,
            "a" => Mode::Append,
            "a+" => Mode::AppendRead,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "mode {s:?} is not one of {}",
                    Mode::FORMS
                )))
            }
        })
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-file choices, taken from the settings in force at open and overridable per file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Choices {
    task_size: u64,
    direct_read: DirectMode,
    direct_write: DirectMode,
    overread: bool,
}

/// Opens a [`File`] with options beyond its mode. Unset options come from
/// [`Settings::current`] at open.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    settings: Option<Settings>,
    task_size: Option<u64>,
    direct_read: Option<DirectMode>,
    direct_write: Option<DirectMode>,
    overread: Option<bool>,
}

impl OpenOptions {
    /// Options with everything taken from the settings in force.
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// Uses these settings instead of [`Settings::current`].
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = Some(settings);
        self
    }

    /// Bytes per task for this file.
    pub fn task_size(mut self, bytes: u64) -> Self {
        self.task_size = Some(bytes.max(1));
        self
    }

    /// `O_DIRECT` policy for reads of this file.
    pub fn direct_read(mut self, mode: DirectMode) -> Self {
        self.direct_read = Some(mode);
        self
    }

    /// `O_DIRECT` policy for writes to this file.
    pub fn direct_write(mut self, mode: DirectMode) -> Self {
        self.direct_write = Some(mode);
        self
    }

    /// Over-read: unaligned heads and tails read with `O_DIRECT` into scratch memory too.
    pub fn overread(mut self, on: bool) -> Self {
        self.overread = Some(on);
        self
    }

    /// Opens `path` with `mode` (`"r"`, `"r+"`, `"w"`, `"w+"`, `"a"`, `"a+"`).
    pub fn open(&self, path: impl AsRef<Path>, mode: &str) -> Result<File> {
        let mode: Mode = mode.parse()?;
        let settings = self.settings.clone().unwrap_or_else(Settings::current);
        let choices = Choices {
            task_size: self.task_size.unwrap_or(settings.task_size),
            direct_read: self.direct_read.unwrap_or(settings.direct_read),
            direct_write: self.direct_write.unwrap_or(settings.direct_write),
            overread: self.overread.unwrap_or(settings.direct_overread),
        };
        File::open_with(path.as_ref(), mode, choices, &settings)
    }
}

/// An open file whose reads and writes run in parallel on its device's worker pool.
///
/// `File` is cheap to clone (clones share the descriptors) and safe to use from many threads at
/// once. Reads at or past the end of the file return a short count, not an error.
#[derive(Clone)]
pub struct File {
    inner: Arc<Inner>,
    choices: Choices,
}

struct Inner {
    path: PathBuf,
    mode: Mode,
    fd: OwnedFd,
    direct_fd: Option<OwnedFd>,
    direct: DirectSupport,
    /// Set when a direct call was refused after open (some FUSE file systems): from then on the
    /// file goes through the page cache only.
    direct_refused: AtomicBool,
    /// Next append offset, for modes `a` and `a+`.
    append_at: Mutex<u64>,
    pool: Arc<DevicePool>,
    /// Whether the file lives on a block device (a local file system), not NFS/FUSE/tmpfs.
    local: bool,
    /// The settings at open (thread cap, bounce-ring sizes).
    settings: Settings,
}

/// A raw address that may cross to worker threads; the future it belongs to keeps it valid.
#[derive(Clone, Copy)]
struct Addr(usize);

impl File {
    /// Opens `path` with `mode` (`"r"`, `"r+"`, `"w"`, `"w+"`, `"a"`, `"a+"`) and the settings
    /// in force ([`Settings::current`]).
    pub fn open(path: impl AsRef<Path>, mode: &str) -> Result<File> {
        OpenOptions::new().open(path, mode)
    }

    /// Options for opening a file with per-file settings.
    pub fn options() -> OpenOptions {
        OpenOptions::new()
    }

    fn open_with(path: &Path, mode: Mode, choices: Choices, settings: &Settings) -> Result<File> {
        let open_err = |source| Error::Open {
            path: path.to_path_buf(),
            mode: mode.as_str().to_string(),
            source,
        };
        let fd = sys::open(path, mode.flags(), 0o666).map_err(open_err)?;
        let st = sys::fstat(fd.as_fd()).map_err(|e| Error::io(Op::Stat, path, 0, 0, e))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(open_err(std::io::Error::from_raw_os_error(libc::EISDIR)));
        }
        let wants_direct = (mode.readable() && choices.direct_read != DirectMode::Off)
            || (mode.writable() && choices.direct_write != DirectMode::Off);
        let (direct_fd, direct) = if !wants_direct {
            (
                None,
                DirectSupport::Unsupported {
                    reason: "turned off for this file".into(),
                },
            )
        } else {
            match sys::open(path, mode.direct_flags(), 0) {
                Ok(dfd) => {
                    let support = direct::discover(dfd.as_fd(), st.st_dev);
                    (Some(dfd), support)
                }
                Err(e) => (
                    None,
                    DirectSupport::Unsupported {
                        reason: format!("the file system refused O_DIRECT: {e}"),
                    },
                ),
            }
        };
        let (pool, local) = pool::pool_for_device(st.st_dev, settings);
        Ok(File {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                mode,
                fd,
                direct_fd,
                direct,
                direct_refused: AtomicBool::new(false),
                append_at: Mutex::new(st.st_size as u64),
                pool,
                local,
                settings: settings.clone(),
            }),
            choices,
        })
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The mode the file was opened with.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The file's current size in bytes.
    pub fn len(&self) -> Result<u64> {
        let st = sys::fstat(self.inner.fd.as_fd()).map_err(|e| self.err(Op::Stat, 0, 0, e))?;
        Ok(st.st_size as u64)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Whether and how `O_DIRECT` can be used on this file.
    pub fn direct_support(&self) -> DirectSupport {
        if self.inner.direct_refused.load(Ordering::Relaxed) {
            return DirectSupport::Unsupported {
                reason: "the file system refused an O_DIRECT transfer; using the page cache".into(),
            };
        }
        self.inner.direct.clone()
    }

    /// The `O_DIRECT` policy for reads of this file.
    pub fn direct_read(&self) -> DirectMode {
        self.choices.direct_read
    }

    /// The `O_DIRECT` policy for writes to this file.
    pub fn direct_write(&self) -> DirectMode {
        self.choices.direct_write
    }

    /// Bytes per task for this handle.
    pub fn task_size(&self) -> u64 {
        self.choices.task_size
    }

    /// A handle to the same open file whose requests use `bytes` per task (a per-call setting:
    /// `file.with_task_size(1 << 20).pread(buf, 0)`).
    pub fn with_task_size(&self, bytes: u64) -> File {
        File {
            inner: Arc::clone(&self.inner),
            choices: Choices {
                task_size: bytes.max(1),
                ..self.choices
            },
        }
    }

    /// The worker pool serving this file.
    pub fn pool(&self) -> &DevicePool {
        &self.inner.pool
    }

    /// Reads `buf.io_len()` bytes at `offset` into `buf` in parallel; the future owns the buffer
    /// until it is done ([`IoFuture::into_buffer`] gives it back).
    pub fn pread<B: IoBufMut>(&self, mut buf: B, offset: u64) -> IoFuture<B> {
        let (ptr, len) = (buf.io_ptr_mut(), buf.io_len());
        // SAFETY: `IoBufMut` guarantees `ptr..ptr+len` stays valid and in place while `buf`
        // lives, and the future owns `buf` until every task has returned.
        let completion = unsafe { self.start_read(ptr, len, offset) };
        match completion {
            Ok(c) => IoFuture::new(c, buf),
            Err(e) => IoFuture::failed(e, buf),
        }
    }

    /// Writes all of `buf` at `offset` in parallel (at the end of the file in append modes).
    ///
    /// A direct write of several tasks that ends past the end of the file first extends the
    /// file to its new length with one `fallocate` (see [`File::allocate`]): a full disk fails
    /// the write before any byte is written, and if the write fails later the file keeps its
    /// new length.
    pub fn pwrite<B: IoBuf>(&self, buf: B, offset: u64) -> IoFuture<B> {
        let (ptr, len) = (buf.io_ptr(), buf.io_len());
        // SAFETY: `IoBuf` guarantees `ptr..ptr+len` stays valid, unchanged and in place while
        // `buf` lives, and the future owns `buf` until every task has returned.
        let completion = unsafe { self.start_write(ptr, len, offset) };
        match completion {
            Ok(c) => IoFuture::new(c, buf),
            Err(e) => IoFuture::failed(e, buf),
        }
    }

    /// Reads `len` bytes at `offset` into memory at `ptr` in parallel.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes, and nothing else may access that memory,
    /// until the returned future has been waited on or dropped. The future must not be leaked
    /// (`mem::forget`) while the memory can be freed.
    pub unsafe fn pread_raw(&self, ptr: *mut u8, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        match unsafe { self.start_read(ptr, len, offset) } {
            Ok(c) => IoFuture::new(c, ()),
            Err(e) => IoFuture::failed(e, ()),
        }
    }

    /// Writes `len` bytes from memory at `ptr` at `offset` in parallel.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes, and the memory must not change, until the
    /// returned future has been waited on or dropped. The future must not be leaked.
    pub unsafe fn pwrite_raw(&self, ptr: *const u8, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        match unsafe { self.start_write(ptr, len, offset) } {
            Ok(c) => IoFuture::new(c, ()),
            Err(e) => IoFuture::failed(e, ()),
        }
    }

    /// Reads `len` bytes at `offset` into GPU memory at `dst`, in parallel: each worker reads
    /// into its pinned bounce buffers and copies them to the device on its own stream, so the
    /// read of one buffer overlaps the copy of the previous one. The future completes when the
    /// last copy has. The CUDA context comes from the pointer (several GPUs work). Fails with
    /// [`Error::CudaUnavailable`] without a driver and [`Error::InvalidArgument`] when `dst` is
    /// not device memory.
    ///
    /// # Safety
    /// `dst..dst+len` must be device (or managed) memory that stays allocated, and that nothing
    /// else writes, until the returned future has been waited on or dropped. The future must not
    /// be leaked.
    pub unsafe fn pread_device(&self, dst: DevicePtr, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        match unsafe { self.start_device(dst, len, offset, Direction::Read) } {
            Ok(c) => IoFuture::new(c, ()),
            Err(e) => IoFuture::failed(e, ()),
        }
    }

    /// Writes `len` bytes from GPU memory at `src` to the file at `offset`, in parallel: each
    /// worker copies chunks to its pinned bounce buffers on its own stream while it writes the
    /// previous chunk. Work on other streams that produces `src` must have finished first.
    ///
    /// # Safety
    /// `src..src+len` must be device (or managed) memory that stays allocated and unchanged until
    /// the returned future has been waited on or dropped. The future must not be leaked.
    pub unsafe fn pwrite_device(&self, src: DevicePtr, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        match unsafe { self.start_device(src, len, offset, Direction::Write) } {
            Ok(c) => IoFuture::new(c, ()),
            Err(e) => IoFuture::failed(e, ()),
        }
    }

    /// Reads into `buf` at `offset`, in parallel, and waits. Returns the bytes read: fewer than
    /// `buf.len()` only at end of file (0 past it).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        // SAFETY: `buf` is exclusively borrowed for this call and the future is waited on
        // (or dropped, which waits) before the borrow ends.
        unsafe { self.pread_raw(buf.as_mut_ptr(), buf.len(), offset) }.wait()
    }

    /// Writes all of `buf` at `offset`, in parallel, and waits. Returns `buf.len()`.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        // SAFETY: `buf` is borrowed for this call and the future is waited on (or dropped,
        // which waits) before the borrow ends.
        unsafe { self.pwrite_raw(buf.as_ptr(), buf.len(), offset) }.wait()
    }

    /// Flushes written data to the device (`fdatasync`).
    pub fn sync(&self) -> Result<()> {
        sys::fdatasync(self.inner.fd.as_fd()).map_err(|e| self.err(Op::Sync, 0, 0, e))
    }

    /// Reserves disk space for the first `len` bytes and makes the file at least that long
    /// (`fallocate`), so that a large write allocates its blocks once instead of as it goes.
    /// Returns `Ok(false)`, changing nothing, where the file system cannot preallocate.
    pub fn allocate(&self, len: u64) -> Result<bool> {
        self.check_mode(Op::Write)?;
        self.fallocate(0, len)
    }

    /// `fallocate` of `[offset, offset+len)`; `Ok(false)` where the file system cannot.
    fn fallocate(&self, offset: u64, len: u64) -> Result<bool> {
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

    /// Truncates or extends the file to `len` bytes.
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.check_mode(Op::Write)?;
        sys::ftruncate(self.inner.fd.as_fd(), len).map_err(|e| self.err(Op::Write, len, 0, e))?;
        if self.inner.mode.appends() {
            *self
                .inner
                .append_at
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = len;
        }
        Ok(())
    }

    fn err(&self, op: Op, offset: u64, len: u64, e: std::io::Error) -> Error {
        Error::io(op, &self.inner.path, offset, len, e)
    }

    fn check_mode(&self, op: Op) -> Result<()> {
        let ok = match op {
            Op::Read => self.inner.mode.readable(),
            _ => self.inner.mode.writable(),
        };
        if ok {
            Ok(())
        } else {
            Err(Error::BadMode {
                path: self.inner.path.clone(),
                mode: self.inner.mode.as_str().into(),
                op,
            })
        }
    }

    /// Alignment used to plan tasks: the direct-I/O offset alignment, at least a page, so that
    /// buffered heads and tails never share a page with a direct transfer of another task.
    fn plan_align(&self) -> u64 {
        let page = sys::page_size() as u64;
        match &self.inner.direct {
            DirectSupport::Available { offset_align, .. } => (*offset_align as u64).max(page),
            DirectSupport::Unsupported { .. } => page,
        }
    }

    fn plan(&self, offset: u64, len: usize) -> Result<Vec<Task>> {
        self.check_range(offset, len)?;
        Ok(plan::split(
            offset,
            len,
            self.choices.task_size,
            self.plan_align(),
        ))
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} + length {len} is past the largest file offset"
            )));
        }
        Ok(())
    }

    /// # Safety
    /// As [`File::pread_raw`].
    unsafe fn start_read(&self, ptr: *mut u8, len: usize, offset: u64) -> Result<Arc<Completion>> {
        self.check_mode(Op::Read)?;
        let tasks = self.plan(offset, len)?;
        let file = self.clone();
        let base = Addr(ptr as usize);
        let run = Box::new(move |w: &mut Worker, t: &Task| {
            let dst = (base.0 + t.buf_offset) as *mut u8;
            // SAFETY: the task's slice of the request's buffer lies inside `ptr..ptr+len`, which
            // the caller keeps valid and unaliased until the future is done; tasks never overlap.
            unsafe { file.read_task(w, dst, t) }
        });
        Ok(self.queue(self.request(tasks, offset, len, Direction::Read, run)))
    }

    /// # Safety
    /// As [`File::pwrite_raw`].
    unsafe fn start_write(
        &self,
        ptr: *const u8,
        len: usize,
        offset: u64,
    ) -> Result<Arc<Completion>> {
        self.check_mode(Op::Write)?;
        let offset = self.write_offset(offset, len);
        let tasks = self.plan(offset, len)?;
        self.extend_for_direct_write(offset, len, tasks.len())?;
        let file = self.clone();
        let base = Addr(ptr as usize);
        let run = Box::new(move |w: &mut Worker, t: &Task| {
            let src = (base.0 + t.buf_offset) as *const u8;
            // SAFETY: the task's slice lies inside `ptr..ptr+len`, which the caller keeps valid
            // and unchanged until the future is done.
            unsafe { file.write_task(w, src, t) }
        });
        Ok(self.queue(self.request(tasks, offset, len, Direction::Write, run)))
    }

    /// Plans and queues a transfer between the file and device memory.
    ///
    /// # Safety
    /// As [`File::pread_device`] / [`File::pwrite_device`].
    unsafe fn start_device(
        &self,
        ptr: DevicePtr,
        len: usize,
        offset: u64,
        direction: Direction,
    ) -> Result<Arc<Completion>> {
        let op = if direction == Direction::Read {
            Op::Read
        } else {
            Op::Write
        };
        self.check_mode(op)?;
        cuda::available()?;
        let context = match cuda::try_classify(ptr.0 as usize)? {
            Memory::Device { context, .. } => context,
            Memory::Host => {
                return Err(Error::InvalidArgument(format!(
                    "address {:#x} is not GPU memory (use the host-memory calls for it)",
                    ptr.0
                )))
            }
        };
        if ptr.checked_add(len).is_none() {
            return Err(Error::InvalidArgument("device range wraps around".into()));
        }
        let offset = if direction == Direction::Write {
            self.write_offset(offset, len)
        } else {
            offset
        };
        // A task spans the ring at least, so that inside it the read of one buffer overlaps the
        // copy of the one before, and several rings where the transfer is large enough.
        let ring_bytes =
            self.inner.settings.bounce_buffer_size * self.inner.settings.bounce_buffers as u64;
        self.check_range(offset, len)?;
        let min_task = self.choices.task_size.max(ring_bytes);
        let tasks = plan::split_guided(
            offset,
            len,
            min_task,
            plan::MAX_DEVICE_TASK.max(min_task),
            2 * self.inner.pool.width() as u64,
            self.plan_align(),
        );
        if direction == Direction::Write {
            self.extend_for_direct_write(offset, len, tasks.len())?;
        }
        let file = self.clone();
        let run = Box::new(move |w: &mut Worker, t: &Task| {
            let at = DevicePtr(ptr.0 + t.buf_offset as u64);
            let settings = &file.inner.settings;
            if direction == Direction::Read {
                // The last copies may still run when the task returns: the worker reads its
                // next task meanwhile, and the request completes once they have finished.
                let started = bounce::start_read_to_device(
                    context,
                    at,
                    t.len,
                    t.offset,
                    settings,
                    &mut |buf, off| {
                        let chunk = Task::at_buffer_start(off, buf.len());
                        // SAFETY: `buf` is the ring's pinned buffer, valid for `buf.len()` bytes.
                        unsafe { file.read_task(w, buf.as_mut_ptr(), &chunk) }
                    },
                );
                w.leave_running(
                    context.id(),
                    Box::new(move || bounce::finish_thread_ring(context)),
                );
                started
            } else {
                bounce::write_from_device(
                    context,
                    at,
                    t.len,
                    t.offset,
                    settings,
                    &mut |buf, off| {
                        let chunk = Task::at_buffer_start(off, buf.len());
                        // SAFETY: `buf` is the ring's pinned buffer, valid for `buf.len()` bytes.
                        unsafe { file.write_task(w, buf.as_ptr(), &chunk) }.map(|_| ())
                    },
                )
            }
        });
        // Device tasks never run inline: the caller's thread has no bounce ring to spare.
        let request = Request {
            inline_ok: false,
            ..self.request(tasks, offset, len, direction, run)
        };
        Ok(self.queue(request))
    }

    /// Before a direct write of several tasks that ends past the end of the file, allocates
    /// the part past the end in one `fallocate`, which also moves the end. Local file systems
    /// serialise direct writes that extend a file (each holds the inode lock until its I/O is
    /// done, so that the end moves in order), and allocate blocks write by write. Measured
    /// (2 GiB from host memory, then `fsync`, ext4 on the dev disk): 2.11–2.42 GiB/s after
    /// `fallocate` against 1.99–2.02 without at 4 threads, 1.61–1.73 against 1.31–1.35 at one;
    /// an `ftruncate` instead was slower (1.72–1.89). Where the file system cannot preallocate,
    /// nothing changes; a full disk (or quota) fails the write before it starts.
    fn extend_for_direct_write(&self, offset: u64, len: usize, tasks: usize) -> Result<()> {
        if tasks < 2
            || !self.inner.local
            || self.choices.direct_write == DirectMode::Off
            || self.direct().is_none()
        {
            return Ok(());
        }
        let end = offset + len as u64;
        let size = match sys::fstat(self.fd()) {
            Ok(st) => st.st_size as u64,
            Err(_) => return Ok(()),
        };
        if end <= size {
            return Ok(());
        }
        let from = offset.max(size);
        match self.fallocate(from, end - from) {
            Ok(_) => Ok(()),
            Err(e)
                if e.os_error()
                    .and_then(|e| e.raw_os_error())
                    .is_some_and(|c| c == libc::ENOSPC || c == libc::EDQUOT) =>
            {
                Err(e)
            }
            // Refused for another reason: the writes allocate as they go and report their own
            // errors.
            Err(_) => Ok(()),
        }
    }

    /// Most tasks of one write request running at once. Buffered writes to one file serialise
    /// on the inode's lock in local file systems, so more than two in flight only adds lock
    /// spinning (measured: 16 writers on the H200 burned 3.2 CPU-seconds per GiB); direct
    /// writes and file systems without a block device (NFS, FUSE) run on every thread.
    fn write_cap(&self) -> usize {
        if self.choices.direct_write == DirectMode::Off && self.inner.local {
            BUFFERED_WRITES_IN_FLIGHT
        } else {
            usize::MAX
        }
    }

    fn cap_for(&self, direction: Direction) -> usize {
        match direction {
            Direction::Read => usize::MAX,
            Direction::Write => self.write_cap(),
        }
    }

    /// The offset a write of `len` bytes goes to: `offset`, or the end of the file in append
    /// modes (reserving the range, so concurrent appends do not overlap).
    fn write_offset(&self, offset: u64, len: usize) -> u64 {
        if !self.inner.mode.appends() {
            return offset;
        }
        let mut at = self
            .inner
            .append_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let start = *at;
        *at += len as u64;
        start
    }

    /// A request for `tasks` covering `[offset, offset+len)`, with its own completion: small
    /// ones may run inline, writes are capped as [`File::cap_for`] says.
    fn request(
        &self,
        tasks: Vec<Task>,
        offset: u64,
        len: usize,
        direction: Direction,
        run: Box<pool::TaskFn>,
    ) -> Request {
        Request {
            completion: Completion::new(offset, len, tasks.len()),
            tasks,
            direction,
            inline_ok: true,
            max_active: self.cap_for(direction),
            run,
        }
    }

    /// Queues `request` on the file's pool; returns its completion.
    fn queue(&self, request: Request) -> Arc<Completion> {
        let completion = Arc::clone(&request.completion);
        self.inner
            .pool
            .submit(request, self.inner.settings.max_threads);
        completion
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// The direct descriptor and its alignments, unless direct I/O is unavailable or refused.
    fn direct(&self) -> Option<(BorrowedFd<'_>, usize, u64)> {
        if self.inner.direct_refused.load(Ordering::Relaxed) {
            return None;
        }
        match (&self.inner.direct_fd, &self.inner.direct) {
            (
                Some(fd),
                DirectSupport::Available {
                    mem_align,
                    offset_align,
                    ..
                },
            ) => Some((
                fd.as_fd(),
                *mem_align as usize,
                (*offset_align as u64).max(1),
            )),
            _ => None,
        }
    }

    /// Reads one task into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `t.len` bytes.
    unsafe fn read_task(&self, w: &mut Worker, dst: *mut u8, t: &Task) -> Result<usize> {
        let buffered = |dst: *mut u8, off: u64, len: usize| -> Result<usize> {
            // SAFETY: callers pass sub-ranges of the task's memory.
            let n = unsafe { sys::pread_full(self.fd(), dst, len, off) }
                .map_err(|e| self.err(Op::Read, off, len as u64, e))?;
            self.inner.pool.count_path(false, n);
            Ok(n)
        };
        let Some((_, _, align)) = self.direct() else {
            return buffered(dst, t.offset, t.len);
        };
        if !direct::read_direct(self.choices.direct_read, self.fd(), t.offset, t.len) {
            return buffered(dst, t.offset, t.len);
        }
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
        self.inner.pool.count_path(true, done);
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
        self.inner.pool.count_path(false, n);
        Ok(n)
    }

    /// Writes one task from `src`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `t.len` bytes.
    unsafe fn write_task(&self, w: &mut Worker, src: *const u8, t: &Task) -> Result<usize> {
        let direct = self.direct().filter(|_| {
            direct::write_direct(
                self.choices.direct_write,
                self.inner.local,
                self.fd(),
                t.offset,
                t.len,
            )
        });
        let Some((_, _, align)) = direct else {
            // SAFETY: forwarded.
            unsafe { self.pwrite_buffered(src, t.offset, t.len)? };
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
        // SAFETY: forwarded.
        unsafe { sys::pwrite_full(self.fd(), src, len, off) }
            .map_err(|e| self.err(Op::Write, off, len as u64, e))?;
        self.inner.pool.count_path(false, len);
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
                Ok(()) => self.inner.pool.count_path(true, n),
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

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }
}

impl AsFd for File {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("path", &self.inner.path)
            .field("mode", &self.inner.mode)
            .field("direct", &self.inner.direct)
            .field("pool", &self.inner.pool.key())
            .finish()
    }
}

/// Tasks of one buffered write request to a local file that may run at once (see
/// `File::write_cap`).
const BUFFERED_WRITES_IN_FLIGHT: usize = 2;

/// Statistics of every worker pool started so far.
pub fn stats() -> Vec<pool::PoolStats> {
    pool::stats()
}
