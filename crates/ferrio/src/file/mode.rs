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
    /// truncation, and after this handle's own writes still running. Unlike `O_APPEND`, the
    /// end is not reserved in the kernel: until a write's bytes are there, another handle or
    /// process appending to the file finds the old end and writes over them. Appenders share
    /// one handle (or write files of their own).
    Append,
    /// `a+`: read anywhere, write at the end (as [`Mode::Append`]); created if missing.
    AppendRead,
    /// `x`: write a new file; fails (`EEXIST`) if the path exists.
    Create,
    /// `x+`: read and write a new file; fails (`EEXIST`) if the path exists.
    CreateRead,
}

impl Mode {
    /// The accepted spellings, for error messages.
    pub const FORMS: &'static str =
        "r, r+, w, w+, a, a+, x, x+ (with an optional 'b', in any order, as Python's open)";

    /// The mode's name, as it would be written to `open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "r",
            Mode::ReadWrite => "r+",
            Mode::Write => "w",
            Mode::WriteRead => "w+",
            Mode::Append => "a",
            Mode::AppendRead => "a+",
            Mode::Create => "x",
            Mode::CreateRead => "x+",
        }
    }

    /// Whether reads are allowed.
    pub fn readable(self) -> bool {
        !matches!(self, Mode::Write | Mode::Append | Mode::Create)
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
            Mode::Create => libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            Mode::CreateRead => libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
        }
    }

    /// Flags for the second, `O_DIRECT` descriptor: same access, never create or truncate.
    pub(super) fn direct_flags(self) -> libc::c_int {
        let access = match self {
            Mode::Read => libc::O_RDONLY,
            Mode::Write | Mode::Append | Mode::Create => libc::O_WRONLY,
            _ => libc::O_RDWR,
        };
        access | libc::O_DIRECT
    }
}

impl FromStr for Mode {
    type Err = Error;

    /// Parses a mode as Python's `open` does: one of `r`, `w`, `a`, `x`, an optional `+` and an
    /// optional `b`, each at most once, in any order. Text mode (`t`) is refused: ferrio only
    /// moves bytes.
    fn from_str(s: &str) -> Result<Mode> {
        let bad = |why: &str| {
            Err(Error::InvalidArgument(format!(
                "mode {s:?} {why}; expected one of {}",
                Mode::FORMS
            )))
        };
        let count = |c: char| s.chars().filter(|&x| x == c).count();
        if s.contains('t') {
            return bad("asks for text: ferrio reads and writes bytes only");
        }
        if s.chars().any(|c| !"rwax+b".contains(c)) || "rwax+b".chars().any(|c| count(c) > 1) {
            return bad("is not a valid mode");
        }
        let plus = count('+') == 1;
        let kinds: Vec<char> = s.chars().filter(|c| "rwax".contains(*c)).collect();
        Ok(match (kinds.as_slice(), plus) {
            (['r'], false) => Mode::Read,
            (['r'], true) => Mode::ReadWrite,
            (['w'], false) => Mode::Write,
            (['w'], true) => Mode::WriteRead,
            (['a'], false) => Mode::Append,
            (['a'], true) => Mode::AppendRead,
            (['x'], false) => Mode::Create,
            (['x'], true) => Mode::CreateRead,
            _ => return bad("needs exactly one of r, w, a, x"),
        })
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Mode;

    #[test]
    fn modes_parse_as_python_open_parses_them() {
        for (text, mode) in [
            ("r", Mode::Read),
            ("rb", Mode::Read),
            ("br", Mode::Read),
            ("+r", Mode::ReadWrite),
            ("b+r", Mode::ReadWrite),
            ("wb+", Mode::WriteRead),
            ("ab", Mode::Append),
            ("x", Mode::Create),
            ("xb", Mode::Create),
            ("x+", Mode::CreateRead),
        ] {
            assert_eq!(text.parse::<Mode>().ok(), Some(mode), "{text}");
        }
        for text in [
            "", "b", "+", "rw", "r++", "rbb", "rt", "t", "U", "rU", "wx", "ra+",
        ] {
            assert!(text.parse::<Mode>().is_err(), "{text} must be refused");
        }
        let text = "rt".parse::<Mode>().unwrap_err().to_string();
        assert!(text.contains("bytes only"), "{text}");
    }
}
