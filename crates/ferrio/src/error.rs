//! The one error type of the library.
//!
//! Every variant that comes from the operating system carries what was being done, on which
//! path, at which offset and for how many bytes, so a user can act on a single line of output.

use std::io;
use std::path::PathBuf;

/// What ferrio was doing when an OS call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Opening a file.
    Open,
    /// Reading file bytes.
    Read,
    /// Writing file bytes.
    Write,
    /// Querying file metadata (`fstat`, `statx`).
    Stat,
    /// Flushing written bytes to the device.
    Sync,
    /// Closing a file, where a file system reports written data that did not reach storage.
    Close,
    /// Asking the page cache about a range or dropping it.
    PageCache,
    /// Resolving the block device of a file through sysfs.
    Resolve,
    /// Copying a file.
    Copy,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Stat => "stat",
            Op::Sync => "sync",
            Op::Close => "close",
            Op::PageCache => "page-cache",
            Op::Resolve => "resolve",
            Op::Copy => "copy",
        })
    }
}

/// Where an [`Error::Io`] happened, for its message: the bytes the failed call asked for, or
/// nothing for a call that asked for none (completing an upload, a sync).
pub(crate) fn span(offset: u64, len: u64) -> String {
    if len == 0 {
        String::new()
    } else {
        format!(" (offset {offset}, {len} bytes)")
    }
}

/// Errors returned by ferrio.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An OS call on a file failed.
    #[error("{op} {path}: {source}{}", span(*.offset, *.len))]
    Io {
        /// What was being done.
        op: Op,
        /// The file.
        path: PathBuf,
        /// Byte offset in the file where the failed call started.
        offset: u64,
        /// Bytes the failed call asked for.
        len: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A file could not be opened.
    #[error("cannot open {path} with mode {mode:?}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The mode that was asked for.
        mode: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A setting has a value that cannot be parsed or is out of range.
    #[error("invalid value {value:?} for {name}: expected {expected}")]
    InvalidSetting {
        /// The `FERRIO_*` variable (or setting name) that was given.
        name: String,
        /// The value as given.
        value: String,
        /// The accepted forms.
        expected: String,
    },
    /// The caller passed an argument that cannot work (a short buffer, a bad mode, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The file was not opened for this kind of access.
    #[error("{path} was opened with mode {mode:?}, which does not allow {op}")]
    BadMode {
        /// The file.
        path: PathBuf,
        /// The mode the file was opened with.
        mode: String,
        /// The refused operation.
        op: Op,
    },
    /// The operation was cancelled before it finished (an earlier task failed, or Ctrl-C).
    #[error("operation cancelled")]
    Cancelled,
    /// Waiting on a future took longer than the timeout; the operation goes on.
    #[error("timed out waiting for I/O")]
    TimedOut,
    /// CUDA is not available in this process, and why.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable {
        /// Why it could not be used (no driver library, no device, ...).
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA {call} failed: {message} (code {code})")]
    Cuda {
        /// The driver function.
        call: &'static str,
        /// The driver's result code.
        code: i32,
        /// The driver's description of the code.
        message: String,
    },
    /// A memory pool could not satisfy a request.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A call on a path that moves no file bytes failed: creating a directory or a temporary
    /// file, renaming, reading a symlink, setting permissions or times.
    #[error("{action} {path}: {source}")]
    Fs {
        /// What was being done, as a verb phrase ("create directory", "rename into place").
        action: &'static str,
        /// The path acted on.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A copy's source and destination are one file (the same inode, through another name or a
    /// link), as `cp` and Python's `shutil.SameFileError` refuse it.
    #[error("{} and {} are the same file", src.display(), dst.display())]
    SameFile {
        /// The source as named.
        src: PathBuf,
        /// The destination as named.
        dst: PathBuf,
    },
    /// A safetensors file (or header) breaks a rule of the format.
    #[error("{}", safetensors_message(path, tensor.as_deref(), rule))]
    Safetensors {
        /// The file; empty for bytes that did not come from a file.
        path: PathBuf,
        /// The tensor the broken rule is about, if it is about one.
        tensor: Option<String>,
        /// The rule and how it was broken.
        rule: String,
    },
}

fn safetensors_message(path: &std::path::Path, tensor: Option<&str>, rule: &str) -> String {
    let mut msg = String::from("invalid safetensors ");
    if path.as_os_str().is_empty() {
        msg.push_str("data");
    } else {
        msg.push_str(&format!("file {}", path.display()));
    }
    if let Some(t) = tensor {
        msg.push_str(&format!(", tensor {t:?}"));
    }
    msg.push_str(": ");
    msg.push_str(rule);
    msg
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Builds an [`Error::Io`].
    pub(crate) fn io(
        op: Op,
        path: &std::path::Path,
        offset: u64,
        len: u64,
        source: io::Error,
    ) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            offset,
            len,
            source,
        }
    }

    /// The OS error behind this error, if there is one.
    pub fn os_error(&self) -> Option<&io::Error> {
        match self {
            Error::Io { source, .. } | Error::Open { source, .. } | Error::Fs { source, .. } => {
                Some(source)
            }
            _ => None,
        }
    }

    /// The path this error is about, if there is one.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Error::Io { path, .. }
            | Error::Open { path, .. }
            | Error::BadMode { path, .. }
            | Error::Fs { path, .. }
            | Error::SameFile { dst: path, .. } => Some(path),
            Error::Safetensors { path, .. } if !path.as_os_str().is_empty() => Some(path),
            _ => None,
        }
    }
}

/// `io::Error` is not `Clone`; an equal one is rebuilt from its OS code, or its kind and text.
fn clone_io(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Error::Io {
                op,
                path,
                offset,
                len,
                source,
            } => Error::Io {
                op: *op,
                path: path.clone(),
                offset: *offset,
                len: *len,
                source: clone_io(source),
            },
            Error::Open { path, mode, source } => Error::Open {
                path: path.clone(),
                mode: mode.clone(),
                source: clone_io(source),
            },
            Error::InvalidSetting {
                name,
                value,
                expected,
            } => Error::InvalidSetting {
                name: name.clone(),
                value: value.clone(),
                expected: expected.clone(),
            },
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::BadMode { path, mode, op } => Error::BadMode {
                path: path.clone(),
                mode: mode.clone(),
                op: *op,
            },
            Error::Cancelled => Error::Cancelled,
            Error::TimedOut => Error::TimedOut,
            Error::CudaUnavailable { reason } => Error::CudaUnavailable {
                reason: reason.clone(),
            },
            Error::Cuda {
                call,
                code,
                message,
            } => Error::Cuda {
                call,
                code: *code,
                message: message.clone(),
            },
            Error::OutOfMemory(m) => Error::OutOfMemory(m.clone()),
            Error::Fs {
                action,
                path,
                source,
            } => Error::Fs {
                action,
                path: path.clone(),
                source: clone_io(source),
            },
            Error::SameFile { src, dst } => Error::SameFile {
                src: src.clone(),
                dst: dst.clone(),
            },
            Error::Safetensors { path, tensor, rule } => Error::Safetensors {
                path: path.clone(),
                tensor: tensor.clone(),
                rule: rule.clone(),
            },
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Io { source, .. } | Error::Open { source, .. } | Error::Fs { source, .. } => {
                source.kind()
            }
            Error::InvalidSetting { .. } | Error::InvalidArgument(_) | Error::SameFile { .. } => {
                io::ErrorKind::InvalidInput
            }
            Error::Safetensors { .. } => io::ErrorKind::InvalidData,
            Error::BadMode { .. } => io::ErrorKind::PermissionDenied,
            Error::Cancelled => io::ErrorKind::Interrupted,
            Error::TimedOut => io::ErrorKind::TimedOut,
            Error::OutOfMemory(_) => io::ErrorKind::OutOfMemory,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}
