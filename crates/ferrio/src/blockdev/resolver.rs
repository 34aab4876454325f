//! [`Resolver`]: resolves a path to its [`DeviceChain`] and caches, per `st_dev`, the device
//! stack and mount table entries it found. It owns the cache and the `stat` of the path; the
//! sysfs walk and the mount table parsing are `sysfs`'s and `mountinfo`'s, and it never opens
//! the file.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use super::mountinfo::{best_mount, fs_type_name, parse_mountinfo, Mount};
use super::{resolve_in, sysfs, DevId, DeviceChain, DeviceStack, MOUNTINFO, SYSFS_ROOT};
use crate::error::{Error, Op, Result};

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
        let (dev, node) = stat_dev(path)?;
        if let Some(entry) = self.cached(dev) {
            return Ok(node_chain(entry.chain_for(path), node));
        }
        let entry = self.load(path, dev)?;
        Ok(node_chain(self.insert(dev, entry).chain_for(path), node))
    }

    /// Like [`resolve`](Self::resolve) but walks sysfs and reads mountinfo again, leaving the
    /// cache alone: for measuring the walk, or when the answer must be fresh.
    pub fn resolve_uncached(&self, path: &Path) -> Result<DeviceChain> {
        let (dev, node) = stat_dev(path)?;
        Ok(node_chain(self.load(path, dev)?.chain_for(path), node))
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
            sysfs::walk(&self.sysfs_root, dev).map_err(|e| Error::io(Op::Resolve, path, 0, 0, e))?
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

/// The device that holds the bytes of `path`: its file system's, or for a block device node
/// the device it stands for (not the devtmpfs holding the node); and whether it is such a node.
fn stat_dev(path: &Path) -> Result<(DevId, bool)> {
    let meta = fs::metadata(path).map_err(|e| Error::io(Op::Stat, path, 0, 0, e))?;
    if meta.file_type().is_block_device() {
        Ok((DevId::from_st_dev(meta.rdev()), true))
    } else {
        Ok((DevId::from_st_dev(meta.dev()), false))
    }
}

/// The chain of a block device node is the device itself: no file system or mount is between
/// (one mounted from the device holds none of the node's bytes).
fn node_chain(mut chain: DeviceChain, node: bool) -> DeviceChain {
    if node {
        chain.fs_type = "block device".to_owned();
        chain.mount_point = None;
    }
    chain
}
