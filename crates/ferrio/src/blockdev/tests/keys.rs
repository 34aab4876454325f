//! Pool keys, device numbers and the one-line displays of chains.

use super::*;

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
         512 B logical, readahead 8.00 MiB) → pool loop3"
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
    let dm1 = sys.dm("dm-1", DevId::new(253, 1), "vg-data", "LVM-xyz", &[&md0]);
    sys.write(&format!("{dm1}/queue/read_ahead_kb"), "128\n");
    let chain = DeviceChain {
        path: PathBuf::from("/data/f"),
        fs_type: "xfs".to_owned(),
        mount_point: Some(PathBuf::from("/data")),
        device: Arc::new(sys.resolve(DevId::new(253, 1))),
    };
    assert_eq!(
        chain.to_string(),
        "file /data/f → xfs on dm-1 (mount /data, readahead 128.00 KiB) → md0 (raid0) → \
         partition nvme0n1p1, \
         partition nvme1n1p1 → disks nvme0n1 (nvme on nvme0, 512 B logical, readahead 8.00 MiB), \
         nvme1n1 (nvme on nvme1, 512 B logical, readahead 8.00 MiB) → pool nvme0+nvme1"
    );
    // The file system's reads follow the top device's window, not its disks'.
    assert_eq!(chain.device.read_ahead(), Some(128 << 10));

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
