//! The sysfs walk on fake sysfs trees: partitions to disks, NVMe namespaces to controllers,
//! md and dm stacks to their members, disk kinds, and the errors of broken or looping trees.

use super::*;
use crate::pool::{default_threads, suggested_threads};

use std::io;

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
    assert_eq!(
        sda.read_ahead,
        Some(8 << 20),
        "queue/read_ahead_kb, in bytes"
    );
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
        "vda (virtio, 512 B logical, 4096 B physical, readahead 8.00 MiB)"
    );
    assert_eq!(
        stack.read_ahead(),
        Some(8 << 20),
        "a file system on the disk: its window"
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
