//! Tests of the sysfs walk on fake sysfs trees modelled on real ones, of mountinfo parsing, of
//! the cache, and on real devices: tmpfs, and loop devices when the machine allows (`loopdev_`).

use super::*;
use crate::pool::{default_threads, suggested_threads};

use std::os::unix::fs::symlink;
use std::sync::Barrier;

use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Fake sysfs
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Walks over fake trees
// ---------------------------------------------------------------------------------------------

#[test]
fn partition_resolves_to_its_whole_disk() {
    let sys = FakeSysfs::new();
    sata_disk(&sys);

    let stack = sys.resolve(DevId::new(8, 2));
    assert_eq!(stack.dev, DevId::new(8, 2));
    assert_eq!(
        names(&stack.nodes),
        [("sda2".to_owned(), 0), ("sda".to_owned(), 1)]
    );
    assert_eq!(stack.nodes[0].kind, NodeKind::Partition { number: Some(2) });
    assert_eq!(stack.nodes[0].dev, Some(DevId::new(8, 2)));
    assert_eq!(stack.nodes[1].kind, NodeKind::Disk);
    assert_eq!(disk_names(&stack), ["sda"]);
    let sda = &stack.disks[0];
    assert_eq!(sda.kind, DiskKind::Hdd);
    assert_eq!(sda.dev, Some(DevId::new(8, 0)));
    assert_eq!(sda.logical_block_size, Some(512));
    assert_eq!(sda.physical_block_size, Some(4096));
    assert_eq!(sda.controller, None);
    assert_eq!(stack.pool.to_string(), "sda");
    assert_eq!(stack.pool.disk_count(), 1);
    assert_eq!(
        suggested_threads(Some(&stack)),
        default_threads(DiskKind::Hdd)
    );

    // The whole disk and the other partition share the pool.
    let whole = sys.resolve(DevId::new(8, 0));
    assert_eq!(names(&whole.nodes), [("sda".to_owned(), 0)]);
    assert_eq!(whole.pool, stack.pool);
    assert_eq!(sys.resolve(DevId::new(8, 1)).pool, stack.pool);
}

#[test]
fn nvme_namespaces_of_one_controller_share_a_pool() {
    let sys = FakeSysfs::new();
    let ctrl = nvme_ctrl(0);
    let ns1 = format!("{ctrl}/nvme0n1");
    let ns2 = format!("{ctrl}/nvme0n2");
    sys.disk(&ns1, DevId::new(259, 0), 0, 4096, 4096);
    sys.disk(&ns2, DevId::new(259, 1), 0, 512, 512);
    sys.partition(&ns1, "nvme0n1p1", 1, DevId::new(259, 2));
    // A second controller must get its own pool.
    sys.disk(
        &format!("{}/nvme1n1", nvme_ctrl(1)),
        DevId::new(259, 3),
        0,
        512,
        512,
    );

    let a = sys.resolve(DevId::new(259, 0));
    let b = sys.resolve(DevId::new(259, 1));
    let p = sys.resolve(DevId::new(259, 2));
    let other = sys.resolve(DevId::new(259, 3));
    assert_eq!(a.disks[0].kind, DiskKind::Nvme);
    assert_eq!(a.disks[0].controller.as_deref(), Some("nvme0"));
    assert_eq!(a.disks[0].logical_block_size, Some(4096));
    assert_eq!(a.pool.to_string(), "nvme0");
    assert_eq!(a.pool, b.pool);
    assert_eq!(a.pool, p.pool);
    assert_eq!(disk_names(&p), ["nvme0n1"]);
    assert_ne!(a.pool, other.pool);
    assert_eq!(other.pool.to_string(), "nvme1");
    assert_eq!(suggested_threads(Some(&a)), default_threads(DiskKind::Nvme));
}

#[test]
fn md_raid0_over_four_nvme_partitions_has_four_disks() {
    let sys = FakeSysfs::new();
    let mut parts = Vec::new();
    for i in 0..4 {
        let ns = format!("{}/nvme{i}n1", nvme_ctrl(i));
        sys.disk(&ns, DevId::new(259, i * 2), 0, 512, 512);
        parts.push(sys.partition(&ns, &format!("nvme{i}n1p1"), 1, DevId::new(259, i * 2 + 1)));
    }
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    sys.md("md0", DevId::new(9, 0), "raid0", &parts);

    let stack = sys.resolve(DevId::new(9, 0));
    assert_eq!(
        stack.nodes[0].kind,
        NodeKind::Md {
            level: Some("raid0".to_owned())
        }
    );
    let expected_nodes: Vec<(String, usize)> = std::iter::once(("md0".to_owned(), 0))
        .chain((0..4).flat_map(|i| [(format!("nvme{i}n1p1"), 1), (format!("nvme{i}n1"), 2)]))
        .collect();
    assert_eq!(names(&stack.nodes), expected_nodes);
    assert_eq!(
        disk_names(&stack),
        ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"]
    );
    assert!(stack.disks.iter().all(|d| d.kind == DiskKind::Nvme));
    assert_eq!(stack.pool.disk_count(), 4);
    assert_eq!(stack.pool.members(), ["nvme0", "nvme1", "nvme2", "nvme3"]);
    assert_eq!(stack.pool.to_string(), "nvme0+nvme1+nvme2+nvme3");
    assert_eq!(
        suggested_threads(Some(&stack)),
        4 * default_threads(DiskKind::Nvme)
    );
}

#[test]
fn md_over_namespaces_of_one_controller_is_one_pool_member() {
    let sys = FakeSysfs::new();
    let ns1 = format!("{}/nvme0n1", nvme_ctrl(0));
    let ns2 = format!("{}/nvme0n2", nvme_ctrl(0));
    sys.disk(&ns1, DevId::new(259, 0), 0, 512, 512);
    sys.disk(&ns2, DevId::new(259, 1), 0, 512, 512);
    sys.md("md5", DevId::new(9, 5), "raid0", &[&ns1, &ns2]);

    let stack = sys.resolve(DevId::new(9, 5));
    assert_eq!(disk_names(&stack), ["nvme0n1", "nvme0n2"]);
    assert_eq!(stack.pool.to_string(), "nvme0");
    assert_eq!(stack.pool.disk_count(), 1);
    assert_eq!(
        suggested_threads(Some(&stack)),
        default_threads(DiskKind::Nvme)
    );
}

#[test]
fn dm_crypt_over_a_partition_resolves_to_the_disk() {
    let sys = FakeSysfs::new();
    sata_disk(&sys);
    let sda2 = format!("{SDA}/sda2");
    sys.dm(
        "dm-0",
        DevId::new(253, 0),
        "luks-root",
        "CRYPT-LUKS2-0123456789abcdef-luks-root",
        &[&sda2],
    );

    let stack = sys.resolve(DevId::new(253, 0));
    assert_eq!(
        names(&stack.nodes),
        [
            ("dm-0".to_owned(), 0),
            ("sda2".to_owned(), 1),
            ("sda".to_owned(), 2)
        ]
    );
    assert_eq!(
        stack.nodes[0].kind,
        NodeKind::Dm {
            name: Some("luks-root".to_owned()),
            subsystem: Some("crypt".to_owned()),
        }
    );
    assert_eq!(stack.nodes[0].to_string(), "dm-0 (crypt luks-root)");
    assert_eq!(disk_names(&stack), ["sda"]);
    // Encrypted or not, I/O lands on sda: same pool as a plain file system on sda1.
    assert_eq!(stack.pool, sys.resolve(DevId::new(8, 1)).pool);
}

#[test]
fn lvm_over_md_over_disks_is_walked_to_the_disks() {
    let sys = FakeSysfs::new();
    let sdb = SDA.replace("0:0:0:0", "1:0:0:0").replace("/sda", "/sdb");
    let sdc = SDA.replace("0:0:0:0", "2:0:0:0").replace("/sda", "/sdc");
    sys.disk(&sdb, DevId::new(8, 16), 0, 512, 4096);
    sys.disk(&sdc, DevId::new(8, 32), 0, 512, 4096);
    let sdb1 = sys.partition(&sdb, "sdb1", 1, DevId::new(8, 17));
    let md1 = sys.md("md1", DevId::new(9, 1), "raid1", &[&sdb1, &sdc]);
    sys.dm(
        "dm-3",
        DevId::new(253, 3),
        "vg0-data",
        "LVM-abcdefabcdefabcdefabcdefabcdefabcdef",
        &[&md1],
    );

    let stack = sys.resolve(DevId::new(253, 3));
    assert_eq!(
        names(&stack.nodes),
        [
            ("dm-3".to_owned(), 0),
            ("md1".to_owned(), 1),
            ("sdb1".to_owned(), 2),
            ("sdb".to_owned(), 3),
            ("sdc".to_owned(), 2),
        ]
    );
    assert!(matches!(
        &stack.nodes[0].kind,
        NodeKind::Dm { subsystem: Some(s), .. } if s == "lvm"
    ));
    assert_eq!(disk_names(&stack), ["sdb", "sdc"]);
    assert!(stack.disks.iter().all(|d| d.kind == DiskKind::Ssd));
    assert_eq!(stack.pool.to_string(), "sdb+sdc");
    assert_eq!(stack.pool.disk_count(), 2);
}

#[test]
fn raid1_over_two_partitions_of_one_disk_counts_the_disk_once() {
    let sys = FakeSysfs::new();
    sata_disk(&sys);
    let sda1 = format!("{SDA}/sda1");
    let sda2 = format!("{SDA}/sda2");
    sys.md("md2", DevId::new(9, 2), "raid1", &[&sda1, &sda2]);

    let stack = sys.resolve(DevId::new(9, 2));
    // The tree shows both paths; the disk list and the key have sda once.
    assert_eq!(stack.nodes.iter().filter(|n| n.name == "sda").count(), 2);
    assert_eq!(disk_names(&stack), ["sda"]);
    assert_eq!(stack.pool.to_string(), "sda");
}

#[test]
fn virtio_disk_is_not_taken_for_a_rotating_one() {
    let sys = FakeSysfs::new();
    // Like this machine's vda: rotational 1, 512 logical, 4096 physical.
    sys.disk(VDA, DevId::new(254, 0), 1, 512, 4096);

    let stack = sys.resolve(DevId::new(254, 0));
    assert_eq!(stack.disks[0].kind, DiskKind::Virtio);
    assert_eq!(
        stack.disks[0].to_string(),
        "vda (virtio, 512 B logical, 4096 B physical)"
    );
}

#[test]
fn loop_disk_reports_its_backing_file() {
    let sys = FakeSysfs::new();
    sys.disk(LOOP3, DevId::new(7, 3), 0, 512, 512);
    sys.write(&format!("{LOOP3}/loop/backing_file"), "/img/d0.img\n");

    let stack = sys.resolve(DevId::new(7, 3));
    let disk = &stack.disks[0];
    assert_eq!(disk.kind, DiskKind::Loop);
    assert_eq!(disk.backing_file.as_deref(), Some(Path::new("/img/d0.img")));
    assert_eq!(stack.pool.to_string(), "loop3");
}

#[test]
fn disk_kind_falls_back_to_rotational_and_unknown() {
    let sys = FakeSysfs::new();
    let sdd = SDA.replace("/sda", "/sdd");
    sys.disk(&sdd, DevId::new(8, 48), 0, 512, 512);
    let odd = "virtual/block/odd0";
    sys.device(odd, DevId::new(240, 0));

    assert_eq!(sys.resolve(DevId::new(8, 48)).disks[0].kind, DiskKind::Ssd);
    let odd = sys.resolve(DevId::new(240, 0));
    assert_eq!(odd.disks[0].kind, DiskKind::Unknown);
    assert_eq!(odd.disks[0].logical_block_size, None);
    assert_eq!(odd.disks[0].to_string(), "odd0 (unknown)");
}

#[test]
fn device_number_missing_from_sysfs_is_a_clear_error() {
    let sys = FakeSysfs::new();
    sata_disk(&sys);

    let err = resolve_in(sys.root(), DevId::new(259, 9)).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("block device 259:9 is not in sysfs"),
        "{message}"
    );
    assert!(
        matches!(
            err,
            Error::Io {
                op: Op::Resolve,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.os_error().map(io::Error::kind),
        Some(io::ErrorKind::NotFound)
    );
    assert_eq!(err.path(), Some(&*sys.root().join("dev/block/259:9")));
}

#[test]
fn broken_member_link_is_an_error() {
    let sys = FakeSysfs::new();
    sys.md("md3", DevId::new(9, 3), "raid0", &[]);
    symlink(
        "../../../../devices/virtual/block/gone",
        sys.root().join("devices/virtual/block/md3/slaves/gone"),
    )
    .expect("link");

    let err = resolve_in(sys.root(), DevId::new(9, 3)).unwrap_err();
    assert!(err.to_string().contains("slaves/gone"), "{err}");
}

#[test]
fn a_loop_in_sysfs_ends_in_an_error_not_a_stack_overflow() {
    let sys = FakeSysfs::new();
    let a = sys.md("md4", DevId::new(9, 4), "raid1", &[]);
    let b = sys.md("md6", DevId::new(9, 6), "raid1", &[&a]);
    sys.member(&a, &b);

    let err = resolve_in(sys.root(), DevId::new(9, 4)).unwrap_err();
    assert!(err.to_string().contains("deeper than"), "{err}");
}

#[test]
fn major_zero_needs_no_sysfs() {
    let stack = match resolve_in(Path::new("/nonexistent/sysfs"), DevId::new(0, 45)) {
        Ok(stack) => stack,
        Err(e) => panic!("{e}"),
    };
    assert!(!stack.has_block_device());
    assert!(stack.nodes.is_empty() && stack.disks.is_empty());
    assert_eq!(stack.pool.to_string(), "fs:0:45");
    assert_eq!(stack.pool.disk_count(), 0);
    assert_eq!(
        suggested_threads(Some(&stack)),
        default_threads(DiskKind::Unknown)
    );
}

// ---------------------------------------------------------------------------------------------
// Keys, display, parsing
// ---------------------------------------------------------------------------------------------

#[test]
fn pool_keys_ignore_member_order_and_duplicates() {
    let a = PoolKey::from_members(["nvme1", "nvme0", "nvme1"]);
    let b = PoolKey::from_members(vec!["nvme0".to_owned(), "nvme1".to_owned()]);
    assert_eq!(a, b);
    assert_eq!(a.map(|k| k.to_string()).as_deref(), Some("nvme0+nvme1"));
    assert_eq!(PoolKey::from_members(Vec::<String>::new()), None);
    let fs = PoolKey::no_block_device(DevId::new(0, 45));
    assert!(!fs.is_block_device());
    assert!(fs.members().is_empty());
    assert_ne!(Some(fs), PoolKey::from_members(["fs:0:45"]));
}

#[test]
fn dev_id_splits_st_dev_like_the_kernel() {
    // makedev(259, 1) and makedev(0, 45) in glibc's encoding; big numbers use the high bits.
    assert_eq!(DevId::from_st_dev(0x10301), DevId::new(259, 1));
    assert_eq!(DevId::from_st_dev(45), DevId::new(0, 45));
    assert_eq!(
        DevId::from_st_dev(libc::makedev(4095 + 1, 1 << 20)),
        DevId::new(4096, 1 << 20)
    );
    assert_eq!(DevId::parse(" 8:17\n"), Some(DevId::new(8, 17)));
    assert_eq!(DevId::parse("8-17"), None);
}

#[test]
fn display_of_a_loop_chain() {
    let sys = FakeSysfs::new();
    sys.disk(LOOP3, DevId::new(7, 3), 0, 512, 512);
    sys.write(&format!("{LOOP3}/loop/backing_file"), "/img/d0.img\n");
    let chain = DeviceChain {
        path: PathBuf::from("/mnt/d0/x"),
        fs_type: "ext4".to_owned(),
        mount_point: Some(PathBuf::from("/mnt/d0")),
        device: Arc::new(sys.resolve(DevId::new(7, 3))),
    };
    assert_eq!(
        chain.to_string(),
        "file /mnt/d0/x → ext4 on loop3 (mount /mnt/d0) → disk loop3 (loop of /img/d0.img, \
         512 B logical) → pool loop3"
    );
}

#[test]
fn display_of_lvm_over_md_and_of_no_block_device() {
    let sys = FakeSysfs::new();
    let mut parts = Vec::new();
    for i in 0..2 {
        let ns = format!("{}/nvme{i}n1", nvme_ctrl(i));
        sys.disk(&ns, DevId::new(259, i * 2), 0, 512, 512);
        parts.push(sys.partition(&ns, &format!("nvme{i}n1p1"), 1, DevId::new(259, i * 2 + 1)));
    }
    let md0 = sys.md("md0", DevId::new(9, 0), "raid0", &[&parts[0], &parts[1]]);
    sys.dm("dm-1", DevId::new(253, 1), "vg-data", "LVM-xyz", &[&md0]);
    let chain = DeviceChain {
        path: PathBuf::from("/data/f"),
        fs_type: "xfs".to_owned(),
        mount_point: Some(PathBuf::from("/data")),
        device: Arc::new(sys.resolve(DevId::new(253, 1))),
    };
    assert_eq!(
        chain.to_string(),
        "file /data/f → xfs on dm-1 (mount /data) → md0 (raid0) → partition nvme0n1p1, \
         partition nvme1n1p1 → disks nvme0n1 (nvme on nvme0, 512 B logical), nvme1n1 (nvme on \
         nvme1, 512 B logical) → pool nvme0+nvme1"
    );

    let tmp = DeviceChain {
        path: PathBuf::from("/dev/shm/x"),
        fs_type: "tmpfs".to_owned(),
        mount_point: Some(PathBuf::from("/dev/shm")),
        device: Arc::new(DeviceStack::without_block_device(DevId::new(0, 23))),
    };
    assert_eq!(
        tmp.to_string(),
        "file /dev/shm/x → tmpfs (mount /dev/shm), no block device 0:23 → pool fs:0:23"
    );
}

const MOUNTINFO_SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24731708k
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
40 27 254:0 /srv/data /mnt/my\\040data rw,relatime shared:1 master:2 - ext4 /dev/vda rw
41 27 259:3 / /mnt/nvme rw - xfs /dev/nvme0n1p1 rw
garbage line
42 27 0:50 / /mnt/fuse rw,nosuid - fuse.sshfs host:/ rw
";

#[test]
fn mountinfo_lines_are_parsed_with_escapes_and_optional_fields() {
    let mounts = parse_mountinfo(MOUNTINFO_SAMPLE);
    assert_eq!(mounts.len(), 6, "{mounts:?}");
    assert_eq!(
        mounts[3],
        Mount {
            dev: DevId::new(254, 0),
            mount_point: PathBuf::from("/mnt/my data"),
            fs_type: "ext4".to_owned(),
        }
    );
    assert_eq!(mounts[5].fs_type, "fuse.sshfs");
    assert_eq!(mounts[5].dev, DevId::new(0, 50));
    assert_eq!(unescape_mount("a\\011b\\134c\\012"), "a\tb\\c\n");
    assert_eq!(unescape_mount("trailing\\04"), "trailing\\04");
}

#[test]
fn the_longest_matching_mount_point_wins() {
    let mounts: Vec<Mount> = parse_mountinfo(MOUNTINFO_SAMPLE)
        .into_iter()
        .filter(|m| m.dev == DevId::new(254, 0))
        .collect();
    let pick = |p: &str| best_mount(&mounts, Path::new(p)).map(|m| m.mount_point.clone());
    assert_eq!(pick("/mnt/my data/x"), Some(PathBuf::from("/mnt/my data")));
    assert_eq!(pick("/home/x"), Some(PathBuf::from("/")));
    // Path-component prefix, not string prefix.
    assert_eq!(pick("/mnt/my data2/x"), Some(PathBuf::from("/")));
    assert_eq!(best_mount(&[], Path::new("/x")), None);
}

#[test]
fn statfs_magic_names() {
    assert_eq!(fs_type_name(0x0102_1994), "tmpfs");
    assert_eq!(fs_type_name(0x9123_683E), "btrfs");
    assert_eq!(fs_type_name(0x1234), "0x1234");
}

// ---------------------------------------------------------------------------------------------
// Resolver: a real file, a fake sysfs holding its device number, a fake mount table
// ---------------------------------------------------------------------------------------------

/// A fake sysfs and mountinfo describing the real device of a real file, so the whole
/// `resolve(path)` path runs against fakes. `None` (with the reason printed) when the temporary
/// directory has no block device.
struct FakeMachine {
    sys: FakeSysfs,
    file: PathBuf,
    dev: DevId,
    resolver: Resolver,
}

fn fake_machine() -> Option<FakeMachine> {
    let sys = FakeSysfs::new();
    let file = sys.root().join("data/file");
    fs::create_dir_all(sys.root().join("data")).expect("mkdir data");
    fs::write(&file, b"x").expect("write file");
    let dev = DevId::from_st_dev(fs::metadata(&file).expect("stat").dev());
    if !dev.is_block_device() {
        eprintln!("skipped: the temp dir is on a file system without a block device ({dev})");
        return None;
    }
    let disk = format!("{}/nvme7n1", nvme_ctrl(7));
    sys.disk(&disk, dev, 0, 512, 512);
    let data = sys.root().join("data");
    let mountinfo = sys.root().join("mountinfo");
    fs::write(
        &mountinfo,
        format!(
            "27 1 {dev} / / rw - ext4 /dev/fake rw\n\
             28 27 {dev} /x {} rw - xfs /dev/fake rw\n\
             29 27 0:23 / /dev/shm rw - tmpfs tmpfs rw\n",
            data.display()
        ),
    )
    .expect("write mountinfo");
    let resolver = Resolver::new(sys.root(), &mountinfo);
    Some(FakeMachine {
        sys,
        file,
        dev,
        resolver,
    })
}

#[test]
fn resolve_reads_fake_sysfs_and_mountinfo_and_caches_per_device() {
    let Some(m) = fake_machine() else { return };
    let first = m.resolver.resolve(&m.file).expect("resolve");
    assert_eq!(first.dev(), m.dev);
    assert_eq!(first.pool().to_string(), "nvme7");
    assert_eq!(
        first.fs_type, "xfs",
        "the bind mount at data/ is the longest prefix"
    );
    assert_eq!(
        first.mount_point.as_deref(),
        Some(&*m.sys.root().join("data"))
    );
    assert_eq!(m.resolver.cached_len(), 1);

    // A second file of the same device: served from the cache, sharing the stack.
    let other = m.sys.root().join("other");
    fs::write(&other, b"y").expect("write");
    let second = m.resolver.resolve(&other).expect("resolve");
    assert!(Arc::ptr_eq(&first.device, &second.device));
    assert_eq!(second.mount_point.as_deref(), Some(Path::new("/")));
    assert_eq!(second.fs_type, "ext4");
    assert_eq!(second.path, other);

    // Uncached: a fresh walk, equal content, not the cached allocation, cache untouched.
    let fresh = m.resolver.resolve_uncached(&m.file).expect("resolve");
    assert!(!Arc::ptr_eq(&first.device, &fresh.device));
    assert_eq!(first, fresh);

    // The cache really is used: with sysfs gone, cached answers still come, fresh ones fail.
    fs::remove_dir_all(m.sys.root().join("dev")).expect("remove dev/");
    assert!(m.resolver.resolve(&m.file).is_ok());
    let err = m.resolver.resolve_uncached(&m.file).unwrap_err();
    assert_eq!(err.path(), Some(&*m.file), "errors name the user's file");
    assert!(err.to_string().contains("not in sysfs"), "{err}");
    m.resolver.clear_cache();
    assert_eq!(m.resolver.cached_len(), 0);
    assert!(m.resolver.resolve(&m.file).is_err());
}

#[test]
fn resolve_of_a_missing_file_is_a_stat_error() {
    let err = resolve(Path::new("/nonexistent/ferrio/file")).unwrap_err();
    assert!(matches!(err, Error::Io { op: Op::Stat, .. }), "{err:?}");
}

#[test]
fn concurrent_resolutions_share_one_cached_stack() {
    let Some(m) = fake_machine() else { return };
    const THREADS: usize = 8;
    let barrier = Barrier::new(THREADS);
    let stacks: Vec<Vec<Arc<DeviceStack>>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..200)
                        .map(|_| m.resolver.device(m.dev).expect("resolve"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect()
    });
    let first = &stacks[0][0];
    assert!(stacks.iter().flatten().all(|s| Arc::ptr_eq(s, first)));
    assert_eq!(m.resolver.cached_len(), 1);
}

#[test]
fn concurrent_resolutions_and_cache_clears_agree() {
    let Some(m) = fake_machine() else { return };
    let expected = m.resolver.resolve_uncached(&m.file).expect("resolve");
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..200 {
                m.resolver.clear_cache();
                std::thread::yield_now();
            }
        });
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    let chain = m.resolver.resolve(&m.file).expect("resolve");
                    assert_eq!(chain, expected);
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Real devices
// ---------------------------------------------------------------------------------------------

#[test]
fn tmpfs_has_no_block_device() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let file = tempfile::NamedTempFile::new_in(shm).expect("temp file in /dev/shm");
    let chain = resolve_uncached(file.path()).expect("resolve");
    eprintln!("{chain}");
    assert!(!chain.has_block_device());
    assert_eq!(chain.dev().major, 0);
    assert!(chain.disks().is_empty());
    assert_eq!(chain.pool().to_string(), format!("fs:{}", chain.dev()));
    assert_eq!(chain.fs_type, "tmpfs");
    assert!(chain.to_string().contains("no block device"), "{chain}");
}

#[test]
fn the_crate_directory_resolves() {
    // Whatever holds the source tree (a disk, overlayfs in a container): resolution works and is
    // consistent about having disks or not.
    let chain = resolve_uncached(Path::new(env!("CARGO_MANIFEST_DIR"))).expect("resolve");
    eprintln!("{chain}");
    assert_eq!(chain.has_block_device(), !chain.disks().is_empty());
    assert_eq!(chain.pool().disk_count() > 0, chain.has_block_device());
    assert!(chain.mount_point.is_some(), "{chain}");
}

/// Runs a command, returning its trimmed stdout or a one-line description of the failure.
fn run(program: &str, args: &[&str]) -> std::result::Result<String, String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "{program} {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

fn is_root() -> bool {
    // The effective uid is the second field of `Uid:` in /proc/self/status.
    fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Undoes what a loop-device test set up, in reverse, on every exit path including panics.
#[derive(Default)]
struct LoopGuard {
    mounts: Vec<PathBuf>,
    loops: Vec<String>,
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        for mount in self.mounts.iter().rev() {
            let mount = mount.to_string_lossy();
            if let Err(e) = run("umount", &[&mount]) {
                eprintln!("cleanup: {e}; trying a lazy unmount");
                if let Err(e) = run("umount", &["-l", &mount]) {
                    eprintln!("cleanup: {e}");
                }
            }
        }
        for dev in self.loops.iter().rev() {
            if let Err(e) = run("losetup", &["-d", dev]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

impl LoopGuard {
    /// Attaches `image` to a free loop device with partition scanning on.
    fn attach(&mut self, image: &Path) -> std::result::Result<String, String> {
        let dev = run("losetup", &["-f", "--show", "-P", &image.to_string_lossy()])?;
        self.loops.push(dev.clone());
        Ok(dev)
    }

    fn mkfs_and_mount(&mut self, dev: &str, at: &Path) -> std::result::Result<(), String> {
        run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard", dev])?;
        fs::create_dir_all(at).map_err(|e| format!("mkdir {}: {e}", at.display()))?;
        run("mount", &[dev, &at.to_string_lossy()])?;
        self.mounts.push(at.to_path_buf());
        Ok(())
    }
}

/// Adds partition 1 (from sector 2048 to the end) to `dev` with `addpart` (the BLKPG ioctl), which
/// needs no partition table support in the kernel. `Ok(None)` with a printed reason when the
/// partition cannot be made here.
fn add_partition(dev: &str, sectors: u64) -> std::result::Result<Option<String>, String> {
    if !on_path("addpart") {
        eprintln!("skipped partition part: addpart (util-linux) is not installed");
        return Ok(None);
    }
    if let Err(e) = run(
        "addpart",
        &[dev, "1", "2048", &(sectors - 2048).to_string()],
    ) {
        eprintln!("skipped partition part: {e}");
        return Ok(None);
    }
    let part = format!("{dev}p1");
    // devtmpfs creates the node asynchronously.
    for _ in 0..100 {
        if Path::new(&part).exists() {
            return Ok(Some(part));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(format!("{part} did not appear after addpart"))
}

#[test]
fn loopdev_files_on_different_loop_devices_get_different_pools() {
    if !is_root() {
        eprintln!("skipped: loop-device test needs root");
        return;
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if !on_path(tool) {
            eprintln!("skipped: {tool} is not installed");
            return;
        }
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut guard = LoopGuard::default();
    let result = loop_scenario(tmp.path(), &mut guard);
    drop(guard);
    if let Err(e) = result {
        panic!("loop-device scenario: {e}");
    }
}

fn loop_scenario(tmp: &Path, guard: &mut LoopGuard) -> std::result::Result<(), String> {
    const BYTES: u64 = 32 << 20;
    let image = |name: &str| -> std::result::Result<PathBuf, String> {
        let path = tmp.join(name);
        let file = fs::File::create(&path).map_err(|e| format!("create {name}: {e}"))?;
        file.set_len(BYTES)
            .map_err(|e| format!("size {name}: {e}"))?;
        Ok(path)
    };
    let (img_a, img_b) = (image("a.img")?, image("b.img")?);

    let loop_a = match guard.attach(&img_a) {
        Ok(dev) => dev,
        Err(e) => {
            eprintln!("skipped: cannot attach a loop device: {e}");
            return Ok(());
        }
    };
    let loop_b = guard.attach(&img_b)?;
    let part_a = add_partition(&loop_a, BYTES / 512)?;
    let fs_dev_a = part_a.clone().unwrap_or_else(|| loop_a.clone());
    let (mnt_a, mnt_b) = (tmp.join("mnt_a"), tmp.join("mnt_b"));
    guard.mkfs_and_mount(&fs_dev_a, &mnt_a)?;
    guard.mkfs_and_mount(&loop_b, &mnt_b)?;

    let write = |p: PathBuf| -> std::result::Result<PathBuf, String> {
        fs::write(&p, b"ferrio").map_err(|e| format!("write {}: {e}", p.display()))?;
        Ok(p)
    };
    let (a1, a2, b1) = (
        write(mnt_a.join("a1"))?,
        write(mnt_a.join("a2"))?,
        write(mnt_b.join("b1"))?,
    );

    // A resolver of its own: the process-wide cache may hold these device numbers from an
    // earlier use of the same loop devices.
    let resolver = Resolver::new(SYSFS_ROOT, MOUNTINFO);
    let res = |p: &Path| resolver.resolve(p).map_err(|e| e.to_string());
    let (ca1, ca2, cb1) = (res(&a1)?, res(&a2)?, res(&b1)?);
    eprintln!("{ca1}\n{ca2}\n{cb1}");

    let name_a = loop_a.trim_start_matches("/dev/");
    let name_b = loop_b.trim_start_matches("/dev/");
    assert_eq!(ca1.pool(), ca2.pool(), "two files on one loop device");
    assert!(Arc::ptr_eq(&ca1.device, &ca2.device), "second file cached");
    assert_ne!(ca1.pool(), cb1.pool(), "files on different loop devices");
    assert_eq!(ca1.pool().to_string(), name_a);
    assert_eq!(cb1.pool().to_string(), name_b);
    for (chain, name, image, mount) in [
        (&ca1, name_a, &img_a, &mnt_a),
        (&cb1, name_b, &img_b, &mnt_b),
    ] {
        assert_eq!(chain.fs_type, "ext4");
        assert_eq!(chain.mount_point.as_deref(), Some(mount.as_path()));
        assert_eq!(chain.disks().len(), 1);
        let disk = &chain.disks()[0];
        assert_eq!(disk.name, name);
        assert_eq!(disk.kind, DiskKind::Loop);
        assert!(disk.logical_block_size.is_some_and(|b| b >= 512));
        assert_eq!(
            disk.backing_file.as_deref().and_then(Path::file_name),
            image.file_name()
        );
        assert!(
            chain.to_string().ends_with(&format!("→ pool {name}")),
            "{chain}"
        );
    }
    assert_eq!(
        cb1.nodes().len(),
        1,
        "a whole-disk file system is its own disk"
    );

    if let Some(part) = part_a {
        let part_name = part.trim_start_matches("/dev/");
        let nodes = ca1.nodes();
        assert_eq!(nodes.len(), 2, "{nodes:?}");
        assert_eq!(nodes[0].name, part_name);
        assert_eq!(nodes[0].kind, NodeKind::Partition { number: Some(1) });
        assert_eq!(nodes[1].name, name_a);
        assert_eq!(nodes[1].depth, 1);
        assert!(
            ca1.to_string()
                .contains(&format!("ext4 on {part_name} (mount {})", mnt_a.display())),
            "{ca1}"
        );
        // By number, the partition resolves to its whole loop disk too.
        let by_number = resolver.device(ca1.dev()).map_err(|e| e.to_string())?;
        assert!(Arc::ptr_eq(&by_number, &ca1.device));
    }
    Ok(())
}
