//! Which block devices hold a file: path → `st_dev` → sysfs → partitions, md/dm stacks → disks.
//!
//! ferrio runs one worker pool per physical device so that files on different drives never
//! queue behind each other. This module finds, for a file, the [`PoolKey`] of that pool and the
//! chain of devices under its file system ([`DeviceChain`]). It owns reading sysfs
//! (`/sys/dev/block`, the device directories and their `slaves/`) and `/proc/self/mountinfo`,
//! and the per-`st_dev` cache of what it found ([`Resolver`]). It never opens, reads or writes
//! the file itself; its one syscall beyond plain reads of pseudo-files (`statfs`) lives in `sys`.
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

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use crate::error::{Error, Op, Result};

/// Where the kernel's sysfs is mounted.
pub const SYSFS_ROOT: &str = "/sys";
/// The mount table of this process.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Stacks deeper than this are treated as a loop in sysfs (real stacks are a handful deep).
const MAX_DEPTH: usize = 16;

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

    /// Splits an `st_dev` value (as from [`MetadataExt::dev`]) into major and minor.
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
        match (&mount, stack.has_block_device()) {
            (Some(mount), true) => write!(f, " (mount {mount})")?,
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

/// Resolves files to their [`DeviceChain`], caching what it found per device number.
///
/// The cache holds, per `st_dev`, the device stack and the mount table entries of that device,
/// so opening many files on one file system costs one sysfs walk and one mountinfo read. It is
/// never invalidated on its own: a device number reused for other storage (a loop device
/// detached and attached again) keeps its old answer until [`clear_cache`](Self::clear_cache).
#[derive(Debug)]
pub struct Resolver {
    sysfs_root: PathBuf,
    mountinfo: PathBuf,
    cache: RwLock<HashMap<DevId, Arc<FsEntry>>>,
}

/// What the cache keeps about one file system device.
#[derive(Debug)]
struct FsEntry {
    stack: Arc<DeviceStack>,
    /// The mountinfo entries of this device (several for bind mounts).
    mounts: Vec<Mount>,
    /// The `statfs` type, used when `mounts` is empty.
    statfs_type: Option<String>,
}

impl FsEntry {
    fn chain_for(&self, path: &Path) -> DeviceChain {
        let mount = best_mount(&self.mounts, path);
        let fs_type = match (mount, &self.statfs_type) {
            (Some(mount), _) => mount.fs_type.clone(),
            (None, Some(fs_type)) => fs_type.clone(),
            // Only an entry cached by `Resolver::device` (no path to ask then) lands here.
            (None, None) => crate::sys::statfs::fs_magic(path)
                .map(fs_type_name)
                .unwrap_or_else(|_| "unknown".to_owned()),
        };
        DeviceChain {
            path: path.to_path_buf(),
            fs_type,
            mount_point: mount.map(|m| m.mount_point.clone()),
            device: Arc::clone(&self.stack),
        }
    }
}

impl Resolver {
    /// A resolver reading sysfs under `sysfs_root` and the mount table from `mountinfo`, with
    /// an empty cache. Tests point it at fake trees; everything else uses [`Resolver::system`].
    pub fn new(sysfs_root: impl Into<PathBuf>, mountinfo: impl Into<PathBuf>) -> Self {
        Resolver {
            sysfs_root: sysfs_root.into(),
            mountinfo: mountinfo.into(),
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// The process-wide resolver over [`SYSFS_ROOT`] and [`MOUNTINFO`].
    pub fn system() -> &'static Resolver {
        static SYSTEM: OnceLock<Resolver> = OnceLock::new();
        SYSTEM.get_or_init(|| Resolver::new(SYSFS_ROOT, MOUNTINFO))
    }

    /// The device chain of the file at `path` (symlinks followed), from the cache when its
    /// file system was resolved before.
    pub fn resolve(&self, path: &Path) -> Result<DeviceChain> {
        let dev = stat_dev(path)?;
        if let Some(entry) = self.cached(dev) {
            return Ok(entry.chain_for(path));
        }
        let entry = self.load(path, dev)?;
        Ok(self.insert(dev, entry).chain_for(path))
    }

    /// Like [`resolve`](Self::resolve) but walks sysfs and reads mountinfo again, leaving the
    /// cache alone: for measuring the walk, or when the answer must be fresh.
    pub fn resolve_uncached(&self, path: &Path) -> Result<DeviceChain> {
        let dev = stat_dev(path)?;
        Ok(self.load(path, dev)?.chain_for(path))
    }

    /// The device stack of a device number, from the cache when it was resolved before.
    pub fn device(&self, dev: DevId) -> Result<Arc<DeviceStack>> {
        if let Some(entry) = self.cached(dev) {
            return Ok(Arc::clone(&entry.stack));
        }
        let stack = resolve_in(&self.sysfs_root, dev)?;
        let entry = FsEntry {
            stack: Arc::new(stack),
            mounts: self.mounts_of(dev),
            statfs_type: None,
        };
        Ok(Arc::clone(&self.insert(dev, entry).stack))
    }

    /// Forgets every cached resolution.
    pub fn clear_cache(&self) {
        self.cache
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// How many device numbers are cached.
    pub fn cached_len(&self) -> usize {
        self.cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn cached(&self, dev: DevId) -> Option<Arc<FsEntry>> {
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        cache.get(&dev).cloned()
    }

    /// Caches `entry` unless another thread got there first, and returns what is cached, so
    /// every caller for one device shares one [`DeviceStack`].
    fn insert(&self, dev: DevId, entry: FsEntry) -> Arc<FsEntry> {
        let mut cache = self.cache.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(cache.entry(dev).or_insert_with(|| Arc::new(entry)))
    }

    /// Walks sysfs and reads mountinfo for `dev`, the device of `path`. No lock is held here.
    fn load(&self, path: &Path, dev: DevId) -> Result<FsEntry> {
        let stack = if dev.is_block_device() {
            walk(&self.sysfs_root, dev).map_err(|e| Error::io(Op::Resolve, path, 0, 0, e))?
        } else {
            DeviceStack::without_block_device(dev)
        };
        let mounts = self.mounts_of(dev);
        // statfs only when mountinfo cannot name the type (no /proc, or an unmounted subvolume).
        let statfs_type = if mounts.is_empty() {
            crate::sys::statfs::fs_magic(path).ok().map(fs_type_name)
        } else {
            None
        };
        Ok(FsEntry {
            stack: Arc::new(stack),
            mounts,
            statfs_type,
        })
    }

    /// The mount table entries of `dev`; none when the table cannot be read (no `/proc`), which
    /// only costs the mount point, never the resolution.
    fn mounts_of(&self, dev: DevId) -> Vec<Mount> {
        match fs::read_to_string(&self.mountinfo) {
            Ok(table) => parse_mountinfo(&table)
                .into_iter()
                .filter(|m| m.dev == dev)
                .collect(),
            Err(_) => Vec::new(),
        }
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
    walk(sysfs_root, dev).map_err(|e| Error::io(Op::Resolve, &dev_link(sysfs_root, dev), 0, 0, e))
}

fn stat_dev(path: &Path) -> Result<DevId> {
    let meta = fs::metadata(path).map_err(|e| Error::io(Op::Stat, path, 0, 0, e))?;
    Ok(DevId::from_st_dev(meta.dev()))
}

fn dev_link(sysfs_root: &Path, dev: DevId) -> PathBuf {
    sysfs_root.join("dev/block").join(dev.to_string())
}

/// The sysfs walk; errors are plain `io::Error`s that the caller puts a path on.
fn walk(sysfs_root: &Path, dev: DevId) -> io::Result<DeviceStack> {
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

/// One line of `/proc/self/mountinfo`, the fields this module uses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    dev: DevId,
    mount_point: PathBuf,
    fs_type: String,
}

/// Parses mountinfo (`proc(5)`): `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] -
/// FSTYPE SOURCE SUPER_OPTIONS`. Lines that do not parse are skipped.
fn parse_mountinfo(table: &str) -> Vec<Mount> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dev = DevId::parse(fields.get(2)?)?;
            let mount_point = PathBuf::from(unescape_mount(fields.get(4)?));
            let separator = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            let fs_type = fields.get(separator + 1)?.to_string();
            Some(Mount {
                dev,
                mount_point,
                fs_type,
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` `\`).
fn unescape_mount(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0')))
            .and_then(|n| u8::try_from(n).ok());
        if let Some(byte) = octal {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Of a device's mounts, the one whose mount point is the longest prefix of `path` made
/// absolute (without following symlinks, to stay cheap), else the first.
fn best_mount<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    mounts
        .iter()
        .filter(|m| absolute.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
        .or_else(|| mounts.first())
}

/// A file system name for a `statfs` magic number (`linux/magic.h`).
fn fs_type_name(magic: u32) -> String {
    let name = match magic {
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlay",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0x6573_5546 => "fuse",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0x7371_7368 => "squashfs",
        0x4D44 => "vfat",
        0x5346_544E => "ntfs",
        0x2011_BAB0 => "exfat",
        0x0027_E0EB => "cgroup",
        0x6367_7270 => "cgroup2",
        0x9FA0 => "proc",
        0x6265_6572 => "sysfs",
        0x8584_58F6 => "ramfs",
        _ => return format!("{magic:#x}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests;
