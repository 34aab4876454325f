//! `ferrio bench`: write, cold read and hot read of a temporary file, several rounds, medians;
//! with `--compare`, fio and dd run in the same rounds, alternating with ferrio. The cold read
//! lands in one buffer the size of the file; the hot read streams through reused windows, as
//! `ferrio read` does and as `dd` streams through its block.

use std::io::IsTerminal;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::interrupt::POLL;
use crate::{
    check_interrupt, gibps, interrupted, json_path, out, parse_size, wait_polled, Interrupted,
    IoFlags, UsageError,
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Directory for the temporary file
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Size of the temporary file, e.g. 2GiB
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    size: u64,
    /// Rounds of each measurement (medians are reported)
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Also run fio (io_uring O_DIRECT iodepth 32 bs 1 MiB, and buffered) and dd (bs 16 MiB) in
    /// the same rounds and print ratios
    #[arg(long)]
    compare: bool,
    #[command(flatten)]
    io: IoFlags,
}

/// One measured run.
#[derive(Clone, Copy)]
struct Sample {
    gib_per_s: f64,
    cpu_s_per_gib: f64,
}

/// Every run of one row (engine and phase).
struct Row {
    name: &'static str,
    samples: Vec<Sample>,
}

impl Row {
    fn median(&self, f: impl Fn(&Sample) -> f64) -> f64 {
        let mut v: Vec<f64> = self.samples.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }
}

struct Rows(Vec<Row>);

impl Rows {
    fn add(&mut self, name: &'static str, s: Sample) {
        match self.0.iter_mut().find(|r| r.name == name) {
            Some(r) => r.samples.push(s),
            None => self.0.push(Row {
                name,
                samples: vec![s],
            }),
        }
    }

    fn median(&self, name: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.median(|s| s.gib_per_s))
    }
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    if a.rounds == 0 {
        return Err(UsageError("--rounds must be at least 1".into()).into());
    }
    if a.size < 1 << 20 {
        return Err(UsageError("--size must be at least 1MiB".into()).into());
    }
    crate::existing(&a.dir)?;
    if !a.dir.is_dir() {
        return Err(UsageError(format!("--dir {}: not a directory", a.dir.display())).into());
    }
    check_space(&a.dir, a.size)?;
    if a.compare {
        for tool in ["fio", "dd"] {
            if which(tool).is_none() {
                bail!(UsageError(format!(
                    "--compare needs `{tool}` on PATH (`make bench` installs fio; or apt-get install fio)"
                )));
            }
        }
    }
    // Removed when dropped: on success, on error and after Ctrl-C (checked between steps).
    let tmp = tempfile::Builder::new()
        .prefix(".ferrio-bench-")
        .tempdir_in(&a.dir)
        .with_context(|| format!("creating a temporary directory in {}", a.dir.display()))?;
    let path = tmp.path().join("data");
    let settings = a.io.settings()?;
    let human = !a.io.json;
    let say = |msg: &str| {
        if human && std::io::stderr().is_terminal() {
            say!("{msg}");
        }
    };

    let mut rows = Rows(Vec::new());
    let mut buf = crate::host::zeroed(a.size as usize)?;
    // Touch every page so no measurement pays for first-touch page faults; in slices, so that
    // Ctrl-C is noticed while a large buffer is touched.
    for chunk in buf.chunks_mut(16 << 20) {
        check_interrupt()?;
        for i in (0..chunk.len()).step_by(4096) {
            chunk[i] = 1;
        }
    }
    let mut info = None;
    let mut windows = crate::write::generate(a.size)?;
    let mut hot: Option<crate::read::HotReader> = None;
    for round in 1..=a.rounds {
        check_interrupt()?;
        say(&format!("round {round}/{}: write", a.rounds));
        let f = ferrio::File::options()
            .settings(settings.clone())
            .cache(settings.cache.for_synced_writes())
            .open(&path, "w+")?;
        let s = measure(a.size, || {
            crate::write::write_generated(&f, a.size, &mut windows, true)?;
            f.sync()?;
            Ok(())
        })?;
        rows.add("ferrio write (synced)", s);
        info.get_or_insert_with(|| describe(&f));
        let f = ferrio::File::options()
            .settings(settings.clone())
            .open(&path, "r")?;

        say(&format!("round {round}/{}: cold reads", a.rounds));
        check_interrupt()?;
        ferrio::pagecache::drop_file(&path)?;
        rows.add("ferrio cold", measure(a.size, || read_all(&f, &mut buf))?);
        if a.compare {
            check_interrupt()?;
            rows.add("fio io_uring direct cold", fio(&path, a.size, true, false)?);
            check_interrupt()?;
            rows.add(
                "fio io_uring buffered cold",
                fio(&path, a.size, false, false)?,
            );
            check_interrupt()?;
            ferrio::pagecache::drop_file(&path)?;
            rows.add("dd bs=16M direct cold", dd(&path, a.size, true)?);
        }

        say(&format!("round {round}/{}: hot reads", a.rounds));
        check_interrupt()?;
        warm(&path)?;
        // Windows sized for the warm file, made once (outside every clock).
        let hot_reader = match &mut hot {
            Some(h) => h,
            slot => slot.insert(crate::read::HotReader::new(&f)?),
        };
        // Streamed through reused windows the size of the CPU's cache, as `ferrio read` reads a
        // file the page cache holds (and as `dd` streams through its 16 MiB block).
        rows.add(
            "ferrio hot",
            measure(a.size, || {
                let n = hot_reader.read_all()?;
                if n != a.size {
                    bail!(
                        "{}: read {n} of {} bytes (file changed during the benchmark?)",
                        path.display(),
                        a.size
                    );
                }
                Ok(())
            })?,
        );
        if a.compare {
            check_interrupt()?;
            rows.add(
                "fio io_uring buffered hot",
                fio(&path, a.size, false, true)?,
            );
            check_interrupt()?;
            rows.add("dd bs=16M hot", dd(&path, a.size, false)?);
        }
    }
    drop(buf);

    let ratios: Vec<(&str, f64)> = [
        (
            "cold read vs fio io_uring O_DIRECT",
            "ferrio cold",
            "fio io_uring direct cold",
        ),
        (
            "cold read vs fio buffered",
            "ferrio cold",
            "fio io_uring buffered cold",
        ),
        (
            "cold read vs dd direct",
            "ferrio cold",
            "dd bs=16M direct cold",
        ),
        ("hot read vs dd", "ferrio hot", "dd bs=16M hot"),
        (
            "hot read vs fio buffered",
            "ferrio hot",
            "fio io_uring buffered hot",
        ),
    ]
    .into_iter()
    .filter_map(|(label, a, b)| Some((label, rows.median(a)? / rows.median(b)?)))
    .collect();

    let info = info.unwrap_or_default();
    if a.io.json {
        let results: serde_json::Map<String, Value> = rows
            .0
            .iter()
            .map(|r| {
                (
                    r.name.to_string(),
                    json!({
                        "gib_per_s": r.median(|s| s.gib_per_s),
                        "cpu_seconds_per_gib": r.median(|s| s.cpu_s_per_gib),
                        "rounds": r.samples.iter().map(|s| json!({"gib_per_s": s.gib_per_s, "cpu_seconds_per_gib": s.cpu_s_per_gib})).collect::<Vec<_>>(),
                    }),
                )
            })
            .collect();
        out(&json!({
            "file_bytes": a.size, "dir": json_path(&a.dir), "rounds": a.rounds, "file": info,
            "settings": settings_json(&settings), "results": results,
            "ratios": ratios.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        })
        .to_string())?;
        return Ok(());
    }
    out(&format!(
        "ferrio bench: {} file in {}, {} round(s), medians",
        ferrio::config::format_size(a.size),
        a.dir.display(),
        a.rounds
    ))?;
    out(&format!("file: {info}"))?;
    out(&format!("settings: {}", settings_line(&settings)))?;
    out(&format!("{:<28} {:>9} {:>11}", "", "GiB/s", "CPU s/GiB"))?;
    for r in &rows.0 {
        out(&format!(
            "{:<28} {:>9.2} {:>11.3}",
            r.name,
            r.median(|s| s.gib_per_s),
            r.median(|s| s.cpu_s_per_gib)
        ))?;
    }
    for (label, ratio) in &ratios {
        out(&format!("{label}: {ratio:.2}x"))?;
    }
    Ok(())
}

/// Runs `f`, which moves `bytes`, and returns its rate and this process's CPU time per GiB.
fn measure(bytes: u64, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Sample> {
    let cpu0 = crate::host::process_cpu_seconds();
    let t0 = Instant::now();
    f()?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = crate::host::process_cpu_seconds() - cpu0;
    Ok(Sample {
        gib_per_s: gibps(bytes, secs),
        cpu_s_per_gib: cpu / gib(bytes),
    })
}

fn gib(bytes: u64) -> f64 {
    bytes.max(1) as f64 / (1u64 << 30) as f64
}

fn read_all(f: &ferrio::File, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let want = buf.len();
    let (n, back) = read_polled(f, std::mem::take(buf), 0)?;
    *buf = back;
    if n != want {
        bail!(
            "{}: read {n} of {want} bytes (file changed during the benchmark?)",
            f.path().display(),
        );
    }
    Ok(())
}

/// Reads into all of `buf` at `offset`, stopping promptly at Ctrl-C; gives the buffer back.
fn read_polled(f: &ferrio::File, buf: Vec<u8>, offset: u64) -> anyhow::Result<(usize, Vec<u8>)> {
    let fut = f.pread(buf, offset);
    wait_polled(&fut)?;
    let (n, buf) = fut.into_buffer();
    Ok((n?, buf))
}

/// Brings the whole file into the page cache with buffered reads.
fn warm(path: &Path) -> anyhow::Result<()> {
    let f = ferrio::File::options()
        .direct_read(ferrio::DirectMode::Off)
        .open(path, "r")?;
    let mut buf = vec![0u8; 64 << 20];
    let mut off = 0;
    loop {
        let (n, back) = read_polled(&f, buf, off)?;
        if n == 0 {
            return Ok(());
        }
        buf = back;
        off += n as u64;
    }
}

/// Runs `cmd` to the end and collects its output, or kills it at Ctrl-C and fails with
/// [`Interrupted`] (fio and dd can run for many seconds).
fn output_polled(cmd: &mut Command) -> std::io::Result<Result<Output, Interrupted>> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    // Drained on their own threads so that a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = pipe {
                // A read error leaves what was read; the exit status tells what happened.
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if interrupted() {
            // Killing may fail only if it has just exited; it is reaped either way.
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Err(Interrupted));
        }
        std::thread::sleep(POLL);
    };
    Ok(Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }))
}

/// CPU seconds used by waited-for children so far.
fn children_cpu() -> f64 {
    crate::host::children_cpu_seconds()
}

/// One fio sequential read of the whole file: io_uring, bs 1 MiB, iodepth 32.
fn fio(path: &Path, size: u64, direct: bool, hot: bool) -> anyhow::Result<Sample> {
    let cpu0 = children_cpu();
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=ferrio-compare",
        "--rw=read",
        "--bs=1M",
        "--iodepth=32",
        "--ioengine=io_uring",
        "--output-format=json",
    ])
    .arg(format!("--filename={}", path.display()))
    .arg(format!("--size={size}"))
    .arg(format!("--direct={}", u8::from(direct)))
    // fio drops the file's cache itself unless told not to; hot runs must keep it.
    .arg(format!("--invalidate={}", u8::from(!hot)));
    let output = output_polled(&mut cmd).context("running fio")??;
    if !output.status.success() {
        bail!(
            "fio failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let v: Value = serde_json::from_slice(&output.stdout).context("parsing fio's JSON output")?;
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .context("fio output has no read bw_bytes")?;
    let cpu = children_cpu() - cpu0;
    Ok(Sample {
        gib_per_s: bw / (1u64 << 30) as f64,
        cpu_s_per_gib: cpu / gib(size),
    })
}

/// One dd read of the whole file with 16 MiB blocks.
fn dd(path: &Path, size: u64, direct: bool) -> anyhow::Result<Sample> {
    let cpu0 = children_cpu();
    let mut cmd = Command::new("dd");
    cmd.arg(format!("if={}", path.display()))
        .args(["of=/dev/null", "bs=16M", "status=none"]);
    if direct {
        cmd.arg("iflag=direct");
    }
    let t0 = Instant::now();
    let output = output_polled(&mut cmd).context("running dd")??;
    let secs = t0.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!(
            "dd failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let cpu = children_cpu() - cpu0;
    Ok(Sample {
        gib_per_s: gibps(size, secs),
        cpu_s_per_gib: cpu / gib(size),
    })
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

fn check_space(dir: &Path, size: u64) -> anyhow::Result<()> {
    if let Some(free) = crate::host::free_bytes(dir) {
        if free < size + (64 << 20) {
            bail!(UsageError(format!(
                "{} has {} free; the benchmark needs {} (use --dir or --size)",
                dir.display(),
                ferrio::config::format_size(free),
                ferrio::config::format_size(size + (64 << 20))
            )));
        }
    }
    Ok(())
}

fn describe(f: &ferrio::File) -> String {
    format!("direct I/O {}; pool {}", f.direct_support(), f.pool().key())
}

fn settings_json(s: &ferrio::Settings) -> Value {
    let m: serde_json::Map<String, Value> = ferrio::config::SETTINGS
        .iter()
        .filter_map(|i| Some((i.name.to_string(), json!(s.get(i.name).ok()?))))
        .collect();
    Value::Object(m)
}

fn settings_line(s: &ferrio::Settings) -> String {
    ferrio::config::SETTINGS
        .iter()
        .filter_map(|i| Some(format!("{}={}", i.name, s.get(i.name).ok()?)))
        .collect::<Vec<_>>()
        .join(" ")
}
