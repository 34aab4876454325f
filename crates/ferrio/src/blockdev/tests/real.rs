//! Resolution on the real machine: tmpfs, the source tree, and loop devices (partitioned,
//! formatted and mounted) when the machine allows it (`loopdev_` tests: root and the tools).

use super::*;

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
