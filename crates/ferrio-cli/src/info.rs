//! `ferrio info PATH`: file system, device chain, pool, direct I/O, cache policy and page cache
//! of a file.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{existing, out};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The file to describe
    path: PathBuf,
    /// Print one JSON object instead of human output
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    existing(&a.path)?;
    let settings = ferrio::Settings::global();
    let chain = ferrio::blockdev::resolve(&a.path)?;
    // Open with direct I/O asked for, to learn whether and how the file system allows it.
    let probe = ferrio::File::options()
        .direct_read(ferrio::DirectMode::On)
        .open(&a.path, "r")?;
    let file = ferrio::File::options()
        .settings(settings.clone())
        .open(&a.path, "r")?;
    let decision = file.cache_decision();
    let size = file.len()?;
    let residency = ferrio::pagecache::residency(&a.path, 0, None)?;
    let pool = file.pool().stats();
    let direct = probe.direct_support();
    if a.json {
        let disks: Vec<Value> = chain
            .disks()
            .iter()
            .map(|d| {
                json!({
                    "name": d.name, "kind": d.kind.as_str(), "dev": d.dev.map(|d| d.to_string()),
                    "logical_block_size": d.logical_block_size, "physical_block_size": d.physical_block_size,
                })
            })
            .collect();
        let (mem_align, offset_align) = match &direct {
            ferrio::DirectSupport::Available {
                mem_align,
                offset_align,
                ..
            } => (json!(mem_align), json!(offset_align)),
            _ => (Value::Null, Value::Null),
        };
        out(&json!({
            "path": a.path, "size": size, "fs_type": chain.fs_type, "mount_point": chain.mount_point,
            "dev": chain.dev().to_string(), "has_block_device": chain.has_block_device(),
            "nodes": chain.nodes().iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            "disks": disks,
            "pool": {"key": pool.key, "max_threads": pool.max_threads},
            "direct_io": {"available": direct.is_available(), "detail": direct.to_string(),
                          "mem_align": mem_align, "offset_align": offset_align,
                          "read_policy": settings.direct_read.as_str(), "write_policy": settings.direct_write.as_str(),
                          "overread": settings.direct_overread},
            "cache": {"asked": decision.asked.as_str(), "resolved": decision.resolved.as_str(),
                      "reason": decision.reason, "keeps": decision.keeps()},
            "page_cache": {"cached_bytes": residency.cached_bytes, "dirty_bytes": residency.dirty_bytes, "share": residency.share()},
            "pools": pools_json(),
        })
        .to_string())?;
        return Ok(());
    }
    out(&format!(
        "file:        {} ({})",
        a.path.display(),
        ferrio::config::format_size(size)
    ))?;
    out(&format!("chain:       {chain}"))?;
    out(&format!(
        "pool:        {} (up to {} threads)",
        pool.key, pool.max_threads
    ))?;
    out(&format!("direct I/O:  {direct}"))?;
    out(&format!(
        "policy:      read {}, write {}, over-read {}",
        settings.direct_read,
        settings.direct_write,
        if settings.direct_overread {
            "on"
        } else {
            "off"
        }
    ))?;
    out(&format!("cache:       {decision}"))?;
    out(&format!(
        "page cache:  {} of {} resident ({:.0}%), {} dirty",
        ferrio::config::format_size(residency.cached_bytes),
        ferrio::config::format_size(residency.range_bytes),
        residency.share() * 100.0,
        ferrio::config::format_size(residency.dirty_bytes)
    ))?;
    Ok(())
}

/// Statistics of every pool as JSON.
pub(crate) fn pools_json() -> Value {
    Value::Array(
        ferrio::stats()
            .into_iter()
            .map(|p| {
                json!({
                    "key": p.key, "threads": p.threads, "max_threads": p.max_threads,
                    "bytes_read": p.bytes_read, "bytes_written": p.bytes_written, "tasks": p.tasks,
                    "queued": p.queued, "busy_seconds": p.busy_ns as f64 / 1e9,
                    "bytes_direct": p.bytes_direct, "bytes_buffered": p.bytes_buffered,
                })
            })
            .collect(),
    )
}
