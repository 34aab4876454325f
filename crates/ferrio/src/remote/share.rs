//! The ranges of one remote read, shared by the GETs that fetch them ([`Shares`]), with work
//! stealing at the end.
//!
//! Each GET takes the next planned range. Once none is left, a GET that comes free takes the
//! second half of the range in flight with the most time left to run, and that range's GET
//! stops where the second half begins: it lands nothing past its (moving) end and drops its
//! body there. So a read no longer waits for its slowest connection to bring a whole range; its
//! last bytes come over two connections, then four. A half is taken only where that pays: a new
//! GET first waits for its reply (the mean wait of this read's GETs so far), so the range must
//! have more than twice that left to run at its rate so far, and at least `min_split` bytes.
//!
//! The state is one small lock per read: a GET takes it once per piece of its body (to claim
//! the piece's bytes before landing them) and once per range, never while it waits.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Halves are cut at multiples of this (GPU pieces and host copies like aligned starts).
const SPLIT_ALIGN: u64 = 64 << 10;

/// The ranges of one read: those not yet asked for, and those whose GETs run.
pub(crate) struct Shares {
    state: Mutex<State>,
    /// No range in flight with fewer bytes left than this is split.
    min_split: u64,
    /// Wakes the GETs waiting for their replies when a range's rest is taken from its GET
    /// ([`Share::taken`]).
    taken: Notify,
}

struct State {
    /// Ranges not yet taken, in the order they are to be asked for.
    planned: VecDeque<Range<u64>>,
    /// The ranges in flight, by [`Share::slot`]; `None` marks a free slot.
    running: Vec<Option<Running>>,
    /// What the GETs of this read waited for their replies, summed, and how many replies.
    replies: (Duration, u32),
}

/// A range in flight.
struct Running {
    /// The next byte its GET lands.
    at: u64,
    /// Its GET lands nothing at or past this; a steal moves it down.
    end: u64,
    /// When its body began to arrive, and `at` then (its rate so far).
    body: Option<(Instant, u64)>,
}

impl Running {
    /// How long it has left at its rate so far, if it has a rate yet.
    fn time_left(&self, now: Instant) -> Option<Duration> {
        let (began, from) = self.body?;
        let landed = self.at.checked_sub(from).filter(|&n| n > 0)?;
        let secs = now.duration_since(began).as_secs_f64() * (self.end - self.at) as f64;
        Some(Duration::from_secs_f64(secs / landed as f64))
    }
}

impl Shares {
    /// The shares of a read planned as `ranges` (tiling it, in order).
    pub(crate) fn new(ranges: impl IntoIterator<Item = Range<u64>>, min_split: u64) -> Arc<Shares> {
        Arc::new(Shares {
            state: Mutex::new(State {
                planned: ranges.into_iter().filter(|r| !r.is_empty()).collect(),
                running: Vec::new(),
                replies: (Duration::ZERO, 0),
            }),
            min_split: min_split.max(2 * SPLIT_ALIGN),
            taken: Notify::new(),
        })
    }

    /// Ranges not yet taken.
    pub(crate) fn planned(&self) -> usize {
        self.lock().planned.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain numbers, each update whole: a poisoned lock still holds a consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next range for a GET: the next planned one, else the second half of the range in
    /// flight with the most time left (where that pays, see the module's doc); else whether a
    /// range in flight is long enough that one may pay later.
    /// With `for_all`, the ranges strictly in order, whole: the next planned one, or where a
    /// range in flight has bytes not yet landed before that, all of them, taken from its GET
    /// (which lands nothing more, and stops waiting for its reply: [`Share::taken`]). So the one
    /// GET that reads a server's whole object (`fetch.rs`) reads its body front to back once,
    /// waiting for no other GET.
    pub(crate) fn take(self: &Arc<Self>, for_all: bool) -> Next {
        let mut st = self.lock();
        if for_all {
            let next = st.planned.front().map_or(u64::MAX, |r| r.start);
            let earliest = st
                .running
                .iter_mut()
                .flatten()
                .filter(|r| r.at < r.end && r.at < next)
                .min_by_key(|r| r.at);
            if let Some(victim) = earliest {
                let rest = victim.at..victim.end;
                victim.end = victim.at;
                st.planned.push_front(rest);
                self.taken.notify_waiters();
            } else if next == u64::MAX {
                return Next::Done;
            }
        }
        let range = match st.planned.pop_front() {
            Some(r) => r,
            None => match self.steal(&mut st, Instant::now()) {
                Some(half) => half,
                None if st
                    .running
                    .iter()
                    .flatten()
                    .any(|r| r.end - r.at >= self.min_split) =>
                {
                    return Next::Later
                }
                None => return Next::Done,
            },
        };
        let running = Running {
            at: range.start,
            end: range.end,
            body: None,
        };
        let slot = match st.running.iter().position(Option::is_none) {
            Some(free) => {
                st.running[free] = Some(running);
                free
            }
            None => {
                st.running.push(Some(running));
                st.running.len() - 1
            }
        };
        Next::Range(Share {
            shares: self.clone(),
            slot,
            start: range.start,
        })
    }

    /// Moves the end of the range in flight with the most time left to its middle and returns
    /// the half cut off, if one pays.
    fn steal(&self, st: &mut State, now: Instant) -> Option<Range<u64>> {
        let (waited, replies) = st.replies;
        let reply_wait = waited.checked_div(replies).unwrap_or(Duration::ZERO);
        let victim = st
            .running
            .iter_mut()
            .flatten()
            .filter(|r| r.end - r.at >= self.min_split)
            .filter_map(|r| r.time_left(now).map(|t| (t, r)))
            .filter(|(t, _)| *t > 2 * reply_wait)
            .max_by_key(|(t, _)| *t)
            .map(|(_, r)| r)?;
        let middle = crate::plan::align_down(victim.at + (victim.end - victim.at) / 2, SPLIT_ALIGN);
        if middle <= victim.at {
            return None;
        }
        let cut = middle..victim.end;
        victim.end = middle;
        Some(cut)
    }
}

/// What a GET that comes free does next ([`Shares::take`]).
pub(crate) enum Next {
    /// Fetch this range.
    Range(Share),
    /// Nothing now; a range in flight may be worth splitting later: look again in a moment.
    Later,
    /// Nothing is left that could be split: this GET's work for the read is done.
    Done,
}

impl Next {
    /// The range, if there is one.
    #[cfg(test)]
    fn range(self) -> Option<Share> {
        match self {
            Next::Range(share) => Some(share),
            Next::Later | Next::Done => None,
        }
    }
}

/// One GET's range of a read ([`Shares::take`]): from `start` to an end that a steal may move
/// down while the GET runs. Dropping it frees its slot.
pub(crate) struct Share {
    shares: Arc<Shares>,
    slot: usize,
    start: u64,
}

impl Share {
    /// The range's first byte.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    fn with<T>(&self, f: impl FnOnce(&mut Running, &mut State) -> T) -> T {
        let mut st = self.shares.lock();
        let mut running = st.running[self.slot]
            .take()
            .expect("a share's slot holds its range while the share lives");
        let out = f(&mut running, &mut st);
        st.running[self.slot] = Some(running);
        out
    }

    /// Where the range ends now: the GET lands nothing at or past it.
    pub(crate) fn end(&self) -> u64 {
        self.with(|r, _| r.end)
    }

    /// Records that the GET's reply came after `waited` (the store's answer, before the body),
    /// and that its body starts arriving now at byte `at`.
    pub(crate) fn answered(&self, at: u64, waited: Duration) {
        self.with(|r, st| {
            st.replies.0 += waited;
            st.replies.1 += 1;
            r.body = Some((Instant::now(), at));
        });
    }

    /// Claims `n` bytes arriving at `at` (the next ones of the range) for landing: returns how
    /// many of them lie before the range's end, which are then the GET's to land. Fewer than
    /// `n` means the rest was taken by another GET: land what was claimed and stop.
    pub(crate) fn claim(&self, at: u64, n: usize) -> usize {
        self.with(|r, _| {
            debug_assert_eq!(at, r.at, "a GET claims its bytes in order");
            let k = (n as u64).min(r.end.saturating_sub(at));
            r.at = at + k;
            k as usize
        })
    }
}

impl Share {
    /// Resolves once the range has nothing left for this GET from `at` on: another GET took
    /// the rest ([`Shares::take`] with `for_all`). For a GET still waiting for its reply.
    pub(crate) async fn taken(&self, at: u64) {
        loop {
            // Registered before the end is read, so a take between the two still wakes it.
            let mut moved = std::pin::pin!(self.shares.taken.notified());
            moved.as_mut().enable();
            if self.end() <= at {
                return;
            }
            moved.await;
        }
    }

    /// Puts what this GET has not landed of its range back among the planned ranges, in its
    /// place by offset, for another GET to take.
    pub(crate) fn give_back(self) {
        let mut st = self.shares.lock();
        if let Some(r) = st.running[self.slot].as_ref().filter(|r| r.at < r.end) {
            let rest = r.at..r.end;
            let place = st.planned.partition_point(|p| p.start < rest.start);
            st.planned.insert(place, rest);
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.shares.lock().running[self.slot] = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_range_given_back_is_taken_again_in_its_place_and_for_all_takes_in_order() {
        let shares = Shares::new([0..MIB, MIB..2 * MIB, 2 * MIB..3 * MIB], MIB);
        let a = shares.take(false).range().unwrap();
        let b = shares.take(false).range().unwrap();
        assert_eq!(a.claim(0, 1000), 1000);
        // `b` gives back all of its range.
        b.give_back();
        // In order: what `a` has not landed comes first, taken from it; `a` lands no more.
        let rest = shares.take(true).range().unwrap();
        assert_eq!((rest.start(), rest.end()), (1000, MIB));
        assert_eq!(a.end(), 1000);
        assert_eq!(a.claim(1000, 10), 0);
        drop((a, rest));
        // A GET takes the range given back and lands some: the next in order is its rest.
        let c = shares.take(false).range().unwrap();
        assert_eq!((c.start(), c.end()), (MIB, 2 * MIB));
        assert_eq!(c.claim(MIB, 10), 10);
        let tail = shares.take(true).range().unwrap();
        assert_eq!((tail.start(), tail.end()), (MIB + 10, 2 * MIB));
        assert_eq!(c.end(), MIB + 10);
        drop(tail);
        let last = shares.take(true).range().unwrap();
        assert_eq!((last.start(), last.end()), (2 * MIB, 3 * MIB));
        drop(last);
        drop(c);
        assert!(matches!(shares.take(true), Next::Done));
    }

    #[test]
    fn planned_ranges_come_first_in_order_then_nothing_without_a_rate() {
        let shares = Shares::new([0..8 * MIB, 8 * MIB..16 * MIB], MIB);
        let a = shares.take(false).range().unwrap();
        let b = shares.take(false).range().unwrap();
        assert_eq!((a.start(), a.end()), (0, 8 * MIB));
        assert_eq!((b.start(), b.end()), (8 * MIB, 16 * MIB));
        // Both in flight, neither has a body yet: nothing to steal now, maybe later.
        assert!(matches!(shares.take(false), Next::Later));
    }

    #[test]
    fn a_free_get_takes_the_second_half_of_the_slowest_range() {
        let shares = Shares::new([0..64 * MIB, 64 * MIB..72 * MIB], MIB);
        let slow = shares.take(false).range().unwrap();
        let fast = shares.take(false).range().unwrap();
        slow.answered(0, Duration::ZERO);
        fast.answered(64 * MIB, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(slow.claim(0, MIB as usize), MIB as usize);
        assert_eq!(fast.claim(64 * MIB, 8 * MIB as usize), 8 * MIB as usize);
        drop(fast);
        // The slow range has 63 MiB left: its second half is cut off at a 64 KiB multiple.
        let thief = shares.take(false).range().unwrap();
        let middle = 32 * MIB + MIB / 2;
        assert_eq!((thief.start(), thief.end()), (middle, 64 * MIB));
        assert_eq!(slow.end(), middle);
        // The slow GET lands only up to the cut: a piece across it is claimed in part.
        let n = (middle - MIB) as usize;
        assert_eq!(slow.claim(MIB, n - 100), n - 100);
        assert_eq!(slow.claim(MIB + n as u64 - 100, 4096), 100);
        assert_eq!(slow.claim(middle, 4096), 0);
    }

    #[test]
    fn nothing_is_stolen_that_would_not_pay_for_a_new_reply() {
        let shares = Shares::new([0..4 * MIB, 4 * MIB..5 * MIB], MIB);
        let a = shares.take(false).range().unwrap();
        let b = shares.take(false).range().unwrap();
        // Replies took 10 s on average: no range has 20 s left at its rate.
        a.answered(0, Duration::from_secs(10));
        b.answered(4 * MIB, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(5));
        a.claim(0, 4096);
        b.claim(4 * MIB, MIB as usize);
        drop(b);
        assert!(shares.take(false).range().is_none());
        // Too few bytes left is not split either, however slow.
        let shares = Shares::new(std::iter::once(0..MIB + 4096), MIB);
        let a = shares.take(false).range().unwrap();
        a.answered(0, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        a.claim(0, 8192);
        assert!(matches!(shares.take(false), Next::Done));
    }

    #[test]
    fn a_get_waiting_for_its_reply_is_woken_when_its_range_is_taken() {
        use futures::task::{waker, ArcWake};
        use std::future::Future;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::task::Context;

        struct Count(AtomicUsize);
        impl ArcWake for Count {
            fn wake_by_ref(me: &Arc<Self>) {
                me.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let wake = waker(woken.clone());
        let mut cx = Context::from_waker(&wake);

        let shares = Shares::new([0..MIB, MIB..2 * MIB], MIB);
        let a = shares.take(false).range().unwrap();
        let b = shares.take(false).range().unwrap();
        let mut waiting = std::pin::pin!(a.taken(0));
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        // The one GET reading in order takes `a`'s range: `a`'s wait ends at once, no timer.
        let rest = shares.take(true).range().unwrap();
        assert_eq!((rest.start(), rest.end()), (0, MIB));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        // `b`'s range is not taken: its wait goes on.
        let mut other = std::pin::pin!(b.taken(MIB));
        assert!(other.as_mut().poll(&mut cx).is_pending());
    }

    #[test]
    fn a_dropped_share_frees_its_slot_for_the_next() {
        let shares = Shares::new([0..MIB, MIB..2 * MIB, 2 * MIB..3 * MIB], MIB);
        let a = shares.take(false).range().unwrap();
        let b = shares.take(false).range().unwrap();
        drop(a);
        let c = shares.take(false).range().unwrap();
        assert_eq!(c.slot, 0);
        assert_eq!((b.end(), c.start(), c.end()), (2 * MIB, 2 * MIB, 3 * MIB));
    }
}
