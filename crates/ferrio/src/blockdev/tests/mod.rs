//! Unit tests of block-device resolution, one file per concern of `blockdev`:
//! - `walk`: the sysfs walk on fake sysfs trees modelled on real ones (partitions, NVMe, md,
//!   dm, loops in sysfs);
//! - `keys`: pool keys, device numbers and the one-line displays;
//! - `mountinfo`: mount table parsing, mount choice and `statfs` names;
//! - `resolver`: the whole `resolve(path)` path and its cache, on a real file described by a
//!   fake sysfs and mount table;
//! - `real`: real devices: tmpfs, the source tree, and loop devices when the machine allows
//!   (`loopdev_`).
//!
//! This file holds what they share: [`FakeSysfs`], the fake sysfs builder.

use super::*;

use std::fs;
use std::os::unix::fs::symlink;

use tempfile::TempDir;

mod keys;
mod mountinfo;
mod real;
mod resolver;
mod walk;

/// A fake sysfs in a temporary directory, laid out like the kernel's:
/// `devices/<bus path>/<name>` directories with `dev`, `queue/`, `slaves/`, `holders/`, and
/// relative symlinks `dev/block/MAJ:MIN -> ../../devices/...` and `block/<name> -> ../devices/...`.
/// Paths given to the helpers are relative to `devices/`.
struct FakeSysfs {
    dir: TempDir,
}

const SDA: &str = "pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda";
const VDA: &str = "pci0000:00/0000:00:02.0/virtio1/block/vda";
const LOOP3: &str = "virtual/block/loop3";

fn nvme_ctrl(i: u32) -> String {
    format!("pci0000:00/0000:00:0{i}.0/0000:0{i}:00.0/nvme/nvme{i}")
}

impl FakeSysfs {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("create temp dir");
        fs::create_dir_all(dir.path().join("dev/block")).expect("mkdir dev/block");
        fs::create_dir_all(dir.path().join("block")).expect("mkdir block");
        FakeSysfs { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, rel: &str, contents: &str) {
        let path = self.root().join("devices").join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("mkdir attribute parent");
        }
        fs::write(&path, contents).expect("write attribute");
    }

    /// A block device directory with `dev`, `slaves/`, `holders/` and its `dev/block` link.
    fn device(&self, rel: &str, dev: DevId) {
        let dir = self.root().join("devices").join(rel);
        fs::create_dir_all(dir.join("slaves")).expect("mkdir slaves");
        fs::create_dir_all(dir.join("holders")).expect("mkdir holders");
        self.write(&format!("{rel}/dev"), &format!("{dev}\n"));
        symlink(
            format!("../../devices/{rel}"),
            self.root().join("dev/block").join(dev.to_string()),
        )
        .expect("link dev/block");
    }

    /// A whole disk with its `queue/` attributes and a `block/<name>` link.
    fn disk(&self, rel: &str, dev: DevId, rotational: u8, logical: u64, physical: u64) {
        self.device(rel, dev);
        self.write(
            &format!("{rel}/queue/rotational"),
            &format!("{rotational}\n"),
        );
        self.write(
            &format!("{rel}/queue/logical_block_size"),
            &format!("{logical}\n"),
        );
        self.write(
            &format!("{rel}/queue/physical_block_size"),
            &format!("{physical}\n"),
        );
        self.write(&format!("{rel}/queue/read_ahead_kb"), "8192\n");
        let name = rel.rsplit('/').next().unwrap_or(rel);
        symlink(
            format!("../devices/{rel}"),
            self.root().join("block").join(name),
        )
        .expect("link block/");
    }

    /// Partition `name` inside the disk at `disk_rel`; returns its path relative to `devices/`.
    /// Real partitions have `partition`, `start`, `size`, `dev` and no `queue/`.
    fn partition(&self, disk_rel: &str, name: &str, number: u32, dev: DevId) -> String {
        let rel = format!("{disk_rel}/{name}");
        self.device(&rel, dev);
        self.write(&format!("{rel}/partition"), &format!("{number}\n"));
        self.write(&format!("{rel}/start"), "2048\n");
        rel
    }

    /// An md array at `virtual/block/<name>` over `members`.
    fn md(&self, name: &str, dev: DevId, level: &str, members: &[&str]) -> String {
        let rel = format!("virtual/block/{name}");
        self.disk(&rel, dev, 0, 512, 512);
        self.write(&format!("{rel}/md/level"), &format!("{level}\n"));
        for member in members {
            self.member(&rel, member);
        }
        rel
    }

    /// A device-mapper device at `virtual/block/<name>` over `members`.
    fn dm(&self, name: &str, dev: DevId, dm_name: &str, uuid: &str, members: &[&str]) -> String {
        let rel = format!("virtual/block/{name}");
        self.disk(&rel, dev, 0, 512, 512);
        self.write(&format!("{rel}/dm/name"), &format!("{dm_name}\n"));
        self.write(&format!("{rel}/dm/uuid"), &format!("{uuid}\n"));
        for member in members {
            self.member(&rel, member);
        }
        rel
    }

    /// Links `member` into `holder`'s `slaves/` and `holder` into `member`'s `holders/`, with
    /// relative targets as the kernel writes them.
    fn member(&self, holder: &str, member: &str) {
        let up = |rel: &str| "../".repeat(rel.split('/').count() + 2);
        let name = |rel: &str| rel.rsplit('/').next().unwrap_or(rel).to_owned();
        let devices = self.root().join("devices");
        symlink(
            format!("{}devices/{member}", up(holder)),
            devices.join(holder).join("slaves").join(name(member)),
        )
        .expect("link slaves/");
        symlink(
            format!("{}devices/{holder}", up(member)),
            devices.join(member).join("holders").join(name(holder)),
        )
        .expect("link holders/");
    }

    fn resolve(&self, dev: DevId) -> DeviceStack {
        match resolve_in(self.root(), dev) {
            Ok(stack) => stack,
            Err(e) => panic!("resolving {dev} in the fake sysfs: {e}"),
        }
    }
}

fn names(nodes: &[Node]) -> Vec<(String, usize)> {
    nodes.iter().map(|n| (n.name.clone(), n.depth)).collect()
}

fn disk_names(stack: &DeviceStack) -> Vec<&str> {
    stack.disks.iter().map(|d| d.name.as_str()).collect()
}

/// A plain SATA disk with two partitions.
fn sata_disk(sys: &FakeSysfs) {
    sys.disk(SDA, DevId::new(8, 0), 1, 512, 4096);
    sys.partition(SDA, "sda1", 1, DevId::new(8, 1));
    sys.partition(SDA, "sda2", 2, DevId::new(8, 2));
}
