//! The `ferrio` command line, as a library so that the Python package can ship the same program
//! as its console script ([`run`]).
//!
//! Exit status: 0 on success (also when stdout is a closed pipe), 2 on bad usage or input
//! (unknown flags, bad sizes, missing files, bad `FERRIO_*` values), 1 when I/O fails, 130 after
//! Ctrl-C, 143 after `SIGTERM`, 129 after `SIGHUP` (all clean up first). Errors are one line on
//! stderr, never a panic or a backtrace.

/// `eprintln!` that never panics: where stderr is a closed pipe or a hung-up terminal (`EIO`
/// after `SIGHUP`), the line is lost, not the exit status (`eprintln!` panics, exit 101).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod bench;
mod cp;
mod host;
mod info;
mod interrupt;
mod progress;
mod read;
mod safetensors;
mod write;

pub(crate) use interrupt::{check_interrupt, interrupted, wait_polled, Interrupted};

use std::ffi::OsString;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Moves file bytes into and out of host and GPU memory at the hardware's limit.
#[derive(Parser, Debug)]
#[command(name = "ferrio", version, about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Read files in parallel into host memory and report the rate.
    Read(read::Args),
    /// Write generated data to a file and report the rate.
    Write(write::Args),
    /// Measure write, cold read and hot read on a temporary file (the main job).
    Bench(bench::Args),
    /// Copy files and directory trees, in parallel across files and devices.
    Cp(cp::Args),
    /// Show what ferrio knows about a file (file system, device, direct I/O, page cache) or,
    /// with --gpu N, about a GPU (PCI address, NUMA node, link, ring placement).
    Info(info::Args),
    /// Safetensors checkpoints: `inspect` lists a file's tensors and validates it.
    Safetensors(safetensors::Args),
}

/// A user mistake (exit status 2) rather than an I/O failure (exit status 1).
#[derive(Debug)]
pub(crate) struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Runs the command line with `args` (the program name first) and returns the exit status.
pub fn run(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return code;
        }
    };
    if let Some(err) = ferrio::Settings::env_error() {
        say!("ferrio: {err}");
        return 2;
    }
    for warning in ferrio::Settings::env_warnings() {
        say!("ferrio: warning: {warning}");
    }
    host::raise_open_file_limit();
    let _ctrl_c = interrupt::CtrlC::install();
    let result = match cli.command {
        Command::Read(a) => read::run(a),
        Command::Write(a) => write::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Info(a) => info::run(a),
        Command::Cp(a) => cp::run(a),
        Command::Safetensors(a) => safetensors::run(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => report(&e),
    }
}

fn report(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<Interrupted>().is_some() {
        let (message, status) = interrupt::exit_status();
        say!("ferrio: {message}");
        return status;
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        if io.kind() == ErrorKind::BrokenPipe {
            return 0;
        }
    }
    say!("ferrio: {}", one_line(e));
    if e.downcast_ref::<UsageError>().is_some() {
        return 2;
    }
    match e.downcast_ref::<ferrio::Error>() {
        Some(ferrio::Error::InvalidArgument(_) | ferrio::Error::InvalidSetting { .. }) => 2,
        // A directory named to `cp` without `-r`.
        Some(ferrio::Error::Fs { source, .. }) if source.raw_os_error() == Some(libc::EISDIR) => 2,
        // Bad input: a missing file, one this user may not open, a directory, or a FIFO,
        // socket or character device (refused at open as `InvalidInput`).
        Some(ferrio::Error::Open { source, .. })
            if matches!(
                source.kind(),
                ErrorKind::NotFound | ErrorKind::PermissionDenied | ErrorKind::InvalidInput
            ) || source.raw_os_error() == Some(libc::EISDIR) =>
        {
            2
        }
        _ => 1,
    }
}

/// The error and its causes on one line, skipping a cause whose text the message already holds
/// (ferrio's errors include their OS error).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !msg.contains(&text) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&text);
        }
    }
    msg
}

/// Parses a human size for clap (`4KiB`, `16M`, `2GiB`, `4194304`).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    ferrio::config::parse_size(s)
        .ok_or_else(|| format!("{s:?} is not a size: use e.g. 4194304, 4KiB, 16M, 2GiB"))
}

/// Prints a line to stdout, turning a closed pipe into an error [`report`] treats as success.
/// Any other failure says it was the output that failed (stdout on a full disk), not the work.
pub(crate) fn out(line: &str) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    match writeln!(o, "{line}") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e).context("cannot write to standard output")),
    }
}

/// Settings overrides shared by the commands that do I/O. Their help takes each setting's
/// variable and default from `ferrio::config::SETTINGS`, so it cannot restate them wrongly, and
/// their values go through the same parser as the variables ([`ferrio::Settings::set`]), so a
/// flag accepts and refuses exactly what its variable does, with the same message.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct IoFlags {
    #[arg(long, value_name = "MODE", help = setting_help(
        "Page cache after I/O: auto, keep or bypass",
        "cache",
    ))]
    cache: Option<String>,
    #[arg(long, value_name = "MODE", help = setting_help(
        "O_DIRECT for reads: off, on or auto",
        "direct_read",
    ))]
    direct_read: Option<String>,
    #[arg(long, value_name = "MODE", help = setting_help(
        "O_DIRECT for writes: off, on or auto",
        "direct_write",
    ))]
    direct_write: Option<String>,
    #[arg(long, value_name = "SIZE", help = setting_help(
        "Bytes per task, e.g. 4MiB",
        "task_size",
    ))]
    task_size: Option<String>,
    #[arg(long, value_name = "N", help = setting_help(
        "Worker threads per device pool, 0 = by device kind",
        "threads_per_device",
    ))]
    threads: Option<String>,
    /// Print one JSON object instead of human output
    #[arg(long)]
    json: bool,
}

impl IoFlags {
    /// The process settings with these flags applied; a bad value is
    /// [`ferrio::Error::InvalidSetting`] naming the flag (exit status 2).
    fn settings(&self) -> anyhow::Result<ferrio::Settings> {
        let mut s = ferrio::Settings::global();
        for (flag, setting, value) in [
            ("--cache", "cache", &self.cache),
            ("--direct-read", "direct_read", &self.direct_read),
            ("--direct-write", "direct_write", &self.direct_write),
            ("--task-size", "task_size", &self.task_size),
            ("--threads", "threads_per_device", &self.threads),
        ] {
            if let Some(v) = value {
                s.set(setting, v).map_err(|e| match e {
                    ferrio::Error::InvalidSetting {
                        value, expected, ..
                    } => ferrio::Error::InvalidSetting {
                        name: flag.to_string(),
                        value,
                        expected,
                    },
                    other => other,
                })?;
            }
        }
        Ok(s)
    }
}

/// Help for a flag that overrides setting `name`: `what`, then the setting's variable and its
/// default from the settings table.
fn setting_help(what: &str, name: &str) -> String {
    match ferrio::config::setting(name) {
        Some(i) => format!("{what} [default: {}, else {}]", i.env, i.default),
        None => what.to_string(),
    }
}

/// A path as a JSON string. JSON holds Unicode text only, so bytes of a name that are not UTF-8
/// become U+FFFD (serde refuses such a path, which `json!` turns into a panic).
pub(crate) fn json_path(p: &std::path::Path) -> serde_json::Value {
    serde_json::Value::String(p.to_string_lossy().into_owned())
}

/// Each path, or the local path it names as a `file://` URL (`ferrio::local_path`).
pub(crate) fn local_paths(paths: Vec<PathBuf>) -> anyhow::Result<Vec<PathBuf>> {
    paths
        .into_iter()
        .map(|p| match ferrio::local_path(&p) {
            Ok(local) => Ok(local.into_owned()),
            Err(e) => Err(UsageError(e.to_string()).into()),
        })
        .collect()
}

/// A path that must exist, checked before any work starts.
pub(crate) fn existing(path: &std::path::Path) -> anyhow::Result<()> {
    let local = ferrio::local_path(path).map_err(|e| UsageError(e.to_string()))?;
    match std::fs::metadata(&local) {
        Ok(_) => Ok(()),
        Err(e) => {
            let hint = path
                .to_str()
                .and_then(ferrio::remote::unsupported_url_scheme)
                .filter(|_| e.kind() == std::io::ErrorKind::NotFound)
                .map(|why| format!("; {why}"))
                .unwrap_or_default();
            Err(UsageError(format!("{}: {e}{hint}", path.display())).into())
        }
    }
}

/// GiB/s for `bytes` in `secs`.
pub(crate) fn gibps(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        0.0
    } else {
        bytes as f64 / secs / (1u64 << 30) as f64
    }
}

/// CPU seconds spent per GiB moved, for the JSON reports; `None` (null) when nothing moved.
pub(crate) fn cpu_per_gib(cpu_secs: f64, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| cpu_secs / (bytes as f64 / (1u64 << 30) as f64))
}
