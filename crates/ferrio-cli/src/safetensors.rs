//! `ferrio safetensors inspect PATH`: a checkpoint's tensors, dtypes, sizes and whether the file
//! is valid. Reads only the header, through [`ferrio::safetensors::Header`]; exit status 2 with
//! the broken rule when the file is invalid.

use std::path::PathBuf;

use clap::Subcommand;

use crate::{out, UsageError};

/// The widest the table's name column pads to (longer names run past it).
const NAME_COLUMN_MAX: usize = 80;

/// Arguments of `ferrio safetensors`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List a file's tensors (name, dtype, shape, bytes, offset) and validate its header.
    Inspect(InspectArgs),
}

#[derive(clap::Args, Debug)]
struct InspectArgs {
    /// The .safetensors file
    path: PathBuf,
    /// Print one JSON object instead of a table
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Inspect(a) => inspect(&a),
    }
}

fn inspect(a: &InspectArgs) -> anyhow::Result<()> {
    let header = match ferrio::safetensors::Header::read_path(&a.path) {
        Ok(h) => h,
        Err(e @ ferrio::Error::Safetensors { .. }) => {
            if a.json {
                let v = serde_json::json!({
                    "path": a.path.display().to_string(),
                    "valid": false,
                    "error": e.to_string(),
                });
                out(&v.to_string())?;
            }
            return Err(UsageError(e.to_string()).into());
        }
        Err(e) => return Err(e.into()),
    };
    let start = header.data_start();
    if a.json {
        let tensors: Vec<serde_json::Value> = header
            .tensors
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "dtype": t.dtype.name(),
                    "shape": t.shape,
                    "bytes": t.nbytes(),
                    "offset": start + t.begin,
                })
            })
            .collect();
        let v = serde_json::json!({
            "path": a.path.display().to_string(),
            "valid": true,
            "header_bytes": start,
            "data_bytes": header.data_len(),
            "metadata": header.metadata,
            "tensors": tensors,
        });
        return out(&v.to_string());
    }
    // Names pad to the longest, up to a terminal's width: a longer name runs past its column
    // rather than pad every row (or exceed what a format width can hold).
    let width = header
        .tensors
        .iter()
        .map(|t| printable(&t.name).chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, NAME_COLUMN_MAX);
    out(&format!(
        "{:<width$}  {:<11}  {:<20}  {:>14}  {:>14}",
        "name", "dtype", "shape", "bytes", "offset"
    ))?;
    for t in &header.tensors {
        out(&format!(
            "{:<width$}  {:<11}  {:<20}  {:>14}  {:>14}",
            printable(&t.name),
            t.dtype.name(),
            format!("{:?}", t.shape),
            t.nbytes(),
            start + t.begin
        ))?;
    }
    if let Some(meta) = &header.metadata {
        for (k, v) in meta {
            out(&format!("metadata {} = {}", printable(k), printable(v)))?;
        }
    }
    out(&format!(
        "valid: {} tensors, {} data bytes after a {}-byte header",
        header.tensors.len(),
        header.data_len(),
        start
    ))
}

/// `s` with its control characters escaped (`\n`, `\u{1b}`): names and metadata come from the
/// file, which may hold newlines that would break the table, or escape sequences a terminal
/// would obey.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
