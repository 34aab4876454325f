//! Which block devices hold a file: path → `st_dev` (for a block device node, `st_rdev`) → sysfs →
//! partitions, md/dm stacks → disks.
//!
//! ferrio runs one worker pool per physical device so that files on different drives never
//! queue behind each other. This module finds, for a file, the [`PoolKey`] of that pool and the
//! chain of devices under its file system ([`DeviceChain`]). It never opens, reads or writes
//! the file itself; its one syscall beyond plain reads of pseudo-files (`statfs`) lives in `sys`.
//!
//! This file holds the public vocabulary (device numbers, disks, nodes, pool keys, stacks,
//! chains and their displays) and the `resolve*` entry points; the work is in one file per
//! concern, none of which the rest of the crate reaches into:
//! - `sysfs`: the walk over sysfs (`/sys/dev/block`, the device directories, their `slaves/`
//!   and attributes) from a device number down to its disks;
//! - `mountinfo`: the mount table (`/proc/self/mountinfo`) and file-system type names;
//! - `resolver`: [`Resolver`], the per-`st_dev` cache of what the other two found.
//!
//! The walk, for a device number `MAJ:MIN`:
//! 1. `SYSFS/dev/block/MAJ:MIN` is a symlink to the device's directory; it is canonicalized.
//! 2. A directory with a `partition` file is a partition: its parent directory is its disk.
//! 3. A directory with entries in `slaves/` is stacked (md RAID, dm: LVM, dm-crypt, multipath):
//!    every member is walked in turn, so nested stacks (LVM over md over partitions) end at disks.
//! 4. Anything else is a disk. NVMe namespaces are pooled by controller (`nvme0n1` and `nvme0n2`
//!    share `nvme0`), because the controller's queues, not the namespace, are the bottleneck.
//!
//! File systems with no block device (tmpfs, overlayfs, NFS, FUSE, btrfs subvolumes: major 0)
//! get a key made from their `st_dev` and no disks.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Op, Result};

mod mountinfo;
mod resolver;
mod sysfs;

pub use resolver::Resolver;

/// Where the kernel's sysfs is mounted.
pub const SYSFS_ROOT: &str = "/sys";
/// The mount table of this process.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// A device number: the `MAJ:MIN` pair of `st_dev` and of sysfs `dev` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevId {
    /// Major number (the driver; 0 for file systems with no block device).
    pub major: u32,
    /// Minor number (the device within the driver).
    pub minor: u32,
}

impl DevId {
    /// A device number from its parts.
    pub const fn new(major: u32, minor: u32) -> Self {
        DevId { major, minor }
    }

    /// Splits an `st_dev` value (as from
    /// [`MetadataExt::dev`](std::os::unix::fs::MetadataExt::dev)) into major and minor.
    pub fn from_st_dev(st_dev: u64) -> Self {
        DevId {
            major: libc::major(st_dev),
            minor: libc::minor(st_dev),
        }
    }

    /// Whether this number can name a block device (major 0 is the kernel's anonymous devices).
    pub fn is_block_device(self) -> bool {
        self.major != 0
    }

    /// Parses `MAJ:MIN` as written in sysfs `dev` files and in mountinfo.
    fn parse(s: &str) -> Option<Self> {
        let (major, minor) = s.trim().split_once(':')?;
        Some(DevId {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }
}

impl fmt::Display for DevId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// What kind of physical device a disk is, which decides its default worker count
/// (the pool's thread policy, `pool::threads` inside the crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DiskKind {
    /// An NVMe namespace.
    Nvme,
    /// A rotating disk (`queue/rotational` is 1 and it is not virtio).
    Hdd,
    /// A non-rotating SATA/SAS/SCSI disk (`queue/rotational` is 0).
    Ssd,
    /// A virtio block device (`vd*`, under a `virtio*` device). Its `rotational` flag is
    /// usually 1 and says nothing about the storage behind it, so it is not trusted.
    Virtio,
    /// A loop device backed by a file.
    Loop,
    /// Anything sysfs does not tell enough about.
    Unknown,
}

impl DiskKind {
    /// The lower-case name used in displays.
    pub fn as_str(self) -> &'static str {
        match self {
            DiskKind::Nvme => "nvme",
            DiskKind::Hdd => "hdd",
            DiskKind::Ssd => "ssd",
            DiskKind::Virtio => "virtio",
            DiskKind::Loop => "loop",
            DiskKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for DiskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A physical (leaf) disk under a file system.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Disk {
    /// Kernel name (`nvme0n1`, `sda`, `loop3`).
    pub name: String,
    /// Device number, from its sysfs `dev` file.
    pub dev: Option<DevId>,
    /// What kind of device it is.
    pub kind: DiskKind,
    /// For NVMe, the controller that owns the namespace (`nvme0`).
    pub controller: Option<String>,
    /// `queue/logical_block_size` in bytes: the smallest unit of direct I/O.
    pub logical_block_size: Option<u64>,
    /// `queue/physical_block_size` in bytes: writes smaller than this are read-modify-write.
    pub physical_block_size: Option<u64>,
    /// `queue/read_ahead_kb` in bytes: the kernel's readahead window for each sequential reader
    /// of a file whose file system sits on this disk or one of its partitions, which sets how
    /// many requests a read through the page cache keeps in flight. (Under LVM, md or another
    /// stacked device, the top device's own window applies instead: [`Node::read_ahead`],
    /// [`DeviceStack::read_ahead`].)
    pub read_ahead: Option<u64>,
    /// For a loop device, the file behind it (`loop/backing_file`).
    pub backing_file: Option<PathBuf>,
    /// The disk's directory in sysfs (canonical).
    pub sysfs_path: PathBuf,
}

impl Disk {
    /// The name this disk contributes to a [`PoolKey`]: the NVMe controller, else its own name.
    pub fn pool_member(&self) -> &str {
        self.controller.as_deref().unwrap_or(&self.name)
    }
}

impl fmt::Display for Disk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.name, self.kind)?;
        if let Some(file) = &self.backing_file {
            write!(f, " of {}", file.display())?;
        }
        if let Some(controller) = &self.controller {
            write!(f, " on {controller}")?;
        }
        if let Some(logical) = self.logical_block_size {
            write!(f, ", {logical} B logical")?;
            if let Some(physical) = self.physical_block_size.filter(|&p| p != logical) {
                write!(f, ", {physical} B physical")?;
            }
        }
        if let Some(window) = self.read_ahead {
            write!(f, ", readahead {}", crate::config::format_size(window))?;
        }
        f.write_str(")")
    }
}

/// The role of one device in the chain under a file system.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeKind {
    /// A whole disk (a leaf; it also appears in [`DeviceStack::disks`]).
    Disk,
    /// A partition of the next node.
    Partition {
        /// The partition number (`partition` file).
        number: Option<u32>,
    },
    /// An md software RAID device over the next nodes.
    Md {
        /// The RAID level (`md/level`: `raid0`, `raid1`, ...).
        level: Option<String>,
    },
    /// A device-mapper device (LVM, dm-crypt, multipath) over the next nodes.
    Dm {
        /// The dm name (`dm/name`, e.g. `vg0-root`).
        name: Option<String>,
        /// The subsystem that made it, from the `dm/uuid` prefix, lower-cased (`lvm`, `crypt`,
        /// `mpath`).
        subsystem: Option<String>,
    },
    /// Some other device with members in `slaves/` (bcache, ...).
    Stacked,
}

/// One device in the chain under a file system.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Node {
    /// Kernel name (`dm-0`, `md0`, `nvme0n1p1`).
    pub name: String,
    /// Device number, from its sysfs `dev` file.
    pub dev: Option<DevId>,
    /// What it is.
    pub kind: NodeKind,
    /// Distance from the file system's device (0); members of a node have its depth + 1.
    pub depth: usize,
    /// A stacked device's own `queue/read_ahead_kb`, in bytes: the readahead window of a file
    /// system on it. `None` for disks and partitions (see [`Disk::read_ahead`]).
    pub read_ahead: Option<u64>,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            NodeKind::Disk => write!(f, "disk {}", self.name),
            NodeKind::Partition { .. } => write!(f, "partition {}", self.name),
            NodeKind::Md { level: Some(level) } => write!(f, "{} ({level})", self.name),
            NodeKind::Dm { name, subsystem } => {
                let label: Vec<&str> = [subsystem.as_deref(), name.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect();
                if label.is_empty() {
                    write!(f, "{} (dm)", self.name)
                } else {
                    write!(f, "{} ({})", self.name, label.join(" "))
                }
            }
            NodeKind::Md { level: None } | NodeKind::Stacked => f.write_str(&self.name),
        }
    }
}

/// Names the worker pool a file's I/O runs on: equal keys share a pool.
///
/// For a block device the key is the sorted set of its *pool members*: disk names, or for NVMe
/// the controller (`nvme0`). A file system on one disk or on any partition of it has that
/// disk's key; an md/dm stack has its members' set (displayed `nvme0+nvme1+nvme2+nvme3`). The
/// stack's own name (`md0`) is deliberately not part of the key: two arrays over the same disks
/// compete for the same queues and so share a pool. A key never mixes partial overlaps, so a
/// file on `sda1` and one on an md over `sda2+sdb2` get different pools.
///
/// A file system with no block device has the key `fs:MAJ:MIN` from its `st_dev`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey(KeyRepr);

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum KeyRepr {
    /// Sorted, without duplicates, never empty.
    Members(Box<[String]>),
    NoBlockDevice(DevId),
}

impl PoolKey {
    /// A key for a set of pool members (disk or NVMe controller names); order and duplicates
    /// do not matter. `None` when `members` is empty.
    pub fn from_members<I, S>(members: I) -> Option<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort_unstable();
        members.dedup();
        (!members.is_empty()).then(|| PoolKey(KeyRepr::Members(members.into_boxed_slice())))
    }

    /// The key of a file system with no block device, from its `st_dev`.
    pub fn no_block_device(dev: DevId) -> Self {
        PoolKey(KeyRepr::NoBlockDevice(dev))
    }

    /// The pool members, sorted; empty for a file system with no block device.
    pub fn members(&self) -> &[String] {
        match &self.0 {
            KeyRepr::Members(members) => members,
            KeyRepr::NoBlockDevice(_) => &[],
        }
    }

    /// How many independent devices (disks, NVMe controllers) back this pool: 4 for a RAID-0
    /// over four drives. 0 for a file system with no block device.
    pub fn disk_count(&self) -> usize {
        self.members().len()
    }

    /// Whether the key names block devices (false for tmpfs, NFS, FUSE, ...).
    pub fn is_block_device(&self) -> bool {
        matches!(self.0, KeyRepr::Members(_))
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyRepr::Members(members) => f.write_str(&members.join("+")),
            KeyRepr::NoBlockDevice(dev) => write!(f, "fs:{dev}"),
        }
    }
}

/// The block devices under one device number: what [`resolve_in`] finds in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceStack {
    /// The device number that was resolved (the file system's `st_dev`).
    pub dev: DevId,
    /// Every device from `dev` down to the disks, depth first, members in name order: file
    /// system device → partition / md / dm → ... → disks. A disk reached twice (RAID-1 over two
    /// partitions of one disk) appears twice here, once in [`disks`](Self::disks). Empty when
    /// there is no block device.
    pub nodes: Vec<Node>,
    /// The distinct physical disks, in the order first reached.
    pub disks: Vec<Disk>,
    /// The pool these devices' I/O runs on.
    pub pool: PoolKey,
}

impl DeviceStack {
    /// The stack of a file system with no block device.
    fn without_block_device(dev: DevId) -> Self {
        DeviceStack {
            dev,
            nodes: Vec::new(),
            disks: Vec::new(),
            pool: PoolKey::no_block_device(dev),
        }
    }

    /// Whether a block device backs this file system.
    pub fn has_block_device(&self) -> bool {
        self.pool.is_block_device()
    }

    /// The readahead window of buffered reads of files on this file system, in bytes: its
    /// device's own where that is a stacked device (md, dm), else its disk's. `None` without a
    /// block device or where sysfs does not say.
    pub fn read_ahead(&self) -> Option<u64> {
        let top = self.nodes.first()?;
        match top.kind {
            NodeKind::Disk | NodeKind::Partition { .. } => {
                self.disks.first().and_then(|d| d.read_ahead)
            }
            _ => top.read_ahead,
        }
    }
}

/// A file resolved to its file system, mount point and device stack.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceChain {
    /// The file, as given.
    pub path: PathBuf,
    /// The file system type (`ext4`, `xfs`, `tmpfs`, `nfs4`, `fuse.sshfs`), from mountinfo, else
    /// from `statfs` (`0x...` when the magic number is not one this module knows).
    pub fs_type: String,
    /// Where the file system is mounted: of the mounts of this device, the one whose mount
    /// point is the longest prefix of the file's absolute path (symlinks in the path are not
    /// followed; when none is a prefix, the first mount). `None` when mountinfo has no entry
    /// for the device (for example a btrfs subvolume that is not mounted by itself).
    pub mount_point: Option<PathBuf>,
    /// The devices under the file system, shared by every file of it.
    pub device: Arc<DeviceStack>,
}

impl DeviceChain {
    /// The file system's device number (`st_dev`).
    pub fn dev(&self) -> DevId {
        self.device.dev
    }

    /// The pool this file's I/O runs on.
    pub fn pool(&self) -> &PoolKey {
        &self.device.pool
    }

    /// The physical disks under the file.
    pub fn disks(&self) -> &[Disk] {
        &self.device.disks
    }

    /// The devices from the file system's down to the disks (see [`DeviceStack::nodes`]).
    pub fn nodes(&self) -> &[Node] {
        &self.device.nodes
    }

    /// Whether a block device backs this file.
    pub fn has_block_device(&self) -> bool {
        self.device.has_block_device()
    }
}

/// One line, for example
/// `file /mnt/d0/x → ext4 on loop3 (mount /mnt/d0) → disk loop3 (loop, 512 B logical) → pool loop3`.
impl fmt::Display for DeviceChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file {} → {}", self.path.display(), self.fs_type)?;
        let stack = &*self.device;
        if let Some(top) = stack.nodes.first() {
            write!(f, " on {}", top.name)?;
        }
        let mount = self.mount_point.as_ref().map(|m| m.display());
        // A stacked device's window governs the file system's buffered reads, not its disks'.
        let window = stack
            .nodes
            .first()
            .and_then(|top| top.read_ahead)
            .map(|w| format!(", readahead {}", crate::config::format_size(w)))
            .unwrap_or_default();
        match (&mount, stack.has_block_device()) {
            (Some(mount), true) => write!(f, " (mount {mount}{window})")?,
            (Some(mount), false) => write!(f, " (mount {mount}), no block device {}", stack.dev)?,
            (None, true) => {}
            (None, false) => write!(f, ", no block device {}", stack.dev)?,
        }
        // The stacked devices between the file system's device and the disks, one step per
        // depth; a device reached along several paths is shown once.
        let max_depth = stack.nodes.iter().map(|n| n.depth).max().unwrap_or(0);
        for depth in 1..=max_depth {
            let mut seen = HashSet::new();
            let step: Vec<String> = stack
                .nodes
                .iter()
                .filter(|n| n.depth == depth && n.kind != NodeKind::Disk)
                .filter(|n| seen.insert(n.name.as_str()))
                .map(Node::to_string)
                .collect();
            if !step.is_empty() {
                write!(f, " → {}", step.join(", "))?;
            }
        }
        if !stack.disks.is_empty() {
            let disks: Vec<String> = stack.disks.iter().map(Disk::to_string).collect();
            let noun = if disks.len() == 1 { "disk" } else { "disks" };
            write!(f, " → {noun} {}", disks.join(", "))?;
        }
        write!(f, " → pool {}", stack.pool)
    }
}

/// The device chain of the file at `path`, through the process-wide cache
/// ([`Resolver::system`]).
pub fn resolve(path: &Path) -> Result<DeviceChain> {
    Resolver::system().resolve(path)
}

/// The device chain of the file at `path`, walking `/sys` again without touching the cache.
pub fn resolve_uncached(path: &Path) -> Result<DeviceChain> {
    Resolver::system().resolve_uncached(path)
}

/// Walks the sysfs tree under `sysfs_root` (normally `/sys`) from the device `dev` down to its
/// disks. Never cached. A device number with major 0 has no block device and needs no sysfs.
///
/// Errors (as [`Error::Io`] with [`Op::Resolve`] on `SYSFS/dev/block/MAJ:MIN`) when the number
/// is not in sysfs, a member link is broken, or the stack is deeper than sysfs can be.
pub fn resolve_in(sysfs_root: &Path, dev: DevId) -> Result<DeviceStack> {
    if !dev.is_block_device() {
        return Ok(DeviceStack::without_block_device(dev));
    }
    sysfs::walk(sysfs_root, dev)
        .map_err(|e| Error::io(Op::Resolve, &sysfs::dev_link(sysfs_root, dev), 0, 0, e))
}

#[cfg(test)]
mod tests;
