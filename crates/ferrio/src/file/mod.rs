//! [`File`]: opening (the buffered descriptor, the `O_DIRECT` one where it is used, the device
//! pool), the accessors, the public read and write entry points, and the plumbing every path
//! shares: planning a range into tasks ([`crate::plan`]) and queueing them on the file's pool
//! ([`crate::pool`]). The paths themselves live beside it: `read.rs`, `write.rs` and `device.rs`
//! (GPU memory); `mode.rs` parses open modes. Syscalls go through [`crate::sys`] only.

mod device;
mod forked;
mod mode;
mod read;
mod write;

pub use mode::Mode;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::buffer::{IoBuf, IoBufMut};
use crate::config::{CacheMode, DirectMode, Settings};
use crate::cuda::DevicePtr;
use crate::direct::{self, DirectSupport};
use crate::error::{Error, Op, Result};
use crate::plan::{self, Task};
use crate::policy::{self, CacheDecision};
use crate::pool::{self, Completion, DevicePool, Direction, IoFuture, Request};
use crate::sys;
use forked::PerProcess;

/// Per-file choices, taken from the settings in force at open and overridable per file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Choices {
    task_size: u64,
    cache: CacheMode,
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
    cache: Option<CacheMode>,
    /// Testing hook: the memory the policy sees instead of the machine's.
    assumed_memory: Option<u64>,
    /// Testing hook: the write probe the policy sees instead of the device's.
    assumed_write_probe: Option<policy::WriteProbe>,
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

    /// What the page cache holds after reads and writes of this file ([`crate::policy`]).
    pub fn cache(mut self, mode: CacheMode) -> Self {
        self.cache = Some(mode);
        self
    }

    /// Makes the cache policy see `bytes` of available memory instead of the machine's, so a
    /// test can open a small file "larger than memory".
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn assume_available_memory(mut self, bytes: u64) -> Self {
        self.assumed_memory = Some(bytes);
        self
    }

    /// Makes the write policy see `probe` instead of measuring the device (which happens once
    /// per process), so a test can take either path of an `auto` write.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn assume_write_probe(mut self, probe: policy::WriteProbe) -> Self {
        self.assumed_write_probe = Some(probe);
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
            cache: self.cache.unwrap_or(settings.cache),
            direct_read: self.direct_read.unwrap_or(settings.direct_read),
            direct_write: self.direct_write.unwrap_or(settings.direct_write),
            overread: self.overread.unwrap_or(settings.direct_overread),
        };
        let memory = self.assumed_memory.map(|b| policy::Memory {
            available: b,
            source: "assumed by a test".into(),
        });
        let assumed = Assumed {
            memory,
            write_probe: self.assumed_write_probe,
        };
        let path = local_path(path.as_ref())?;
        File::open_with(&path, mode, choices, &settings, assumed)
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
    /// What direct I/O would need of this file (its alignments), found at open through `fd`;
    /// `Unsupported` where the file's mode and settings never use it.
    direct: DirectSupport,
    /// The `O_DIRECT` descriptor, or why there is none: opened at the first direct transfer or
    /// question about it (at open for a file whose cold reads bypass the cache), so a file read
    /// and written through the page cache holds one descriptor.
    direct_fd: MadeOnce<std::result::Result<OwnedFd, String>>,
    /// Set when a direct call was refused after open (some FUSE file systems): from then on the
    /// file goes through the page cache only.
    direct_refused: AtomicBool,
    /// Write requests started through this file (any clone), and those not yet done: a write
    /// that moved the end of the file and then failed puts it back only where no other write
    /// of the file ran meanwhile (`File::shrink_back`).
    writes_started: AtomicU64,
    writes_running: AtomicUsize,
    /// Set while a failed write puts the end back: a write starting then waits for it.
    shrinking: AtomicBool,
    /// Where appends go, for modes `a` and `a+`, in the process that opened the file.
    appends: Mutex<Appends>,
    /// The same in each process forked from it (see [`File::appends`]): the parent's may have
    /// been held, at the fork, by a thread the child does not have.
    forked_appends: PerProcess<Mutex<Appends>>,
    /// Held by a buffered write to a local file while it runs (`File::pwrite_buffered`), in the
    /// process that opened the file only: a forked child may have inherited it held by a parent
    /// thread that the child does not have, so there its writes do not take turns.
    buffered_write: Mutex<()>,
    /// The process that opened the file ([`sys::process_id`]).
    opened_by: u32,
    /// The pool found at open. In a process forked after the open it belongs to the parent and
    /// is never used: [`File::current_pool`] finds the child's own.
    opened_pool: &'static Arc<DevicePool>,
    /// Whether the file lives on a block device (a local file system), not NFS/FUSE/tmpfs.
    local: bool,
    /// The device that holds the file's bytes.
    dev: libc::dev_t,
    /// A write probe assumed by a test (`OpenOptions::assume_write_probe`).
    assumed_write_probe: Option<policy::WriteProbe>,
    /// What the cache policy decided at open.
    cache: CacheDecision,
    /// The settings at open (thread cap, bounce-ring sizes).
    settings: Settings,
    /// The mapping that block-by-block cache fills go through (`fill_reads=populate`), made at
    /// the first such fill; `None` where the kernel cannot make one.
    populate: MadeOnce<Option<sys::PopulateMap>>,
}

/// Testing hook: milliseconds the making of a file's direct descriptor waits first, so that a
/// test can fork while one is half made.
#[cfg(feature = "testing")]
pub static DIRECT_OPEN_DELAY_MS: AtomicU64 = AtomicU64::new(0);

/// A part of an open file made at its first use, once per process: a process forked from the
/// one that opened the file (or from one of its forked children) uses the value made before the
/// fork where there is one, else makes its own (a value half made at the fork, by a thread the
/// new process does not have, would never be finished: waiting for it would block forever).
struct MadeOnce<T> {
    opener: OnceLock<T>,
    forked: PerProcess<T>,
}

impl<T> Default for MadeOnce<T> {
    fn default() -> Self {
        MadeOnce {
            opener: OnceLock::new(),
            forked: PerProcess::default(),
        }
    }
}

impl<T> MadeOnce<T> {
    /// The value, made by `make` if this process has none yet; `opened_by` is the process
    /// that opened the file.
    fn get_or_init(&self, opened_by: u32, make: impl FnOnce() -> T) -> &T {
        if let Some(made) = self.opener.get() {
            return made;
        }
        let here = sys::process_id();
        if opened_by == here {
            return self.opener.get_or_init(make);
        }
        match self.forked.any_made() {
            Some(made) => made,
            None => self.forked.get_or_init(here, make),
        }
    }

    /// The value, if this process has made it (or inherited it made).
    fn get(&self) -> Option<&T> {
        self.opener.get().or_else(|| self.forked.any_made())
    }
}

/// Where the appends of a file opened in mode `a` or `a+` go: at the end of the file as it is
/// when the write starts, as with `O_APPEND` (so appends by other handles and processes, or a
/// truncation, are seen), but past this handle's own appends still running, which the file's
/// size does not show yet.
#[derive(Default)]
struct Appends {
    /// End of the last range reserved by this handle.
    end: u64,
    /// This handle's appends that may still be running.
    running: Vec<Weak<Completion>>,
}

/// What tests make the policy see instead of the machine (`OpenOptions`' testing hooks).
#[derive(Default)]
struct Assumed {
    memory: Option<policy::Memory>,
    write_probe: Option<policy::WriteProbe>,
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

    fn open_with(
        path: &Path,
        mode: Mode,
        choices: Choices,
        settings: &Settings,
        assumed: Assumed,
    ) -> Result<File> {
        let open_err = |source| Error::Open {
            path: path.to_path_buf(),
            mode: mode.as_str().to_string(),
            source: unknown_scheme_hint(path, source),
        };
        let fd = open_checked(path, mode.flags()).map_err(open_err)?;
        let st = sys::fstat(fd.as_fd()).map_err(|e| Error::io(Op::Stat, path, 0, 0, e))?;
        // The device that holds the bytes: a block device node's own device, not the devtmpfs
        // the node lives in (whose pool is small and shared by every device node).
        let data_dev = if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
            st.st_rdev
        } else {
            st.st_dev
        };
        let wants_direct = (mode.readable() && choices.direct_read != DirectMode::Off)
            || (mode.writable() && choices.direct_write != DirectMode::Off);
        let direct = if wants_direct {
            direct::discover(fd.as_fd(), data_dev)
        } else {
            DirectSupport::Unsupported {
                reason: "turned off for this file".into(),
            }
        };
        let (pool, local) = pool::pool_for_device(data_dev, settings);
        let cache = match choices.cache {
            // Memory is read only when the answer depends on it.
            CacheMode::Auto => {
                let size = if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
                    sys::block_device_size(fd.as_fd()).unwrap_or(u64::MAX)
                } else {
                    st.st_size as u64
                };
                let memory = assumed.memory.or_else(policy::available_memory);
                policy::decide(CacheMode::Auto, size, memory.as_ref())
            }
            mode => policy::decide(mode, 0, None),
        };
        let file = File {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                mode,
                fd,
                direct,
                direct_fd: MadeOnce::default(),
                direct_refused: AtomicBool::new(false),
                writes_started: AtomicU64::new(0),
                writes_running: AtomicUsize::new(0),
                shrinking: AtomicBool::new(false),
                appends: Mutex::new(Appends::default()),
                forked_appends: PerProcess::default(),
                buffered_write: Mutex::new(()),
                opened_by: sys::process_id(),
                opened_pool: pool,
                local,
                dev: data_dev,
                assumed_write_probe: assumed.write_probe,
                cache,
                settings: settings.clone(),
                populate: MadeOnce::default(),
            }),
            choices,
        };
        // A file whose cold reads bypass the cache without direct I/O reads them buffered and
        // drops them, with no readahead (it would bring in pages past each task that the drop
        // does not cover; a failure only leaves readahead on). Its direct descriptor opens at
        // the first read like any other (one descriptor per open file until then: a sharded
        // checkpoint opens all its files before reading), and turns readahead off where it
        // cannot be had.
        if policy::buffered_bypass(choices.direct_read, &file.inner.cache, file.direct_may_work())
        {
            let _ = sys::fadvise_random(file.fd());
        }
        Ok(file)
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The mode the file was opened with.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The file's current size in bytes; a block device's size comes from the device, since
    /// `fstat` says 0 for it.
    pub fn len(&self) -> Result<u64> {
        let st = sys::fstat(self.inner.fd.as_fd()).map_err(|e| self.err(Op::Stat, 0, 0, e))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
            return sys::block_device_size(self.inner.fd.as_fd())
                .map_err(|e| self.err(Op::Stat, 0, 0, e));
        }
        Ok(st.st_size as u64)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Whether and how `O_DIRECT` can be used on this file (asking opens the file's direct
    /// descriptor, if it is not open yet).
    pub fn direct_support(&self) -> DirectSupport {
        if self.inner.direct_refused.load(Ordering::Relaxed) {
            return DirectSupport::Unsupported {
                reason: "the file system refused an O_DIRECT transfer; using the page cache".into(),
            };
        }
        match self.direct_fd() {
            Err(reason) => DirectSupport::Unsupported {
                reason: reason.clone(),
            },
            Ok(_) => self.inner.direct.clone(),
        }
    }

    /// What the cache policy decided for this file at open, and why.
    pub fn cache_decision(&self) -> &CacheDecision {
        &self.inner.cache
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

    /// The worker pool serving this file (in a process forked after the open, the child's pool
    /// for the same device).
    pub fn pool(&self) -> &DevicePool {
        self.current_pool()
    }

    /// The pool requests go to: the one found at open, unless this process was forked from the
    /// one that opened the file; then this process's pool for the same device, since the
    /// parent's has no threads here (one atomic load per call when nothing was forked).
    fn current_pool(&self) -> &Arc<DevicePool> {
        let opened = self.inner.opened_pool;
        if opened.is_current() {
            opened
        } else {
            pool::pool_in_this_process(opened)
        }
    }

    /// Reads `buf.io_len()` bytes at `offset` into `buf` in parallel; the future owns the buffer
    /// until it is done ([`IoFuture::into_buffer`] gives it back).
    pub fn pread<B: IoBufMut>(&self, mut buf: B, offset: u64) -> IoFuture<B> {
        let (ptr, len) = (buf.io_ptr_mut(), buf.io_len());
        // SAFETY: `IoBufMut` guarantees `ptr..ptr+len` stays valid and in place while `buf`
        // lives, and the future owns `buf` until every task has returned.
        let completion = unsafe { self.start_read(ptr, len, offset) };
        IoFuture::started(completion, buf)
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
        IoFuture::started(completion, buf)
    }

    /// Reads `len` bytes at `offset` into memory at `ptr` in parallel.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes, and nothing else may access that memory,
    /// until the returned future has been waited on or dropped. The future must not be leaked
    /// (`mem::forget`) while the memory can be freed.
    pub unsafe fn pread_raw(&self, ptr: *mut u8, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        IoFuture::started(unsafe { self.start_read(ptr, len, offset) }, ())
    }

    /// Writes `len` bytes from memory at `ptr` at `offset` in parallel.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes, and the memory must not change, until the
    /// returned future has been waited on or dropped. The future must not be leaked.
    pub unsafe fn pwrite_raw(&self, ptr: *const u8, len: usize, offset: u64) -> IoFuture {
        // SAFETY: forwarded from this function's contract.
        IoFuture::started(unsafe { self.start_write(ptr, len, offset) }, ())
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
        IoFuture::started(
            unsafe { self.start_device(dst, len, offset, Direction::Read) },
            (),
        )
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
        IoFuture::started(
            unsafe { self.start_device(src, len, offset, Direction::Write) },
            (),
        )
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

    /// Closes this handle and reports what closing the file says, as `close(2)` does: NFS,
    /// FUSE and other network file systems may report only then that written data did not
    /// reach storage (`EIO`, `ENOSPC`). Writes of the file still running finish first, so that
    /// what closing says covers them. The descriptors themselves close with the last clone and
    /// the last request in flight. Dropping a `File` closes it without the report.
    pub fn close(self) -> Result<()> {
        if self.inner.mode.writable() {
            // Only in the process that started them: a forked child's count is the parent's.
            while self.inner.writes_running.load(Ordering::SeqCst) > 0
                && self.inner.opened_by == sys::process_id()
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let direct = self.inner.direct_fd.get().and_then(|d| d.as_ref().ok());
            for fd in std::iter::once(&self.inner.fd).chain(direct) {
                sys::close_checked(fd.as_fd()).map_err(|e| self.err(Op::Close, 0, 0, e))?;
            }
        }
        Ok(())
    }

    /// Reserves disk space for the first `len` bytes and makes the file at least that long
    /// (`fallocate`), so that a large write allocates its blocks once instead of as it goes.
    /// Returns `Ok(false)`, changing nothing, where the file system cannot preallocate.
    pub fn allocate(&self, len: u64) -> Result<bool> {
        self.check_mode(Op::Write)?;
        self.fallocate(0, len)
    }

    /// Truncates or extends the file to `len` bytes.
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.check_mode(Op::Write)?;
        sys::ftruncate(self.inner.fd.as_fd(), len).map_err(|e| self.err(Op::Write, len, 0, e))
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
        self.plan_with(offset, len, self.choices.task_size)
    }

    /// How a read of `[offset, offset+len)` that fills the page cache is shaped, if it is one
    /// (see `policy::fill_shape`).
    fn fill_shape(&self, offset: u64, len: usize) -> Option<policy::FillShape> {
        policy::fill_shape(
            self.choices.direct_read,
            &self.inner.cache,
            self.fd(),
            offset,
            len as u64,
            policy::FillShape::from_settings(&self.inner.settings),
        )
    }

    /// As [`File::plan`], with tasks of `task_bytes`.
    fn plan_with(&self, offset: u64, len: usize, task_bytes: u64) -> Result<Vec<Task>> {
        self.check_range(offset, len)?;
        Ok(plan::split(offset, len, task_bytes, self.plan_align()))
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

    fn cap_for(&self, direction: Direction, end: u64) -> usize {
        match direction {
            Direction::Read => usize::MAX,
            Direction::Write => self.write_cap(end),
        }
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
            max_active: self.cap_for(direction, offset + len as u64),
            leaves_running: None,
            run,
        }
    }

    /// Queues `request` on the file's pool; returns its completion.
    fn queue(&self, request: Request) -> Arc<Completion> {
        let completion = Arc::clone(&request.completion);
        self.current_pool()
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
        let DirectSupport::Available {
            mem_align,
            offset_align,
            ..
        } = self.inner.direct
        else {
            return None;
        };
        let fd = self.direct_fd().ok()?;
        Some((fd.as_fd(), mem_align as usize, (offset_align as u64).max(1)))
    }

    /// Whether direct I/O may work on this file, asked without opening its direct descriptor:
    /// not where it is turned off or was refused, or the descriptor could not be opened.
    fn direct_may_work(&self) -> bool {
        !self.inner.direct_refused.load(Ordering::Relaxed)
            && self.inner.direct.is_available()
            && self.inner.direct_fd.get().is_none_or(|d| d.is_ok())
    }

    /// Whether this file's cold ranges are read with `O_DIRECT` (its cache policy and
    /// `direct_read` let them, and direct I/O may work), asked without opening the descriptor.
    fn reads_go_direct_when_cold(&self) -> bool {
        policy::reads_may_go_direct(self.choices.direct_read, &self.inner.cache)
            && self.direct_may_work()
    }

    /// The file's `O_DIRECT` descriptor, opened on first use: the open file reopened through
    /// `/proc/self/fd` (the same file, whatever its path names by now), or where that fails its
    /// path again, checked to be the same file. `Err` says why there is none.
    fn direct_fd(&self) -> std::result::Result<&OwnedFd, &String> {
        let inner = &*self.inner;
        inner
            .direct_fd
            .get_or_init(inner.opened_by, || {
                #[cfg(feature = "testing")]
                std::thread::sleep(std::time::Duration::from_millis(
                    DIRECT_OPEN_DELAY_MS.load(Ordering::SeqCst),
                ));
                if let DirectSupport::Unsupported { reason } = &inner.direct {
                    return Err(reason.clone());
                }
                let flags = inner.mode.direct_flags();
                let again = PathBuf::from(format!("/proc/self/fd/{}", inner.fd.as_raw_fd()));
                // `/proc` may be missing or closed to this process (a sandbox): then the path.
                let opened = open_checked(&again, flags).or_else(|_| open_checked(&inner.path, flags));
                let made = sys::fstat(inner.fd.as_fd())
                    .map_err(|e| e.to_string())
                    .and_then(|st| {
                        opened
                            .and_then(|dfd| same_file(dfd, &st))
                            .map_err(|e| format!("no O_DIRECT descriptor: {e}"))
                    });
                // Without it, cold reads that were to bypass the cache go buffered and are
                // dropped (`policy::buffered_bypass`): as at open, no readahead for them.
                if made.is_err() && !inner.cache.keeps() {
                    let _ = sys::fadvise_random(inner.fd.as_fd());
                }
                made
            })
            .as_ref()
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
            .field("direct_open", &self.inner.direct_fd.get().map(|d| d.is_ok()))
            .field("pool", &self.pool().key())
            .finish()
    }
}

/// Opens `path` without blocking, refuses anything but a regular file or a block device, and
/// gives back a blocking descriptor.
///
/// A FIFO's `open` would otherwise wait for a writer (or reader), in an uninterruptible way as
/// far as a caller's Ctrl-C is concerned. Checking the open descriptor rather than the path
/// first leaves no window for the path to change kind in between.
pub(crate) fn open_checked(path: &Path, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    let fd = match sys::open(path, flags | libc::O_NONBLOCK, 0o666) {
        Ok(fd) => fd,
        // A FIFO opened for writing without a reader fails with ENXIO: say what it is instead.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(match std::fs::symlink_metadata(path) {
                Ok(m) => not_a_file(m.mode() & libc::S_IFMT).unwrap_or(e),
                Err(_) => e,
            });
        }
        Err(e) => return Err(e),
    };
    let st = sys::fstat(fd.as_fd())?;
    if let Some(refused) = not_a_file(st.st_mode & libc::S_IFMT) {
        return Err(refused);
    }
    sys::set_nonblocking(fd.as_fd(), false)?;
    Ok(fd)
}

/// `path`, or the local path it names as a `file:/` URL ([`crate::remote::file_url_path`]).
///
/// # Errors
/// [`Error::InvalidArgument`] for a `file:` URL that names no local path.
pub fn local_path(path: &Path) -> Result<std::borrow::Cow<'_, Path>> {
    match path.to_str().and_then(crate::remote::file_url_path) {
        Some(resolved) => Ok(std::borrow::Cow::Owned(resolved?)),
        None => Ok(std::borrow::Cow::Borrowed(path)),
    }
}

/// `source` for a path that does not exist, told where the path reads as a URL of a scheme
/// ferrio does not open (`ftp://host/x`): a plain "No such file or directory" would not say
/// why. Any other error is returned as it is.
pub(crate) fn unknown_scheme_hint(path: &Path, source: std::io::Error) -> std::io::Error {
    if source.kind() != std::io::ErrorKind::NotFound {
        return source;
    }
    let text = path.to_string_lossy();
    let Some(why) = crate::remote::unsupported_url_scheme(&text) else {
        return source;
    };
    // Without "(os error 2)", which would end the sentence before the reason (Python's OSError
    // takes the text up to it as its strerror).
    let text = source.to_string();
    let what = text.split(" (os error ").next().unwrap_or(&text);
    std::io::Error::new(std::io::ErrorKind::NotFound, format!("{what}; {why}"))
}

/// The error for a file of kind `fmt` (`S_IFMT` bits) that ferrio does not read or write, or
/// `None` for a regular file or block device.
fn not_a_file(fmt: libc::mode_t) -> Option<std::io::Error> {
    let kind = match fmt {
        libc::S_IFREG | libc::S_IFBLK => return None,
        // As before this check existed, and as the OS itself says it.
        libc::S_IFDIR => return Some(std::io::Error::from_raw_os_error(libc::EISDIR)),
        libc::S_IFIFO => "is a FIFO",
        libc::S_IFCHR => "is a character device",
        libc::S_IFSOCK => "is a socket",
        _ => "is not a regular file",
    };
    Some(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{kind} (only regular files and block devices can be opened)"),
    ))
}

/// `fd` if it is the file `st` describes: the file was opened a second time (for `O_DIRECT`),
/// by a path that may have been replaced in between.
fn same_file(fd: OwnedFd, st: &libc::stat) -> std::io::Result<OwnedFd> {
    let now = sys::fstat(fd.as_fd())?;
    if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) {
        Ok(fd)
    } else {
        Err(std::io::Error::other(
            "the path was replaced while it was opened",
        ))
    }
}

/// Statistics of every worker pool started so far.
pub fn stats() -> Vec<pool::PoolStats> {
    pool::stats()
}
