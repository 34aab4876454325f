//! `ferrio info PATH`: file system, device chain, pool, direct I/O, cache policy and page cache
//! of a file; `ferrio info --gpu N`: a GPU's name, PCI address, memory, NUMA node, PCIe link,
//! whether ferrio places its bounce rings on that node, and how it pins their buffers.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{existing, json_path, out, UsageError};

/// A PCIe link in words: `16.0 GT/s PCIe x16`, `unknown` for what sysfs does not say.
fn link_text(link: &ferrio::topology::Link) -> String {
    let speed = link.speed.as_deref().unwrap_or("unknown speed");
    match link.width {
        Some(w) => format!("{speed} x{w}"),
        None => format!("{speed}, unknown width"),
    }
}

/// The CPU list in the kernel's short form (`0-15,32-47`).
fn cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

fn gpu(ordinal: usize, json: bool) -> anyhow::Result<()> {
    let g = ferrio::topology::gpu(ordinal)?;
    let node = g.pci.as_ref().and_then(|p| p.numa_node);
    let one_node = g.online_nodes.len() <= 1;
    let settings = ferrio::Settings::global();
    let buffer = usize::try_from(settings.bounce_buffer_bytes()).unwrap_or(usize::MAX);
    let pinning = ferrio::topology::pinning(settings.pinned_memory, buffer, g.placed_on);
    if json {
        let link = |l: &ferrio::topology::Link| json!({"speed": l.speed, "width": l.width});
        out(&json!({
            "gpu": g.device.ordinal, "name": g.device.name, "pci_address": g.device.pci_address,
            "memory_bytes": g.device.total_memory,
            "numa_node": node, "online_nodes": g.online_nodes,
            "node_cpus": g.node_cpus.as_deref().map(cpu_list),
            "link": g.pci.as_ref().map(|p| json!({"current": link(&p.current_link), "max": link(&p.max_link)})),
            "rings_placed_on_node": g.placed_on,
            "pinning": pinning.to_string(),
        })
        .to_string())?;
        return Ok(());
    }
    out(&format!(
        "gpu:         {} ({})",
        g.device.ordinal, g.device.name
    ))?;
    out(&format!("pci:         {}", g.device.pci_address))?;
    out(&format!(
        "memory:      {}",
        ferrio::config::format_size(g.device.total_memory)
    ))?;
    let node_text = match node {
        _ if one_node => "none: one node".to_string(),
        Some(n) => n.to_string(),
        None => "unknown".to_string(),
    };
    out(&format!("numa node:   {node_text}"))?;
    if let (Some(n), Some(cpus)) = (node, &g.node_cpus) {
        out(&format!("node cpus:   {} (node {n})", cpu_list(cpus)))?;
    }
    match &g.pci {
        Some(p) => {
            out(&format!("link now:    {}", link_text(&p.current_link)))?;
            out(&format!("link max:    {}", link_text(&p.max_link)))?;
        }
        None => out("link:        unknown (the PCI device is not in /sys)")?,
    }
    let placement = match g.placed_on {
        Some(n) => format!("pinned rings on node {n}, workers on its cpus"),
        None if one_node => "nothing to place (one NUMA node)".to_string(),
        None => "none (the GPU's node is unknown)".to_string(),
    };
    out(&format!("placement:   {placement}"))?;
    out(&format!(
        "pinning:     {} buffers {pinning} (pinned_memory={})",
        ferrio::config::format_size(settings.bounce_buffer_bytes()),
        settings.pinned_memory
    ))?;
    Ok(())
}

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The file (or object URL: s3://, gs://, az://, http(s)://) to describe
    #[arg(required_unless_present = "gpu")]
    path: Option<PathBuf>,
    /// Describe GPU N (as the driver numbers them) instead of a file
    #[arg(long, value_name = "N", conflicts_with = "path")]
    gpu: Option<usize>,
    /// Print one JSON object instead of human output
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let path = match (a.path, a.gpu) {
        (_, Some(ordinal)) => return gpu(ordinal, a.json),
        (Some(path), None) => path,
        // clap requires one of the two.
        (None, None) => return Err(UsageError("give a file or --gpu N".into()).into()),
    };
    file(path, a.json)
}

/// What a read of the object at `url` would do: its size and version (fixed at open, every
/// range asked against them) and the GETs the settings give.
fn object(url: &str, json: bool) -> anyhow::Result<()> {
    let settings = ferrio::Settings::global();
    let f = ferrio::RemoteFile::open_with(url, settings.clone())?;
    let (range, max_range, in_flight) = (
        settings.remote_range_size,
        settings
            .remote_max_range_size
            .max(settings.remote_range_size),
        settings.remote_concurrency,
    );
    if json {
        return out(&json!({
            "url": ferrio::remote::redacted(url), "size": f.len(), "e_tag": f.e_tag(),
            "version": f.version(),
            "reads": {"range_bytes": range, "max_range_bytes": max_range, "in_flight": in_flight},
        })
        .to_string());
    }
    out(&format!(
        "object:      {} ({})",
        ferrio::remote::redacted(url),
        ferrio::config::format_size(f.len())
    ))?;
    let pinned = match (f.e_tag(), f.version()) {
        (_, Some(v)) => format!("version {v}"),
        (Some(e), None) => format!("ETag {e}"),
        (None, None) => "nothing (the store gave no ETag or version)".into(),
    };
    out(&format!("pinned to:   {pinned}"))?;
    out(&format!(
        "reads:       ranged GETs of {} to {}, up to {in_flight} in flight per store",
        ferrio::config::format_size(range),
        ferrio::config::format_size(max_range)
    ))
}

fn file(path: PathBuf, json: bool) -> anyhow::Result<()> {
    if let Some(url) = path.to_str().filter(|u| ferrio::remote::is_remote_url(u)) {
        return object(url, json);
    }
    existing(&path)?;
    let path = ferrio::local_path(&path)?.into_owned();
    let settings = ferrio::Settings::global();
    let chain = ferrio::blockdev::resolve(&path)?;
    // Open with direct I/O asked for, to learn whether and how the file system allows it.
    let probe = ferrio::File::options()
        .direct_read(ferrio::DirectMode::On)
        .open(&path, "r")?;
    let file = ferrio::File::options()
        .settings(settings.clone())
        .open(&path, "r")?;
    let decision = file.cache_decision();
    let size = file.len()?;
    let residency = ferrio::pagecache::residency(&path, 0, None)?;
    let pool = file.pool().stats();
    let direct = probe.direct_support();
    // A rewrite of the whole file (the handle that asked for direct I/O knows whether it works).
    let writes = probe.describe_write(size);
    let measured = probe.measured_writes();
    let fill = file.fill_reads();
    let shape = ferrio::policy::FillShape::from_settings(&settings);
    let in_flight = shape.in_flight;
    if json {
        let disks: Vec<Value> = chain
            .disks()
            .iter()
            .map(|d| {
                json!({
                    "name": d.name, "kind": d.kind.as_str(), "dev": d.dev.map(|d| d.to_string()),
                    "logical_block_size": d.logical_block_size, "physical_block_size": d.physical_block_size,
                    "read_ahead_bytes": d.read_ahead,
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
            "path": json_path(&path), "size": size, "fs_type": chain.fs_type,
            "mount_point": chain.mount_point.as_deref().map(json_path),
            "dev": chain.dev().to_string(), "has_block_device": chain.has_block_device(),
            "nodes": chain.nodes().iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            "disks": disks, "read_ahead_bytes": chain.device.read_ahead(),
            "pool": {"key": pool.key, "max_threads": pool.max_threads},
            "direct_io": {"available": direct.is_available(), "detail": direct.to_string(),
                          "mem_align": mem_align, "offset_align": offset_align,
                          "read_policy": settings.direct_read.as_str(), "write_policy": settings.direct_write.as_str(),
                          "overread": settings.direct_overread},
            "cache": {"asked": decision.asked.as_str(), "resolved": decision.resolved.as_str(),
                      "reason": decision.reason, "keeps": decision.keeps(),
                      "fill": fill.map(|r| json!({"reads": r.as_str(), "in_flight": in_flight,
                                                 "task_bytes": shape.task_bytes}))},
            "writes": {"direct": writes.direct, "reason": writes.reason,
                       "keep_limit": decision.write_keep_limit,
                       "measured": measured.map(|m| json!({"buffered_bytes_per_s": m.buffered, "direct_bytes_per_s": m.direct}))},
            "page_cache": {"cached_bytes": residency.cached_bytes, "dirty_bytes": residency.dirty_bytes, "share": residency.share()},
            "pools": pools_json(),
        })
        .to_string())?;
        return Ok(());
    }
    out(&format!(
        "file:        {} ({})",
        path.display(),
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
    if let Some(reads) = fill {
        let how = match reads {
            ferrio::FillReads::Populate => "each reading 2 MiB blocks into the page cache",
            // `File::fill_reads` says which of the two `auto` became.
            ferrio::FillReads::Readahead | ferrio::FillReads::Auto => {
                "each through the kernel's readahead"
            }
        };
        let here = ferrio::policy::fill_reads_here(settings.fill_reads);
        let fallback = if reads != here {
            ": the kernel cannot map this file for populate"
        } else {
            ""
        };
        out(&format!(
            "fill:        cold reads of {} or more: {in_flight} tasks of {0} at a time, {how} \
             (fill_reads={}{fallback})",
            ferrio::config::format_size(shape.task_bytes),
            settings.fill_reads
        ))?;
    }
    out(&format!("writes:      {writes}"))?;
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

#[cfg(test)]
mod tests {
    use super::cpu_list;

    #[test]
    fn cpu_lists_are_written_short() {
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(cpu_list(&[3]), "3");
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        let two_ranges: Vec<usize> = (0..16).chain(32..48).collect();
        assert_eq!(cpu_list(&two_ranges), "0-15,32-47");
        assert_eq!(
            ferrio::topology::parse_list(&cpu_list(&two_ranges)).expect("list"),
            two_ranges
        );
    }
}
