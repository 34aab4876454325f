//! `RemoteFile` against a tiny HTTP server on 127.0.0.1 (std only, one thread per connection,
//! `Connection: close`): ranged reads byte for byte, reads past the end, a missing object, a
//! malformed URL, a server that ignores `Range`, an object replaced between requests, and a
//! range that crawls (its second half is taken over by another GET, host and GPU reads); a
//! failed or cancelled read that reports only once none of its GETs lands any more; a
//! cancel that stops GETs in flight; downloads with `ferrio::copy` (complete or no file); GPU
//! reads through pinned pieces on the emulated device (ranges copied as they land, pieces kept
//! and capped, never refilled under a copy, failures and cancels).
//! Python's tests (`python/tests/test_remote.py`, `test_remote_write.py`) cover S3 through moto,
//! retries, dropped connections, uploads and copies to URLs.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrio::bounce::emulated::EmulatedDevice;
use ferrio::bounce::{PiecePool, PinnedBudget};
use ferrio::cuda::DevicePtr;
use ferrio::{CopyOptions, CopyProgress, Error, RemoteFile, RemoteWriter, Settings};

use super::common::LoopFs;
use crate::support::{assert_bytes_eq, poison};

/// What the server serves and how it misbehaves.
struct Object {
    body: Mutex<(Vec<u8>, String)>,
    ignore_range: AtomicBool,
    /// HEAD is answered 405 Method Not Allowed.
    refuse_head: AtomicBool,
    /// After this many GETs the object is replaced (usize::MAX: never).
    replace_after: AtomicUsize,
    gets: AtomicUsize,
    /// The ranges asked for (first byte, last byte), in the order the GETs came.
    asked: Mutex<Vec<(usize, usize)>>,
    /// Milliseconds each GET waits before it answers.
    delay_ms: AtomicU64,
    /// Milliseconds each GET's reply pauses halfway through its body.
    body_pause_ms: AtomicU64,
    /// (range start, milliseconds): GETs of a range starting there wait that much longer.
    delay_at: Mutex<Vec<(usize, u64)>>,
    /// (range start, milliseconds): GETs of a range starting there send their body 16 KiB at a
    /// time with that pause between pieces.
    crawl_at: Mutex<Vec<(usize, u64)>>,
    /// (range start, bytes): how much of its body each crawling GET sent before it ended or
    /// its client went away.
    crawled: Mutex<Vec<(usize, usize)>>,
    /// GETs being answered now, and the most there ever were at once.
    active: AtomicUsize,
    most_active: AtomicUsize,
}

struct Server {
    url: String,
    object: Arc<Object>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// The milliseconds set for the range that starts at `at` in one of the object's
/// `(start, ms)` lists (`delay_at`, `crawl_at`).
fn ms_at(list: &Mutex<Vec<(usize, u64)>>, at: usize) -> Option<u64> {
    list.lock().unwrap().iter().find(|d| d.0 == at).map(|d| d.1)
}

fn serve(body: Vec<u8>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let object = Arc::new(Object {
        body: Mutex::new((body, "\"v1\"".into())),
        ignore_range: AtomicBool::new(false),
        refuse_head: AtomicBool::new(false),
        replace_after: AtomicUsize::new(usize::MAX),
        gets: AtomicUsize::new(0),
        asked: Mutex::new(Vec::new()),
        delay_ms: AtomicU64::new(0),
        body_pause_ms: AtomicU64::new(0),
        delay_at: Mutex::new(Vec::new()),
        crawl_at: Mutex::new(Vec::new()),
        crawled: Mutex::new(Vec::new()),
        active: AtomicUsize::new(0),
        most_active: AtomicUsize::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (object, stop) = (object.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let object = object.clone();
                        std::thread::spawn(move || {
                            let _ = answer(conn, &object);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        })
    };
    Server {
        url: format!("http://127.0.0.1:{port}/d/object.bin"),
        object,
        stop,
        thread: Some(thread),
    }
}

/// Answers one request on `conn`, then closes it.
fn answer(conn: TcpStream, object: &Object) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let (mut range, mut if_match) = (None, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("range: bytes=") {
            let (a, b) = v.trim().split_once('-').unwrap();
            range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()));
        }
        if lower.starts_with("if-match:") {
            if_match = Some(line["if-match:".len()..].trim().to_string());
        }
    }
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut conn = conn;
    let head = |status: &str, len: usize, etag: &str, extra: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {len}\r\nETag: {etag}\r\n\
             Last-Modified: Mon, 23 Nov 2026 10:00:00 GMT\r\nConnection: close\r\n{extra}\r\n"
        )
    };
    if path != "/d/object.bin" {
        return conn.write_all(head("404 Not Found", 0, "\"x\"", "").as_bytes());
    }
    // Counted until just before its last byte leaves (see `send`).
    let active = (method == "GET").then(|| Active::new(object));
    if method == "GET" {
        std::thread::sleep(Duration::from_millis(
            object.delay_ms.load(Ordering::Relaxed),
        ));
        object.asked.lock().unwrap().extend(range);
        let start = range.map_or(0, |(a, _)| a);
        if let Some(ms) = ms_at(&object.delay_at, start) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let n = object.gets.fetch_add(1, Ordering::Relaxed) + 1;
        if n > object.replace_after.load(Ordering::Relaxed) {
            let mut b = object.body.lock().unwrap();
            b.0[0] ^= 0xff;
            b.1 = "\"v2\"".into();
        }
    }
    let (body, etag) = object.body.lock().unwrap().clone();
    if method == "HEAD" {
        if object.refuse_head.load(Ordering::Relaxed) {
            return conn.write_all(head("405 Method Not Allowed", 0, &etag, "").as_bytes());
        }
        return conn.write_all(head("200 OK", body.len(), &etag, "").as_bytes());
    }
    if if_match.is_some_and(|m| m != etag) {
        let reply = head("412 Precondition Failed", 0, &etag, "");
        return send(&mut conn, &reply, &[], active);
    }
    match range {
        Some((a, b)) if !object.ignore_range.load(Ordering::Relaxed) => {
            let b = b.min(body.len() - 1);
            let extra = format!("Content-Range: bytes {a}-{b}/{}\r\n", body.len());
            let reply = head("206 Partial Content", b + 1 - a, &etag, &extra);
            if let Some(ms) = ms_at(&object.crawl_at, a) {
                conn.write_all(reply.as_bytes())?;
                let mut sent = 0;
                for piece in body[a..=b].chunks(16 << 10) {
                    if conn.write_all(piece).and_then(|()| conn.flush()).is_err() {
                        break;
                    }
                    sent += piece.len();
                    std::thread::sleep(Duration::from_millis(ms));
                }
                object.crawled.lock().unwrap().push((a, sent));
                return Ok(());
            }
            let pause = Duration::from_millis(object.body_pause_ms.load(Ordering::Relaxed));
            if !pause.is_zero() {
                let half = (b + 1 - a) / 2;
                conn.write_all(reply.as_bytes())?;
                conn.write_all(&body[a..a + half])?;
                conn.flush()?;
                std::thread::sleep(pause);
                return send(&mut conn, "", &body[a + half..=b], active);
            }
            send(&mut conn, &reply, &body[a..=b], active)
        }
        _ => {
            let reply = head("200 OK", body.len(), &etag, "");
            send(&mut conn, &reply, &body, active)
        }
    }
}

/// Writes a reply, ending `active` before its last byte leaves: a client that has the whole
/// reply (and may send its next GET at once) must never find this GET still counted, or the
/// count of GETs at once would include one the client has already finished.
fn send(
    conn: &mut TcpStream,
    head: &str,
    body: &[u8],
    active: Option<Active<'_>>,
) -> std::io::Result<()> {
    let mut reply = Vec::with_capacity(head.len() + body.len());
    reply.extend_from_slice(head.as_bytes());
    reply.extend_from_slice(body);
    let (most, last) = reply.split_at(reply.len() - 1);
    conn.write_all(most)?;
    drop(active);
    conn.write_all(last)
}

/// One GET being answered, counted in `Object::active` while it lives.
struct Active<'a>(&'a Object);

impl<'a> Active<'a> {
    fn new(object: &'a Object) -> Self {
        let now = object.active.fetch_add(1, Ordering::SeqCst) + 1;
        object.most_active.fetch_max(now, Ordering::SeqCst);
        Active(object)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Every GET 64 KiB, 4 in flight.
fn small_ranges() -> Settings {
    let mut s = Settings::default();
    s.set("remote_range_size", "64KiB").unwrap();
    s.set("remote_max_range_size", "64KiB").unwrap();
    s.set("remote_concurrency", "4").unwrap();
    s
}

#[test]
fn ranged_reads_are_byte_identical() {
    let body = data((1 << 20) + 123);
    let server = serve(body.clone());
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    assert_eq!(f.len(), body.len() as u64);
    assert_eq!(f.e_tag(), Some("\"v1\""));
    assert_eq!(f.read_all().unwrap(), body);
    for (offset, len) in [(0usize, 1usize), (65535, 65538), (body.len() - 5, 5)] {
        let mut buf = vec![0u8; len];
        assert_eq!(f.read_at(&mut buf, offset as u64).unwrap(), len);
        assert_eq!(buf, &body[offset..offset + len]);
    }
    // Past the end: short, like pread.
    let mut buf = vec![0u8; 1000];
    assert_eq!(f.read_at(&mut buf, body.len() as u64 - 10).unwrap(), 10);
    assert_eq!(&buf[..10], &body[body.len() - 10..]);
    assert_eq!(f.read_at(&mut buf, body.len() as u64 + 1).unwrap(), 0);
    let (n, buf) = f.pread(vec![0u8; 4096], 100).into_buffer();
    assert_eq!(n.unwrap(), 4096);
    assert_eq!(buf, &body[100..4196]);
}

/// The lengths of the ranges planned for a read of `object` (those it was asked for, less the
/// second halves that free GETs took over inside them), in the object's order, checked to
/// cover `0..len` exactly once; the log is emptied.
#[track_caller]
fn ranges_asked(object: &Object, len: usize) -> Vec<usize> {
    ranges_asked_in(object, 0..len)
}

/// [`ranges_asked`] for a read of the object's bytes `span`.
#[track_caller]
fn ranges_asked_in(object: &Object, span: std::ops::Range<usize>) -> Vec<usize> {
    let len = span.end;
    let mut asked = std::mem::take(&mut *object.asked.lock().unwrap());
    // An open's GET of the first byte (`RemoteFile::open`) is no range of the read.
    asked.retain(|&r| r != (0, 0));
    asked.sort_unstable();
    let mut planned = Vec::new();
    let mut next = span.start;
    for &(first, last) in &asked {
        if first < next {
            // A half taken over: it starts inside a planned range and ends with it.
            assert!(
                last < next,
                "a taken-over half ends inside its range: {asked:?}"
            );
            continue;
        }
        assert_eq!(first, next, "ranges without a gap: {asked:?}");
        planned.push(last + 1 - first);
        next = last + 1;
    }
    assert_eq!(next, len, "ranges to the read's end");
    planned
}

#[test]
fn reads_ask_even_ranges_between_the_shortest_and_the_longest() {
    const KIB: usize = 1 << 10;
    let body = data((2 << 20) + 77);
    let server = serve(body.clone());
    // Ranges of 64 KiB to 256 KiB, 4 in flight: 2 MiB is eight of the longest, and a last one
    // takes the 77 bytes left.
    let mut s = small_ranges();
    s.set("remote_max_range_size", "256KiB").unwrap();
    let f = RemoteFile::open_with(&server.url, s.clone()).unwrap();
    server.object.asked.lock().unwrap().clear();
    assert_bytes_eq(&f.read_all().unwrap(), &body, "host read");
    let host = ranges_asked(&server.object, body.len());
    // Into device memory through pieces shorter than the ranges: each fills several.
    let device = EmulatedDevice::default();
    let pool = piece_pool(&device, 64 * KIB, u64::MAX);
    let mem = EmuMem::new(&device, body.len());
    assert_eq!(
        start_gpu_read(&f, &pool, &mem, 0).wait().unwrap(),
        body.len()
    );
    assert_bytes_eq(&mem.read(), &body, "device read");
    assert_settled(&device, &pool);
    assert_eq!(device.violations(), Vec::<String>::new());
    let gpu = ranges_asked(&server.object, body.len());
    assert_eq!(host, gpu, "host and device reads ask the same ranges");
    let mut expected = vec![256 * KIB; 8];
    expected.push(77);
    assert_eq!(host, expected);
    // A read shorter than four of the longest: an even share each, 4 GETs of 200 KiB.
    let mut buf = vec![0u8; 800 * KIB];
    assert_eq!(f.read_at(&mut buf, 1000).unwrap(), buf.len());
    assert!(buf == body[1000..1000 + buf.len()]);
    let lens = ranges_asked_in(&server.object, 1000..1000 + buf.len());
    assert_eq!(lens, vec![200 * KIB; 4]);
    // With the longest no longer than the shortest, every range is that long.
    s.set("remote_max_range_size", "64KiB").unwrap();
    let f = RemoteFile::open_with(&server.url, s).unwrap();
    assert_bytes_eq(&f.read_all().unwrap(), &body, "fixed ranges");
    let fixed = ranges_asked(&server.object, body.len());
    assert_eq!(fixed.len(), 33);
    assert!(fixed[..32].iter().all(|&n| n == 64 * KIB));
}

#[test]
fn a_failed_or_cancelled_read_reports_only_once_no_get_lands_any_more() {
    let body = data(1 << 20);
    let server = serve(body.clone());
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    // The fourth GET finds the object replaced (412) while the first three are landing, each
    // piece in a sink that takes 20 ms.
    let opened = server.object.gets.load(Ordering::Relaxed);
    server
        .object
        .replace_after
        .store(opened + 3, Ordering::Relaxed);
    let reported = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicUsize::new(0));
    let sink = {
        let (reported, late) = (reported.clone(), late.clone());
        move |_: u64, _: &[u8]| {
            std::thread::sleep(Duration::from_millis(20));
            if reported.load(Ordering::SeqCst) {
                late.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    };
    let err = f.read_to(0, body.len(), sink.clone()).wait().unwrap_err();
    reported.store(true, Ordering::SeqCst);
    assert!(err.to_string().contains(&server.url), "{err}");
    // Whatever was still landing when the read failed finished before it reported.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "pieces landed after the read reported"
    );
    // The same for a read cancelled while its GETs land.
    let server = serve(body.clone());
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    reported.store(false, Ordering::SeqCst);
    let fut = f.read_to(0, body.len(), sink);
    std::thread::sleep(Duration::from_millis(50));
    fut.cancel();
    assert!(matches!(fut.wait(), Err(Error::Cancelled)));
    reported.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "pieces landed after the cancel reported"
    );
}

#[test]
fn streamed_reads_hand_every_byte_over_once_and_stop_at_the_sinks_error() {
    let body = data((2 << 20) + 321);
    let server = serve(body.clone());
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    // Each piece lands at its offset; a byte handed over twice would show as a count above 1.
    let got = Arc::new(Mutex::new((vec![0u8; body.len()], vec![0u8; body.len()])));
    let sink = {
        let got = got.clone();
        move |at: u64, bytes: &[u8]| {
            let mut g = got.lock().unwrap();
            let at = at as usize;
            g.0[at..at + bytes.len()].copy_from_slice(bytes);
            g.1[at..at + bytes.len()].iter_mut().for_each(|c| *c += 1);
            Ok(())
        }
    };
    let fut = f.read_to(5, body.len(), sink);
    assert!(fut.wait_timeout(Duration::from_secs(20)));
    assert_eq!(fut.bytes(), body.len() as u64 - 5, "progress");
    assert_eq!(fut.wait().unwrap(), body.len() - 5, "short past the end");
    let g = got.lock().unwrap();
    assert_bytes_eq(&g.0[5..], &body[5..], "streamed bytes");
    assert!(
        g.0[..5].iter().all(|&b| b == 0),
        "nothing before the offset"
    );
    assert!(g.1[5..].iter().all(|&c| c == 1), "every byte exactly once");
    drop(g);
    // A sink that fails (a full disk, say) fails the read with its own error, and the other
    // GETs stop: far fewer than the whole object's are asked for.
    server.object.gets.store(0, Ordering::Relaxed);
    server.object.delay_ms.store(20, Ordering::Relaxed);
    let full = |at: u64, _: &[u8]| Err(Error::InvalidArgument(format!("no room at {at}")));
    let err = f.read_to(0, body.len(), full).wait().unwrap_err();
    assert!(err.to_string().contains("no room at"), "{err}");
    std::thread::sleep(Duration::from_millis(100));
    let gets = server.object.gets.load(Ordering::Relaxed);
    assert!(gets < 32, "{gets} GETs after the sink failed");
}

/// `body` served in 1 MiB ranges, 4 in flight, the first of which crawls (16 KiB per 5 ms),
/// and the object opened so.
fn serve_crawling_first_range(body: Vec<u8>) -> (Server, RemoteFile) {
    let server = serve(body);
    server.object.crawl_at.lock().unwrap().push((0, 5));
    let mut s = Settings::default();
    s.set("remote_range_size", "1MiB").unwrap();
    s.set("remote_max_range_size", "1MiB").unwrap();
    s.set("remote_concurrency", "4").unwrap();
    let f = RemoteFile::open_with(&server.url, s).unwrap();
    (server, f)
}

#[test]
fn a_crawling_range_is_split_and_its_second_half_fetched_by_another_get() {
    let len = 8 << 20;
    let body = data(len);
    // The first 1 MiB range crawls at 16 KiB per 5 ms (about 3 MB/s, a third of a second);
    // the other seven come at once.
    let (server, f) = serve_crawling_first_range(body.clone());
    let mut buf = vec![0u8; len];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), len);
    assert_bytes_eq(&buf, &body, "a read with a crawling range");
    // Free GETs took the crawling range's second half (and perhaps halves of that): GETs
    // started inside it, and the crawling GET stopped before its end.
    let asked = server.object.asked.lock().unwrap().clone();
    let inside: Vec<_> = asked.iter().filter(|r| r.0 > 0 && r.0 < 1 << 20).collect();
    assert!(
        !inside.is_empty(),
        "no GET took over part of the slow range: {asked:?}"
    );
    // Its reply ends once the client has dropped the body (the next write fails).
    let deadline = Instant::now() + Duration::from_secs(5);
    let crawled = loop {
        let c = server.object.crawled.lock().unwrap().clone();
        if c.iter().any(|&(a, _)| a == 0) || Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let first = crawled.iter().find(|&&(a, _)| a == 0).map(|&(_, n)| n);
    assert!(
        first.is_some_and(|n| n < 1 << 20),
        "the crawling GET sent {first:?} bytes of its 1 MiB: {crawled:?}"
    );
}

#[test]
fn a_replaced_object_is_an_error_naming_the_url() {
    let server = serve(data(1 << 20));
    let mut s = small_ranges();
    s.set("remote_concurrency", "1").unwrap();
    let f = RemoteFile::open_with(&server.url, s).unwrap();
    let opened = server.object.gets.load(Ordering::Relaxed);
    server
        .object
        .replace_after
        .store(opened + 3, Ordering::Relaxed);
    let err = f.read_all().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("changed since it was opened"), "{text}");
    assert!(text.contains(&server.url), "{text}");
}

#[test]
fn a_server_that_ignores_range_is_read_whole_one_get_per_read() {
    let body = data(300_000);
    let server = serve(body.clone());
    server.object.ignore_range.store(true, Ordering::Relaxed);
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    assert_eq!(f.len(), body.len() as u64);
    // The first read's GETs find out (each got the whole object for its range): one of them
    // then streams the whole object and lands every range, the others stop. Before it, one
    // ranged GET asks whether the server honours ranges again (it may have refused once).
    assert_bytes_eq(&f.read_all().unwrap(), &body, "whole object");
    let first = server.object.gets.load(Ordering::Relaxed);
    assert!(
        first <= 4 + 2,
        "{first} GETs: 4 ranged at most, one more, then one whole"
    );
    // Later reads are one GET of the whole object each (and that one ranged GET).
    let mut buf = vec![0u8; 100_000];
    assert_eq!(f.read_at(&mut buf, 123_457).unwrap(), buf.len());
    assert_bytes_eq(&buf, &body[123_457..223_457], "100 kB at 123457");
    let mut tail = vec![0u8; 1000];
    assert_eq!(f.read_at(&mut tail, body.len() as u64 - 10).unwrap(), 10);
    assert_bytes_eq(&tail[..10], &body[body.len() - 10..], "the last 10 bytes");
    assert_eq!(server.object.gets.load(Ordering::Relaxed) - first, 4);
    // A server whose HEAD fails is asked with a GET of the first byte at open, which finds
    // out there: the first read is one GET of the whole object too (and the ranged one).
    server.object.refuse_head.store(true, Ordering::Relaxed);
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    let opened = server.object.gets.load(Ordering::Relaxed);
    assert_bytes_eq(&f.read_all().unwrap(), &body, "whole object, opened by GET");
    assert_eq!(server.object.gets.load(Ordering::Relaxed) - opened, 2);
}

#[test]
fn a_server_that_ignores_range_is_read_without_waiting_for_slow_ranged_gets() {
    let body = data(300_000);
    let server = serve(body.clone());
    server.object.ignore_range.store(true, Ordering::Relaxed);
    // Two of the first read's ranged GETs get no answer for 20 s (a server's full backlog):
    // the GET that streams the object takes their ranges and the read does not wait for them.
    server
        .object
        .delay_at
        .lock()
        .unwrap()
        .extend([(64 << 10, 20_000), (128 << 10, 20_000)]);
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    let t0 = Instant::now();
    assert_bytes_eq(&f.read_all().unwrap(), &body, "whole object");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the read took {:?}",
        t0.elapsed()
    );
}

#[test]
fn a_server_that_stops_serving_ranges_after_the_open_is_read_whole() {
    let body = data(700_000);
    let server = serve(body.clone());
    for device in [false, true] {
        server.object.ignore_range.store(false, Ordering::Relaxed);
        let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
        // Found out by the read's GETs: each is asked again for the whole object.
        server.object.ignore_range.store(true, Ordering::Relaxed);
        let got = if device {
            let emulated = EmulatedDevice::default();
            let pool = piece_pool(&emulated, 64 << 10, u64::MAX);
            let mem = EmuMem::new(&emulated, 500_000);
            let n = start_gpu_read(&f, &pool, &mem, 99_999).wait().unwrap();
            assert_eq!(n, 500_000);
            assert_settled(&emulated, &pool);
            mem.read()
        } else {
            let mut buf = vec![0u8; 500_000];
            assert_eq!(f.read_at(&mut buf, 99_999).unwrap(), buf.len());
            buf
        };
        assert_bytes_eq(&got, &body[99_999..599_999], &format!("device {device}"));
        // The next read is one GET of the whole object (and one ranged GET before it).
        let before = server.object.gets.load(Ordering::Relaxed);
        assert_bytes_eq(&f.read_all().unwrap(), &body, "whole object");
        assert_eq!(server.object.gets.load(Ordering::Relaxed) - before, 2);
    }
}

#[test]
fn missing_objects_and_malformed_urls() {
    let server = serve(data(10));
    let missing = server.url.replace("object.bin", "missing.bin");
    match RemoteFile::open(&missing) {
        Err(Error::Open { path, source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            assert_eq!(path.to_str(), Some(missing.as_str()));
        }
        other => panic!("{other:?}"),
    }
    for bad in ["s3://", "ftp://host/x", "file:///etc/hostname"] {
        assert!(
            matches!(RemoteFile::open(bad), Err(Error::InvalidArgument(_))),
            "{bad}"
        );
    }
}

#[test]
fn cancel_stops_gets_in_flight() {
    let server = serve(data(1 << 20));
    server.object.delay_ms.store(20_000, Ordering::Relaxed);
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    let fut = f.pread(vec![0u8; 1 << 20], 0);
    // Let the GETs reach the server, where they hang.
    std::thread::sleep(Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    fut.cancel();
    let (r, _) = fut.into_buffer();
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "cancel took {:?}",
        t0.elapsed()
    );
}

#[test]
fn copy_downloads_whole_or_leaves_nothing() {
    let body = data((1 << 20) + 77);
    let server = serve(body.clone());
    let dir = tempfile::tempdir().unwrap();
    let options = CopyOptions::new().settings(small_ranges());
    let dst = dir.path().join("got.bin");
    let report = ferrio::copy([&server.url], &dst, &options).unwrap();
    report.check().unwrap();
    assert_eq!((report.files, report.bytes), (1, body.len() as u64));
    assert_eq!(std::fs::read(&dst).unwrap(), body);
    // Into a directory: named after the object.
    let report = ferrio::copy([&server.url], dir.path(), &options).unwrap();
    report.check().unwrap();
    assert_eq!(std::fs::read(dir.path().join("object.bin")).unwrap(), body);

    // A failing download (the object is replaced after the open's GET) leaves neither the
    // destination nor a temporary file.
    let empty = tempfile::tempdir().unwrap();
    let gets = server.object.gets.load(Ordering::Relaxed);
    server
        .object
        .replace_after
        .store(gets + 1, Ordering::Relaxed);
    let report = ferrio::copy([&server.url], empty.path().join("x"), &options).unwrap();
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
    server
        .object
        .replace_after
        .store(usize::MAX, Ordering::Relaxed);

    // A cancelled download too, with its GETs hanging.
    server.object.delay_ms.store(20_000, Ordering::Relaxed);
    let progress = CopyProgress::new();
    let options = options.progress(progress.clone());
    let stopper = {
        let progress = progress.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            progress.cancel();
        })
    };
    let t0 = std::time::Instant::now();
    let report = ferrio::copy([&server.url], empty.path().join("x"), &options).unwrap();
    stopper.join().unwrap();
    assert!(report.cancelled);
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
}

#[test]
fn a_download_to_a_full_disk_is_a_clear_error_and_leaves_nothing() {
    let lfs = match LoopFs::new(48) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: a loop file system: {why}");
            return;
        }
    };
    let mnt = lfs.mount_point();
    lfs.fill_up_to(2 << 20);
    let body = data(16 << 20);
    let server = serve(body);
    let options = CopyOptions::new().settings(small_ranges());
    let dst = mnt.join("got.bin");
    let report = ferrio::copy([&server.url], &dst, &options).unwrap();
    assert_eq!(report.errors.len(), 1, "{report:?}");
    let e = &report.errors[0].error;
    assert_eq!(
        e.os_error().and_then(|e| e.raw_os_error()),
        Some(libc::ENOSPC),
        "{e}"
    );
    assert_eq!(e.path(), Some(dst.as_path()), "names the destination: {e}");
    let mut left: Vec<_> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["filler", "lost+found"],
        "no partial file, no temporary one"
    );
    // The GETs stopped at the error: far fewer than the object's 256 ranges were asked for.
    let gets = server.object.gets.load(Ordering::Relaxed);
    assert!(gets < 128, "{gets} GETs");
}

#[test]
fn urls_that_cannot_take_a_copy_are_refused() {
    let server = serve(data(10));
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f");
    std::fs::write(&src, b"0123456789").unwrap();
    // http(s) is read-only: the copy fails before it starts, not file by file.
    match ferrio::copy([&src], &server.url, &CopyOptions::new()) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("read-only"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(RemoteWriter::create(&server.url).is_err());
    // A directory or a prefix needs recursive, as with cp.
    match ferrio::copy([dir.path()], "s3://bucket/prefix/", &CopyOptions::new()) {
        Err(e @ Error::Fs { .. }) => {
            assert!(e.to_string().contains("recursive (-r)"), "{e}");
            assert_eq!(
                e.os_error().and_then(|e| e.raw_os_error()),
                Some(libc::EISDIR)
            );
        }
        other => panic!("{other:?}"),
    }
    match ferrio::copy(["s3://bucket/prefix/"], dir.path(), &CopyOptions::new()) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("recursive (-r)"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A tree to an http(s) URL: refused as read-only once, before the tree is walked.
    match ferrio::copy(
        [dir.path()],
        format!("{}/", server.url),
        &CopyOptions::new().recursive(true),
    ) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("read-only"), "{m}"),
        other => panic!("{other:?}"),
    }
    // An http(s) "directory" cannot be listed.
    match ferrio::copy(
        [format!("{}/", server.url)],
        dir.path().join("down"),
        &CopyOptions::new().recursive(true),
    ) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("cannot be listed"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!dir.path().join("down").exists());
}

#[test]
fn objects_of_one_store_share_its_cap_on_requests_in_flight() {
    let body = data(1 << 20);
    let server = serve(body.clone());
    server.object.delay_ms.store(20, Ordering::Relaxed);
    let mut s = small_ranges();
    s.set("remote_concurrency", "2").unwrap();
    // Two objects of one server (opened separately), read at once: 32 GETs of 64 KiB, each
    // slow enough to overlap, never more than 2 at the server.
    let a = RemoteFile::open_with(&server.url, s.clone()).unwrap();
    let b = RemoteFile::open_with(&server.url, s).unwrap();
    let (fa, fb) = (
        a.pread(vec![0u8; body.len()], 0),
        b.pread(vec![0u8; body.len()], 0),
    );
    for f in [fa, fb] {
        let (n, buf) = f.into_buffer();
        assert_eq!(n.unwrap(), body.len());
        assert!(buf == body);
    }
    assert_eq!(server.object.most_active.load(Ordering::SeqCst), 2);
}

#[test]
fn the_request_timeout_and_retries_are_settings() {
    let server = serve(data(100_000));
    let mut s = small_ranges();
    s.set("remote_timeout", "300ms").unwrap();
    s.set("remote_retries", "0").unwrap();
    let f = RemoteFile::open_with(&server.url, s).unwrap();
    server.object.delay_ms.store(3000, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let err = f.read_all().unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2500), "{took:?}: {err}");
    assert!(err.to_string().contains(&server.url), "{err}");
    // A server that never answers is a timeout, whether the body or the answer itself is late.
    let kind = std::io::Error::from(err).kind();
    assert_eq!(kind, std::io::ErrorKind::TimedOut);
}

// GPU reads through pinned pieces (`RemoteFile::pread_device_with`), on the emulated device:
// the same code as `pread_device` past the driver's address check.

/// A piece pool of `piece_len` bytes on `device`, under a budget of `limit` bytes.
fn piece_pool(
    device: &EmulatedDevice,
    piece_len: usize,
    limit: u64,
) -> Arc<PiecePool<EmulatedDevice>> {
    let budget = Arc::new(PinnedBudget::new(limit));
    Arc::new(PiecePool::new(device.clone(), piece_len, budget).unwrap())
}

/// Poisoned emulated device memory of `len` bytes (freed on drop).
struct EmuMem<'a> {
    device: &'a EmulatedDevice,
    ptr: DevicePtr,
    len: usize,
}

impl<'a> EmuMem<'a> {
    fn new(device: &'a EmulatedDevice, len: usize) -> Self {
        let ptr = device.alloc_device(len).unwrap();
        device.write_device(ptr, &poison(len)).unwrap();
        EmuMem { device, ptr, len }
    }
    fn read(&self) -> Vec<u8> {
        self.device.read_device(self.ptr, self.len).unwrap()
    }
}

impl Drop for EmuMem<'_> {
    fn drop(&mut self) {
        self.device.free_device(self.ptr).unwrap();
    }
}

/// Starts a read of `len` bytes at `offset` of `f` into `mem`.
fn start_gpu_read(
    f: &RemoteFile,
    pool: &Arc<PiecePool<EmulatedDevice>>,
    mem: &EmuMem<'_>,
    offset: u64,
) -> ferrio::IoFuture {
    // SAFETY: `mem` is emulated device memory of the pool's device, `mem.len` bytes, freed only
    // after the future is waited on (every caller waits before `mem` drops).
    unsafe { f.pread_device_with(pool, mem.ptr, mem.len, offset) }
}

/// A read that reported has no copy running, and every piece it used comes back to the pool.
#[track_caller]
fn assert_settled(device: &EmulatedDevice, pool: &PiecePool<EmulatedDevice>) {
    assert_eq!(
        device.copies_in_flight(),
        0,
        "the read reports after its copies"
    );
    assert_pieces_come_back(pool);
}

/// Waits until every piece of `pool` is back (GETs aborted by an error or a cancel give theirs
/// back as the runtime drops them, which may be just after the read reported).
#[track_caller]
fn assert_pieces_come_back(pool: &PiecePool<EmulatedDevice>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.free_pieces() != pool.pieces() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(pool.free_pieces(), pool.pieces(), "pieces not given back");
}

#[test]
fn gpu_reads_land_every_range_in_place_as_ranges_finish() {
    let body = data((1 << 20) + 123);
    let server = serve(body.clone());
    // The first range is slow: the others land, and are copied, before it.
    server.object.delay_at.lock().unwrap().push((0, 600));
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    let device = EmulatedDevice::default();
    let pool = piece_pool(&device, 64 << 10, u64::MAX);
    let mem = EmuMem::new(&device, body.len());
    let fut = start_gpu_read(&f, &pool, &mem, 0);
    std::thread::sleep(Duration::from_millis(300));
    let early = device.copies_completed();
    assert!(!fut.is_done());
    assert_eq!(fut.wait().unwrap(), body.len());
    assert!(
        early >= 3,
        "{early} ranges copied while the first was still on its way"
    );
    assert_bytes_eq(&mem.read(), &body, "whole object");
    server.object.delay_at.lock().unwrap().clear();
    // Ranges that do not start on a range boundary, and a read past the end: short, and the
    // device bytes past the object's end stay as they were.
    for (offset, len) in [
        (65_535usize, 3 * 65_538usize),
        (1, 100),
        (body.len() - 10, 1000),
    ] {
        let mem = EmuMem::new(&device, len);
        let n = start_gpu_read(&f, &pool, &mem, offset as u64)
            .wait()
            .unwrap();
        let expected = &body[offset..(offset + len).min(body.len())];
        assert_eq!(n, expected.len());
        let got = mem.read();
        assert_bytes_eq(&got[..n], expected, &format!("{len} bytes at {offset}"));
        assert_bytes_eq(&got[n..], &poison(len)[n..], "past the object's end");
    }
    // Nothing to read: no copy, no piece.
    let copies = device.copies_issued();
    let mem = EmuMem::new(&device, 10);
    assert_eq!(
        start_gpu_read(&f, &pool, &mem, body.len() as u64)
            .wait()
            .unwrap(),
        0
    );
    // SAFETY: a zero-length range touches no memory.
    let zero = unsafe { f.pread_device_with(&pool, DevicePtr(0), 0, 0) }.wait();
    assert_eq!(zero.unwrap(), 0);
    assert_eq!(device.copies_issued(), copies);
    // Pieces shorter than the ranges: each range fills several, one after another.
    let small = piece_pool(&device, 4096, u64::MAX);
    let mem = EmuMem::new(&device, (1 << 17) + 5);
    let copies = device.copies_issued();
    let n = start_gpu_read(&f, &small, &mem, 3).wait().unwrap();
    assert_eq!(n, (1 << 17) + 5);
    assert_bytes_eq(&mem.read(), &body[3..n + 3], "4 KiB pieces, 64 KiB ranges");
    assert_eq!(
        device.copies_issued() - copies,
        33,
        "32 full pieces and one of 5 bytes"
    );
    assert_pieces_come_back(&small);
    assert_eq!(device.violations(), Vec::<String>::new());
    assert_pieces_come_back(&pool);
}

#[test]
fn gpu_reads_split_a_crawling_range_and_land_both_halves_in_place() {
    let len = (4 << 20) + 4321;
    let body = data(len);
    let (server, f) = serve_crawling_first_range(body.clone());
    let device = EmulatedDevice::default();
    // Pieces that do not divide the ranges or their halves: a piece cut short by a split goes
    // over part full.
    let pool = piece_pool(&device, 100_000, u64::MAX);
    let mem = EmuMem::new(&device, len);
    assert_eq!(start_gpu_read(&f, &pool, &mem, 0).wait().unwrap(), len);
    assert_bytes_eq(&mem.read(), &body, "a GPU read with a crawling range");
    let asked = server.object.asked.lock().unwrap().clone();
    assert!(
        asked.iter().any(|r| r.0 > 0 && r.0 < 1 << 20),
        "no GET took over part of the slow range: {asked:?}"
    );
    assert_settled(&device, &pool);
}

#[test]
fn gpu_read_pieces_are_kept_and_bounded_by_concurrency_and_the_cap() {
    let body = data(1 << 20);
    let server = serve(body.clone());
    // Bodies slow enough that all 4 GETs at once hold a piece (a piece is taken when the reply
    // comes, and held while its body arrives): the pool grows to its limit.
    server.object.body_pause_ms.store(20, Ordering::Relaxed);
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    let device = EmulatedDevice::default();
    let piece = 64usize << 10;
    // Under a cap far above: as many pieces as GETs at once (4), made as the first read goes
    // and kept for the next ones, which pin nothing more.
    let pool = piece_pool(&device, piece, u64::MAX);
    let mut made = Vec::new();
    for round in 0..3 {
        let mem = EmuMem::new(&device, body.len());
        assert_eq!(
            start_gpu_read(&f, &pool, &mem, 0).wait().unwrap(),
            body.len()
        );
        assert_bytes_eq(&mem.read(), &body, &format!("read {round}"));
        assert_pieces_come_back(&pool);
        made.push((pool.pieces(), device.pinned_allocations()));
    }
    assert_eq!(made[0], (4, 4), "4 pieces, and nothing else pinned");
    assert_eq!(made, vec![made[0]; 3], "later reads reuse the pieces");
    drop(pool);
    assert_eq!(
        device.pinned_allocations(),
        0,
        "a dropped pool frees its pieces"
    );
    assert_eq!((device.live_events(), device.live_streams()), (0, 0));
    // Under a cap of 3 pieces: 3; under a cap below one piece: the 2 every pool gets.
    for (limit, expected) in [
        (3 * piece as u64 + 100, 3),
        (100, ferrio::bounce::MIN_PIECES),
    ] {
        let budget = Arc::new(PinnedBudget::new(limit));
        let pool = Arc::new(PiecePool::new(device.clone(), piece, budget.clone()).unwrap());
        for _ in 0..2 {
            let mem = EmuMem::new(&device, body.len());
            assert_eq!(
                start_gpu_read(&f, &pool, &mem, 0).wait().unwrap(),
                body.len()
            );
            assert_bytes_eq(&mem.read(), &body, &format!("under a cap of {limit} bytes"));
        }
        assert_pieces_come_back(&pool);
        assert_eq!(pool.pieces(), expected, "cap {limit}");
        assert_eq!(budget.used(), (expected * piece) as u64);
        drop(pool);
        assert_eq!(budget.used(), 0);
    }
    assert_eq!(device.violations(), Vec::<String>::new());
}

#[test]
fn gpu_read_never_refills_a_piece_whose_copy_runs() {
    let body = data(512 << 10);
    let server = serve(body.clone());
    let mut s = small_ranges();
    s.set("remote_range_size", "16KiB").unwrap();
    s.set("remote_max_range_size", "16KiB").unwrap();
    let f = RemoteFile::open_with(&server.url, s).unwrap();
    // Copies slower than the GETs: the pieces wait for them, and 32 ranges go round 4 pieces.
    let device = EmulatedDevice::new(Duration::from_millis(4));
    let pool = piece_pool(&device, 16 << 10, u64::MAX);
    let mem = EmuMem::new(&device, body.len());
    assert_eq!(
        start_gpu_read(&f, &pool, &mem, 0).wait().unwrap(),
        body.len()
    );
    assert_bytes_eq(&mem.read(), &body, "slow copies");
    assert_eq!(device.violations(), Vec::<String>::new());
    assert_eq!(device.copies_completed(), 32);
    assert!(pool.pieces() <= 4, "{} pieces", pool.pieces());
    assert_settled(&device, &pool);
}

#[test]
fn gpu_read_copy_failures_fail_the_read() {
    let body = data(1 << 20);
    let server = serve(body.clone());
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    let device = EmulatedDevice::new(Duration::from_millis(1));
    let pool = piece_pool(&device, 64 << 10, u64::MAX);
    // A copy that cannot be started: the read fails with it, and every piece comes back.
    device.fail_copy_issue(2);
    let mem = EmuMem::new(&device, body.len());
    let err = start_gpu_read(&f, &pool, &mem, 0).wait().unwrap_err();
    assert!(
        err.to_string().contains("injected failure issuing copy"),
        "{err}"
    );
    assert_settled(&device, &pool);
    assert!(!pool.is_poisoned());
    assert_eq!(
        start_gpu_read(&f, &pool, &mem, 0).wait().unwrap(),
        body.len()
    );
    assert_bytes_eq(&mem.read(), &body, "after a copy that could not start");
    // A copy that fails while running: the read fails with it; its pieces may still be read by
    // the device, so the pool is retired and later reads through it fail at once.
    device.fail_copy_run(3);
    let err = start_gpu_read(&f, &pool, &mem, 0).wait().unwrap_err();
    assert!(matches!(err, ferrio::Error::Cuda { .. }), "{err}");
    assert!(
        err.to_string().contains("injected failure running copy"),
        "{err}"
    );
    assert!(pool.is_poisoned());
    let err = start_gpu_read(&f, &pool, &mem, 0).wait().unwrap_err();
    assert!(err.to_string().contains("retired"), "{err}");
    device.clear_fault();
    assert_eq!(device.violations(), Vec::<String>::new());
}

#[test]
fn gpu_read_get_failures_fail_the_read_and_give_pieces_back() {
    let body = data(1 << 20);
    let server = serve(body.clone());
    let mut s = small_ranges();
    s.set("remote_concurrency", "1").unwrap();
    let f = RemoteFile::open_with(&server.url, s).unwrap();
    let device = EmulatedDevice::default();
    let pool = piece_pool(&device, 64 << 10, u64::MAX);
    let mem = EmuMem::new(&device, body.len());
    // The object changes after three ranges: those three are in place, the read fails.
    let opened = server.object.gets.load(Ordering::Relaxed);
    server
        .object
        .replace_after
        .store(opened + 3, Ordering::Relaxed);
    let err = start_gpu_read(&f, &pool, &mem, 0).wait().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("changed since it was opened"), "{text}");
    assert!(text.contains(&server.url), "{text}");
    let got = mem.read();
    assert_bytes_eq(
        &got[..3 << 16],
        &body[..3 << 16],
        "ranges before the failure",
    );
    assert_settled(&device, &pool);
    assert!(!pool.is_poisoned());
    assert_eq!(device.violations(), Vec::<String>::new());
}

#[test]
fn gpu_read_cancel_stops_gets_in_flight_and_gives_pieces_back() {
    let server = serve(data(1 << 20));
    server.object.delay_ms.store(20_000, Ordering::Relaxed);
    let f = RemoteFile::open_with(&server.url, small_ranges()).unwrap();
    let device = EmulatedDevice::default();
    let pool = piece_pool(&device, 64 << 10, u64::MAX);
    let mem = EmuMem::new(&device, 1 << 20);
    let fut = start_gpu_read(&f, &pool, &mem, 0);
    // Let the GETs reach the server, where they hang.
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    fut.cancel();
    let r = fut.wait();
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "cancel took {:?}",
        t0.elapsed()
    );
    assert_pieces_come_back(&pool);
    // Pieces are pinned ahead while the GETs wait (one per GET: 16 of 64 KiB), but none is
    // held by a GET the server has not answered: all are back in the pool.
    assert!(pool.pieces() <= 16, "{} pieces pinned", pool.pieces());
    assert_eq!(mem.read(), poison(1 << 20), "nothing was copied");
}
