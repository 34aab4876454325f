//! The walk over sysfs from a device number down to its disks: partitions to their disk, md
//! and dm stacks to their `slaves/` members, NVMe namespaces to their controller, and each
//! disk's kind and block sizes from its attributes. It only reads sysfs (never caches: that is
//! the resolver's) and returns plain `io::Error`s that its callers put a path on.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{DevId, DeviceStack, Disk, DiskKind, Node, NodeKind, PoolKey};

/// Stacks deeper than this are treated as a loop in sysfs (real stacks are a handful deep).
const MAX_DEPTH: usize = 16;

pub(super) fn dev_link(sysfs_root: &Path, dev: DevId) -> PathBuf {
    sysfs_root.join("dev/block").join(dev.to_string())
}

/// The sysfs walk; errors are plain `io::Error`s that the caller puts a path on.
pub(super) fn walk(sysfs_root: &Path, dev: DevId) -> io::Result<DeviceStack> {
    let link = dev_link(sysfs_root, dev);
    let dir = fs::canonicalize(&link).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("block device {dev} is not in sysfs (no {})", link.display()),
            )
        } else {
            e
        }
    })?;
    let mut walk = Walk::default();
    walk.visit(&dir, 0)?;
    let pool = PoolKey::from_members(walk.disks.iter().map(|d| d.pool_member().to_owned()))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("block device {dev} ({}) has no disks", dir.display()),
            )
        })?;
    Ok(DeviceStack {
        dev,
        nodes: walk.nodes,
        disks: walk.disks,
        pool,
    })
}

#[derive(Default)]
struct Walk {
    nodes: Vec<Node>,
    disks: Vec<Disk>,
    seen_disks: HashSet<PathBuf>,
}

impl Walk {
    /// Visits the canonical sysfs directory `dir` of a block device found at `depth`.
    fn visit(&mut self, dir: &Path, depth: usize) -> io::Result<()> {
        if depth > MAX_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "device stack deeper than {MAX_DEPTH} at {} (a loop in sysfs?)",
                    dir.display()
                ),
            ));
        }
        let name = file_name(dir);
        let dev = read_attr(&dir.join("dev")).and_then(|s| DevId::parse(&s));

        if dir.join("partition").exists() {
            let number = read_attr(&dir.join("partition")).and_then(|s| s.parse().ok());
            self.nodes.push(Node {
                name,
                dev,
                kind: NodeKind::Partition { number },
                depth,
                read_ahead: None,
            });
            // A partition's directory sits inside its disk's directory.
            let disk = dir.parent().filter(|p| p.join("dev").is_file());
            let disk = disk.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("partition {} has no parent disk in sysfs", dir.display()),
                )
            })?;
            return self.visit(disk, depth + 1);
        }

        let members = read_slaves(dir)?;
        if !members.is_empty() {
            let kind = if dir.join("md").is_dir() {
                NodeKind::Md {
                    level: read_attr(&dir.join("md/level")),
                }
            } else if dir.join("dm").is_dir() {
                NodeKind::Dm {
                    name: read_attr(&dir.join("dm/name")),
                    subsystem: read_attr(&dir.join("dm/uuid")).and_then(|uuid| {
                        let (prefix, _) = uuid.split_once('-')?;
                        Some(prefix.to_ascii_lowercase())
                    }),
                }
            } else {
                NodeKind::Stacked
            };
            self.nodes.push(Node {
                name,
                dev,
                kind,
                depth,
                read_ahead: read_ahead(dir),
            });
            for member in &members {
                self.visit(member, depth + 1)?;
            }
            return Ok(());
        }

        self.nodes.push(Node {
            name: name.clone(),
            dev,
            kind: NodeKind::Disk,
            depth,
            read_ahead: None,
        });
        if self.seen_disks.insert(dir.to_path_buf()) {
            self.disks.push(read_disk(dir, name, dev));
        }
        Ok(())
    }
}

/// The canonical directories of a device's `slaves/` members, in name order. A device with no
/// `slaves/` directory has no members.
fn read_slaves(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let slaves = dir.join("slaves");
    let entries = match fs::read_dir(&slaves) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut links = Vec::new();
    for entry in entries {
        links.push(entry?.path());
    }
    links.sort();
    links
        .into_iter()
        .map(|link| {
            fs::canonicalize(&link).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("member {} of a stacked device: {e}", link.display()),
                )
            })
        })
        .collect()
}

fn read_disk(dir: &Path, name: String, dev: Option<DevId>) -> Disk {
    let kind = disk_kind(dir, &name);
    let controller = (kind == DiskKind::Nvme).then(|| nvme_controller(dir, &name));
    let backing_file = (kind == DiskKind::Loop)
        .then(|| read_attr(&dir.join("loop/backing_file")))
        .flatten()
        .map(PathBuf::from);
    Disk {
        kind,
        controller: controller.flatten(),
        logical_block_size: read_attr(&dir.join("queue/logical_block_size"))
            .and_then(|s| s.parse().ok()),
        physical_block_size: read_attr(&dir.join("queue/physical_block_size"))
            .and_then(|s| s.parse().ok()),
        read_ahead: read_ahead(dir),
        backing_file,
        sysfs_path: dir.to_path_buf(),
        name,
        dev,
    }
}

fn disk_kind(dir: &Path, name: &str) -> DiskKind {
    let in_path = |pred: &dyn Fn(&str) -> bool| {
        dir.components()
            .any(|c| c.as_os_str().to_str().is_some_and(pred))
    };
    if name.starts_with("loop") {
        DiskKind::Loop
    } else if name.starts_with("nvme") || in_path(&|c| c == "nvme") {
        DiskKind::Nvme
    } else if name.starts_with("vd") || in_path(&|c| c.starts_with("virtio")) {
        DiskKind::Virtio
    } else {
        match read_attr(&dir.join("queue/rotational")).as_deref() {
            Some("1") => DiskKind::Hdd,
            Some("0") => DiskKind::Ssd,
            _ => DiskKind::Unknown,
        }
    }
}

/// The controller of an NVMe namespace: the parent directory when it is a controller
/// (`.../nvme/nvme0/nvme0n1`), else the `nvmeX` prefix of the name (a multipath namespace under
/// `nvme-subsysX`, where X numbers the subsystem).
fn nvme_controller(dir: &Path, name: &str) -> Option<String> {
    let is_controller = |s: &str| {
        s.strip_prefix("nvme")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if let Some(parent) = dir.parent().map(file_name) {
        if is_controller(&parent) {
            return Some(parent);
        }
    }
    let digits = name
        .strip_prefix("nvme")?
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    (digits > 0).then(|| name[..4 + digits].to_owned())
}

fn file_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A sysfs attribute, trimmed; `None` when absent, unreadable or empty. Attributes are
/// optional: a missing one costs a detail, never the resolution.
fn read_attr(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A block device's `queue/read_ahead_kb`, in bytes.
fn read_ahead(dir: &Path) -> Option<u64> {
    read_attr(&dir.join("queue/read_ahead_kb"))
        .and_then(|s| s.parse::<u64>().ok())
        .map(|kib| kib << 10)
}
