//! [`Mode`]: the `fopen`-style open modes of a [`File`](super::File), their parsing, and the
//! `open(2)` flags of each (buffered and `O_DIRECT` descriptors). No I/O happens here.

use std::str::FromStr;

use crate::error::{Error, Result};

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
    ///
    /// Each write goes to the end of the file as it is when the write starts, as with
    /// `O_APPEND`: after what other handles and processes appended, at the new end after a
    /// truncation, and after this handle's own writes still running. Unlike `O_APPEND`, two
    /// handles that start appends at the same instant may both take the same end.
    Append,
    /// `a+`: read anywhere, write at the end (as [`Mode::Append`]); created if missing.
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

    pub(super) fn flags(self) -> libc::c_int {
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
    pub(super) fn direct_flags(self) -> libc::c_int {
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
