//! One ranged GET of an object into memory, conditional on the version fixed at open: every
//! request carries `If-Match` (and the version id where the store has one; where a server gave
//! no ETag, `If-Unmodified-Since` its Last-Modified time), and the reply's ETag, Last-Modified,
//! object size and range are checked too, so an object replaced mid-read is an error, never a
//! mix of old and new bytes. A body that breaks off is asked again from where it stopped (the
//! request itself is retried by object_store's `RetryConfig`, which also resumes a broken body
//! when the reply had an ETag). Those re-asks draw on the same budget as a request's retries: at
//! most `remote_retries` of them, none started after `remote_retry_timeout` has passed since the
//! range's first failure, so a server that sends a little and then stalls, again and again,
//! fails within about that time rather than a multiple of it. The range is a [`Share`] of its
//! read, whose end another GET may take over while the body arrives (`share.rs`): the GET then
//! lands the bytes before that end and drops the rest of its body.
//!
//! A web server that ignores `Range` (`python -m http.server`) answers a ranged GET with the
//! whole object, which object_store refuses: the object is then marked as read whole
//! ([`Pinned::whole`]), and one GET of the read asks for the whole object and lands the read's
//! ranges from its body in order ([`Pinned::fetch_whole`]); the read's other GETs give theirs
//! back. Reads planned after that are one range each (`RemoteFile::ranges`).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::Either;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

use crate::bounce::trace;
use crate::error::{Error, Op, Result};

use super::share::Share;
use super::store;

/// Where the bytes of a GET go, as they arrive ([`Pinned::fetch`]).
pub(crate) trait Landing: Send {
    /// Takes `bytes`, the object's bytes from offset `at` on (the next ones of the range).
    fn land<'a>(
        &'a mut self,
        at: u64,
        bytes: &'a [u8],
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'a;

    /// Called once the range has landed whole (up to its end as it stands then): what is held
    /// back for more bytes (a pinned piece part full) goes on now.
    fn range_done(&mut self) -> impl std::future::Future<Output = Result<()>> + Send + '_ {
        std::future::ready(Ok(()))
    }
}

/// The object a read is pinned to: where it is and which version of it.
#[derive(Debug, Clone)]
pub(crate) struct Pinned {
    pub store: Arc<dyn ObjectStore>,
    pub path: Path,
    pub url: Arc<str>,
    /// The object's size at open.
    pub len: u64,
    /// What every request is conditional on ([`conditions`]).
    pub conditions: GetOptions,
    /// Most times one range's broken body is asked again (`remote_retries`).
    pub retries: usize,
    /// No range is asked again once this long has passed since its first failure
    /// (`remote_retry_timeout`).
    pub retry_timeout: Duration,
    /// Whether the server ignores `Range`, so that every GET asks for the whole object; shared
    /// by every read of the object, set by the first GET that finds out.
    pub whole: Arc<AtomicBool>,
}

/// The conditions that pin reads to the object `meta` describes: its ETag and version id, and
/// where it has no strong ETag (a plain HTTP server may give none, or a weak `W/"..."` one), its
/// Last-Modified time if known.
pub(crate) fn conditions(meta: &ObjectMeta) -> GetOptions {
    let modified_known = meta.last_modified.timestamp() != 0;
    let strong = meta.e_tag.as_deref().is_some_and(|e| !is_weak(e));
    GetOptions {
        if_match: meta.e_tag.clone(),
        version: meta.version.clone(),
        if_unmodified_since: (!strong && modified_known).then_some(meta.last_modified),
        ..GetOptions::default()
    }
}

/// Whether an ETag is weak (`W/"..."`): `If-Match` compares strongly (RFC 9110), so a server
/// that follows the rule refuses every request that carries one, though nothing changed.
fn is_weak(e_tag: &str) -> bool {
    e_tag.starts_with("W/")
}

impl Pinned {
    /// What a GET of `range` (`None`: the whole object) asks: the conditions, less a weak ETag
    /// (the replies' ETags are still compared with it, [`Pinned::replaced`]).
    fn options(&self, range: Option<Range<u64>>) -> GetOptions {
        let mut options = GetOptions {
            range: range.map(GetRange::Bounded),
            ..self.conditions.clone()
        };
        if options.if_match.as_deref().is_some_and(is_weak) {
            options.if_match = None;
        }
        options
    }

    /// Why the reply `got` describes another object than the one opened, if it does: another
    /// ETag, another Last-Modified time (where that pins it), or another size. What the reply
    /// leaves out (a server may send no ETag or Last-Modified with a range) is not held against
    /// it.
    fn replaced(&self, got: &ObjectMeta) -> Option<String> {
        let e_tag = self.conditions.if_match.as_deref();
        if let (Some(then), Some(now)) = (e_tag, got.e_tag.as_deref()) {
            if then != now {
                return Some(format!("ETag {then:?} at open, {now:?} now"));
            }
        }
        if let Some(then) = self.conditions.if_unmodified_since {
            let now = got.last_modified;
            if now.timestamp() != 0 && now != then {
                return Some(format!("last modified {then} at open, {now} now"));
            }
        }
        (got.size != self.len).then(|| format!("{} bytes at open, {} now", self.len, got.size))
    }

    fn read_err(&self, range: &Range<u64>, source: std::io::Error) -> Error {
        Error::Io {
            op: Op::Read,
            path: self.url.as_ref().into(),
            offset: range.start,
            len: range.end - range.start,
            source,
        }
    }

    /// Streams the object's bytes of `share` (inside the object) to `land`, in order: each
    /// piece of the body as it arrives, with the object offset of its first byte, up to the
    /// share's end as it stands when the piece comes; then `land.range_done()`. Nothing is
    /// asked of `land` before the server has answered, so memory that is scarce (pinned pieces)
    /// can be taken there and held only while a body arrives, not while the server thinks. A
    /// body that breaks off is asked again from where it stopped. An error of `land` ends the
    /// GET and is returned. [`Fetched::RangesIgnored`]: the server sent the whole object for
    /// the range (the object is then marked `whole`); nothing has landed.
    pub(crate) async fn fetch(&self, share: &Share, land: &mut impl Landing) -> Result<Fetched> {
        let mut at = share.start();
        let mut retry = Retry::default();
        loop {
            let end = share.end();
            if at >= end {
                break;
            }
            let want = at..end;
            let asked = Instant::now();
            let traced = trace::start();
            // The GET for the range, unless the range is taken from this GET while it waits
            // for the reply (the one GET reading a whole object takes every range in order).
            let get = std::pin::pin!(self
                .store
                .get_opts(&self.path, self.options(Some(want.clone()))));
            let taken = std::pin::pin!(share.taken(at));
            let got = match futures::future::select(get, taken).await {
                Either::Right(_) => break,
                Either::Left((got, _)) => got,
            };
            let got = match got {
                Ok(got) => got,
                Err(e) if store::ignores_range(&e) => {
                    self.whole.store(true, Ordering::Relaxed);
                    return Ok(Fetched::RangesIgnored);
                }
                Err(e) => return Err(self.read_err(&want, store::io_error(e))),
            };
            share.answered(at, asked.elapsed());
            trace::record("answer", traced, want.end - want.start);
            let body_began = (trace::start(), at);
            self.check_reply(&got.meta, &got.range, &want)?;
            let mut body = got.into_stream();
            let mut broke = None;
            while let Some(piece) = body.next().await {
                match piece {
                    Ok(bytes) => {
                        if bytes.len() as u64 > want.end - at {
                            return Err(self.read_err(
                                &want,
                                std::io::Error::other(
                                    "the server sent more bytes than the range holds",
                                ),
                            ));
                        }
                        let mine = share.claim(at, bytes.len());
                        if mine > 0 {
                            land.land(at, &bytes[..mine]).await?;
                            at += mine as u64;
                        }
                        if mine < bytes.len() {
                            // Another GET took the rest: this body is dropped here.
                            break;
                        }
                    }
                    Err(e) => {
                        broke = Some(e);
                        break;
                    }
                }
            }
            trace::record("body", body_began.0, at - body_began.1);
            if at < share.end() {
                // The body broke off (or ended early): ask again for what is missing.
                if let Some(cause) = retry.spent(self, broke) {
                    return Err(self.read_err(&want, cause));
                }
            }
        }
        land.range_done().await?;
        Ok(Fetched::Landed)
    }

    /// [`Pinned::fetch`] from a server that ignores `Range`: the share's bytes out of a GET of
    /// the whole object. `body` is the GET's body as far as it has come, kept from one share to
    /// the next: shares taken in order are read from one body, the bytes before each dropped,
    /// and a new GET is made only where a share starts before the body's position (or the body
    /// broke off, asked again within the same budget as a range's).
    pub(crate) async fn fetch_whole(
        &self,
        share: &Share,
        land: &mut impl Landing,
        body: &mut Option<WholeBody>,
    ) -> Result<()> {
        let mut at = share.start();
        let mut retry = Retry::default();
        while at < share.end() {
            let want = at..share.end();
            if body.as_ref().is_some_and(|b| b.next > at) {
                *body = None; // past the share's start: the object is asked for again
            }
            let b = match body {
                Some(b) => b,
                None => body.insert(self.get_whole(share, &want).await?),
            };
            let piece = match b.held.take() {
                Some(held) => Some(Ok(held)),
                None => b.stream.next().await,
            };
            match piece {
                Some(Ok(bytes)) => {
                    let first = b.next;
                    if bytes.len() as u64 > self.len - first {
                        return Err(self.read_err(
                            &want,
                            std::io::Error::other(
                                "the server sent more bytes than the object holds",
                            ),
                        ));
                    }
                    b.next += bytes.len() as u64;
                    if b.next <= at {
                        continue; // before the share: dropped
                    }
                    let from = (at - first) as usize;
                    let mine = share.claim(at, bytes.len() - from);
                    if mine > 0 {
                        land.land(at, &bytes[from..from + mine]).await?;
                        at += mine as u64;
                    }
                    if from + mine < bytes.len() {
                        // Past the share's end: kept for the next share.
                        b.next = at;
                        b.held = Some(bytes.slice(from + mine..));
                    }
                }
                broke => {
                    // The body broke off, or ended before the object did: a new GET.
                    *body = None;
                    // object_store resumes a broken body with a ranged GET, which this server
                    // answers with the whole object: that refusal is no cause of its own.
                    let broke = broke
                        .and_then(|r| r.err())
                        .filter(|e| !store::ignores_range(e));
                    if let Some(cause) = retry.spent(self, broke) {
                        return Err(self.read_err(&want, whole_hint(cause, at)));
                    }
                }
            }
        }
        land.range_done().await
    }

    /// A GET of the whole object, for `share`'s bytes `want`, its reply checked. It first asks
    /// for the object from `want`'s start on: a server that sent the whole object once (a CDN
    /// on a cache miss, say) may honour ranges again, and then the object is no longer read
    /// whole ([`Pinned::whole`]) and this body starts at `want`. A server that ignores `Range`
    /// costs one more request per body this way.
    async fn get_whole(&self, share: &Share, want: &Range<u64>) -> Result<WholeBody> {
        let asked = Instant::now();
        let rest = want.start..self.len;
        let (got, sent) = match self
            .store
            .get_opts(&self.path, self.options(Some(rest.clone())))
            .await
        {
            Ok(got) => {
                self.whole.store(false, Ordering::Relaxed);
                (got, rest)
            }
            Err(e) if store::ignores_range(&e) => {
                let got = self
                    .store
                    .get_opts(&self.path, self.options(None))
                    .await
                    .map_err(|e| self.read_err(want, store::io_error(e)))?;
                (got, 0..self.len)
            }
            Err(e) => return Err(self.read_err(want, store::io_error(e))),
        };
        share.answered(want.start, asked.elapsed());
        self.check_reply(&got.meta, &got.range, &sent)?;
        Ok(WholeBody {
            stream: got.into_stream(),
            next: sent.start,
            held: None,
        })
    }

    /// Checks a reply: the object is the one opened, and the bytes are those asked for.
    fn check_reply(&self, meta: &ObjectMeta, sent: &Range<u64>, asked: &Range<u64>) -> Result<()> {
        if let Some(why) = self.replaced(meta) {
            return Err(self.read_err(asked, store::changed(&why)));
        }
        if sent != asked {
            return Err(self.read_err(
                asked,
                std::io::Error::other(format!(
                    "{}: asked for bytes {asked:?}, the server sent {sent:?}",
                    self.url
                )),
            ));
        }
        Ok(())
    }
}

/// `cause` (of a failed stream of a whole object, `at` bytes in) with what to do about it: the
/// server ignores `Range`, so each read streams the object from its start, which must arrive
/// within one request's time.
fn whole_hint(cause: std::io::Error, at: u64) -> std::io::Error {
    std::io::Error::new(
        cause.kind(),
        format!(
            "{cause}; this server ignores Range, so each read streams the object from its start: \
             its first {at} bytes and more must come in one unbroken GET within remote_timeout \
             (raise it, or serve the object from a server that supports ranges)"
        ),
    )
}

/// What [`Pinned::fetch`] did with its share.
pub(crate) enum Fetched {
    /// Landed it whole.
    Landed,
    /// Nothing: the server ignores `Range` (see [`Pinned::fetch_whole`]).
    RangesIgnored,
}

/// A GET's body of the whole object ([`Pinned::fetch_whole`]).
pub(crate) struct WholeBody {
    stream: futures::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    /// The object offset of the body's next byte (of `held`'s first, while it holds one).
    next: u64,
    /// Bytes received past the share that took them, for the next.
    held: Option<bytes::Bytes>,
}

/// The budget for asking again for a body that broke off: at most `remote_retries` times, none
/// once `remote_retry_timeout` has passed since the first failure.
#[derive(Default)]
struct Retry {
    failures: usize,
    first: Option<Instant>,
}

impl Retry {
    /// Counts a failure of a GET (`broke`: its error, if it had one rather than ending early):
    /// `None` while the budget allows asking again, else the cause to report.
    fn spent(
        &mut self,
        pinned: &Pinned,
        broke: Option<object_store::Error>,
    ) -> Option<std::io::Error> {
        self.failures += 1;
        let since = *self.first.get_or_insert_with(Instant::now);
        if self.failures <= pinned.retries && since.elapsed() < pinned.retry_timeout {
            return None;
        }
        Some(match broke {
            Some(e) => store::io_error(e),
            None => std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the body ended early"),
        })
    }
}
