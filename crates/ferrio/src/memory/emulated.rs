//! Streams and events emulated in host memory, so the pool's ordering logic runs in CI.
//!
//! Each [`EmulatedStream`] is a queue with a virtual clock: work is enqueued with
//! [`EmulatedStreams::launch`] (a "kernel" that uses a byte range) and runs only when a test
//! calls [`EmulatedStreams::advance`]. An event recorded on a stream completes when that
//! stream's clock has passed every item enqueued before the record; a wait puts an item in the
//! waiting stream's queue that does not finish before the event does, exactly like
//! `cuStreamWaitEvent`.
//!
//! The emulator also checks what a GPU would get wrong silently: when a launch runs while an
//! earlier-issued launch on another stream that touches the same bytes has not finished, it
//! notes a *hazard* ([`EmulatedStreams::hazards`]). A pool that hands a block to a second
//! stream without ordering it after the first stream's pending use produces one.
//!
//! It may not touch: anything outside host memory. Locks: a stream's queue lock is taken
//! before the launch table lock and the log lock; no two queue locks are ever held at once.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::order::{StreamId, StreamOrder};
use crate::error::Result;

/// One thing the emulator was asked to do, in the order it was asked (with logging on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmulatedOp {
    /// Work that uses `[addr, addr + len)` was enqueued on `stream` at queue `position`.
    Launch {
        /// The stream.
        stream: StreamId,
        /// 1-based position in the stream's queue.
        position: u64,
        /// First byte used.
        addr: usize,
        /// Bytes used.
        len: usize,
    },
    /// `event` was recorded on `stream`; it completes once the stream has run `position` items.
    Record {
        /// The event's number.
        event: u64,
        /// The stream.
        stream: StreamId,
        /// Items the stream must have run.
        position: u64,
    },
    /// `stream` was made to wait for `event`.
    Wait {
        /// The waiting stream.
        stream: StreamId,
        /// The event's number.
        event: u64,
        /// The stream and position the event stood for, if it was ever recorded.
        on: Option<(StreamId, u64)>,
        /// Whether the event had already completed (then nothing is enqueued).
        satisfied: bool,
    },
    /// `event` was queried.
    Query {
        /// The event's number.
        event: u64,
        /// The answer.
        complete: bool,
    },
}

/// How often each ordering call was made (to compare event strategies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmulatedCalls {
    /// Events created.
    pub events_created: u64,
    /// `record` calls.
    pub records: u64,
    /// `is_complete` calls.
    pub queries: u64,
    /// `wait` calls.
    pub waits: u64,
    /// `wait` calls on an event that had not completed (the ones that cost device ordering).
    pub waits_pending: u64,
}

#[derive(Debug)]
enum Item {
    Launch { issue: u64, addr: usize, len: usize },
    Wait { on: Arc<Queue>, position: u64 },
}

#[derive(Debug)]
struct Queue {
    id: StreamId,
    items: Mutex<VecDeque<Item>>,
    /// Items ever enqueued; written under `items`.
    enqueued: AtomicU64,
    /// Items finished; written under `items`.
    completed: AtomicU64,
}

/// A launch that has not run yet, for the hazard check.
#[derive(Debug)]
struct Use {
    stream: StreamId,
    addr: usize,
    len: usize,
}

#[derive(Debug, Default)]
struct Counters {
    events_created: AtomicU64,
    records: AtomicU64,
    queries: AtomicU64,
    waits: AtomicU64,
    waits_pending: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    issue: AtomicU64,
    next_event: AtomicU64,
    pending: Mutex<BTreeMap<u64, Use>>,
    hazards: Mutex<Vec<String>>,
    log: Option<Mutex<Vec<EmulatedOp>>>,
    streams: Mutex<Vec<Weak<Queue>>>,
    /// Off for benchmarks: the check scans every pending launch.
    check_hazards: bool,
    call_cost: Duration,
    counters: Counters,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            issue: AtomicU64::new(0),
            next_event: AtomicU64::new(0),
            pending: Mutex::new(BTreeMap::new()),
            hazards: Mutex::new(Vec::new()),
            log: None,
            streams: Mutex::new(Vec::new()),
            check_hazards: true,
            call_cost: Duration::ZERO,
            counters: Counters::default(),
        }
    }
}

/// The emulated stream/event model (a [`StreamOrder`]). Clones share one set of streams.
#[derive(Clone, Debug, Default)]
pub struct EmulatedStreams {
    shared: Arc<Shared>,
}

/// A stream of an [`EmulatedStreams`].
#[derive(Clone, Debug)]
pub struct EmulatedStream {
    queue: Arc<Queue>,
}

impl EmulatedStream {
    /// The stream's id.
    pub fn id(&self) -> StreamId {
        self.queue.id
    }
}

/// An event of an [`EmulatedStreams`].
#[derive(Debug)]
pub struct EmulatedEvent {
    id: u64,
    target: Mutex<Option<(Arc<Queue>, u64)>>,
}

impl EmulatedEvent {
    /// The event's number, as it appears in [`EmulatedOp`]s.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// Locks, taking over a lock whose holder panicked: every critical section here leaves the
/// data consistent between statements, so the data is still good.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EmulatedStreams {
    /// A model that checks for hazards, with logging off and free calls.
    pub fn new() -> Self {
        Self::default()
    }

    /// A model that checks for hazards and keeps a log of every call
    /// ([`log_entries`](Self::log_entries)).
    pub fn with_log() -> Self {
        EmulatedStreams {
            shared: Arc::new(Shared {
                log: Some(Mutex::new(Vec::new())),
                ..Shared::default()
            }),
        }
    }

    /// A model for measurements: no hazard checks (they scan every pending launch) and every
    /// `record`, `is_complete` and `wait` call spins for `call_cost`, to stand in for the
    /// driver's per-call latency.
    pub fn for_benchmarks(call_cost: Duration) -> Self {
        EmulatedStreams {
            shared: Arc::new(Shared {
                call_cost,
                check_hazards: false,
                ..Shared::default()
            }),
        }
    }

    /// Creates a stream with a new unique id.
    pub fn create_stream(&self) -> EmulatedStream {
        let queue = Arc::new(Queue {
            id: StreamId::unique(),
            items: Mutex::new(VecDeque::new()),
            enqueued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        });
        let mut streams = lock(&self.shared.streams);
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(&queue));
        EmulatedStream { queue }
    }

    fn log(&self, op: impl FnOnce() -> EmulatedOp) {
        if let Some(log) = &self.shared.log {
            lock(log).push(op());
        }
    }

    fn spend_call_cost(&self) {
        let cost = self.shared.call_cost;
        if !cost.is_zero() {
            let start = Instant::now();
            while start.elapsed() < cost {
                std::hint::spin_loop();
            }
        }
    }

    /// Enqueues work on `stream` that reads and writes `[addr, addr + len)`.
    pub fn launch(&self, stream: &EmulatedStream, addr: usize, len: usize) {
        let q = &stream.queue;
        let mut items = lock(&q.items);
        let issue = self.shared.issue.fetch_add(1, Ordering::Relaxed);
        if self.shared.check_hazards {
            lock(&self.shared.pending).insert(
                issue,
                Use {
                    stream: q.id,
                    addr,
                    len,
                },
            );
        }
        items.push_back(Item::Launch { issue, addr, len });
        let position = q.enqueued.fetch_add(1, Ordering::AcqRel) + 1;
        self.log(|| EmulatedOp::Launch {
            stream: q.id,
            position,
            addr,
            len,
        });
    }

    /// Runs up to `max_items` items at the head of `stream`'s queue, stopping early at a wait
    /// whose event has not completed. Returns how many ran.
    pub fn advance(&self, stream: &EmulatedStream, max_items: usize) -> usize {
        self.advance_queue(&stream.queue, max_items)
    }

    fn advance_queue(&self, q: &Queue, max_items: usize) -> usize {
        let mut items = lock(&q.items);
        let mut ran = 0;
        while ran < max_items {
            let ready = match items.front() {
                None => break,
                Some(Item::Wait { on, position }) => {
                    on.completed.load(Ordering::Acquire) >= *position
                }
                Some(Item::Launch { .. }) => true,
            };
            if !ready {
                break;
            }
            if let Some(Item::Launch { issue, addr, len }) = items.pop_front() {
                self.run_launch(q.id, issue, addr, len);
            }
            q.completed.fetch_add(1, Ordering::AcqRel);
            ran += 1;
        }
        ran
    }

    fn run_launch(&self, stream: StreamId, issue: u64, addr: usize, len: usize) {
        if !self.shared.check_hazards {
            return;
        }
        let mut pending = lock(&self.shared.pending);
        pending.remove(&issue);
        let clashes: Vec<String> = pending
            .range(..issue)
            .filter(|(_, u)| u.stream != stream && u.addr < addr + len && addr < u.addr + u.len)
            .map(|(earlier, u)| {
                format!(
                    "launch {issue} on stream {stream} over [{addr:#x}, +{len}) ran before \
                     launch {earlier} on stream {} over [{:#x}, +{}) finished",
                    u.stream, u.addr, u.len
                )
            })
            .collect();
        drop(pending);
        if !clashes.is_empty() {
            lock(&self.shared.hazards).extend(clashes);
        }
    }

    /// Advances every live stream until none can make progress. Returns true when every queue
    /// is empty (false would mean a wait that can never be satisfied).
    pub fn run_until_idle(&self) -> bool {
        loop {
            let queues: Vec<Arc<Queue>> = lock(&self.shared.streams)
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            let ran: usize = queues
                .iter()
                .map(|q| self.advance_queue(q, usize::MAX))
                .sum();
            if ran == 0 {
                return queues.iter().all(|q| lock(&q.items).is_empty());
            }
        }
    }

    /// Items enqueued on `stream` that have not run.
    pub fn pending(&self, stream: &EmulatedStream) -> usize {
        lock(&stream.queue.items).len()
    }

    /// Every call so far, in order (empty unless made with [`with_log`](Self::with_log)).
    pub fn log_entries(&self) -> Vec<EmulatedOp> {
        self.shared
            .log
            .as_ref()
            .map(|l| lock(l).clone())
            .unwrap_or_default()
    }

    /// Ordering violations seen so far (see the module docs).
    pub fn hazards(&self) -> Vec<String> {
        lock(&self.shared.hazards).clone()
    }

    /// How often each call was made.
    pub fn calls(&self) -> EmulatedCalls {
        let c = &self.shared.counters;
        EmulatedCalls {
            events_created: c.events_created.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            queries: c.queries.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
            waits_pending: c.waits_pending.load(Ordering::Relaxed),
        }
    }

    fn target(event: &EmulatedEvent) -> Option<(Arc<Queue>, u64)> {
        lock(&event.target).clone()
    }
}

impl StreamOrder for EmulatedStreams {
    type Stream = EmulatedStream;
    type Event = EmulatedEvent;

    fn stream_id(&self, stream: &EmulatedStream) -> StreamId {
        stream.queue.id
    }

    fn create_event(&self) -> Result<EmulatedEvent> {
        self.shared
            .counters
            .events_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(EmulatedEvent {
            id: self.shared.next_event.fetch_add(1, Ordering::Relaxed),
            target: Mutex::new(None),
        })
    }

    fn record(&self, event: &EmulatedEvent, stream: &EmulatedStream) -> Result<()> {
        self.spend_call_cost();
        self.shared.counters.records.fetch_add(1, Ordering::Relaxed);
        let q = &stream.queue;
        // Hold the queue lock so no launch slips in between reading the position and setting it.
        let items = lock(&q.items);
        let position = q.enqueued.load(Ordering::Acquire);
        *lock(&event.target) = Some((Arc::clone(q), position));
        self.log(|| EmulatedOp::Record {
            event: event.id,
            stream: q.id,
            position,
        });
        drop(items);
        Ok(())
    }

    fn is_complete(&self, event: &EmulatedEvent) -> Result<bool> {
        self.spend_call_cost();
        self.shared.counters.queries.fetch_add(1, Ordering::Relaxed);
        let complete = match Self::target(event) {
            None => true,
            Some((q, position)) => q.completed.load(Ordering::Acquire) >= position,
        };
        self.log(|| EmulatedOp::Query {
            event: event.id,
            complete,
        });
        Ok(complete)
    }

    fn wait(&self, stream: &EmulatedStream, event: &EmulatedEvent) -> Result<()> {
        self.spend_call_cost();
        self.shared.counters.waits.fetch_add(1, Ordering::Relaxed);
        let target = Self::target(event);
        let q = &stream.queue;
        let mut items = lock(&q.items);
        let on = target.as_ref().map(|(t, p)| (t.id, *p));
        let satisfied = match &target {
            None => true,
            Some((t, p)) => t.completed.load(Ordering::Acquire) >= *p,
        };
        if let (false, Some((t, position))) = (satisfied, target) {
            self.shared
                .counters
                .waits_pending
                .fetch_add(1, Ordering::Relaxed);
            items.push_back(Item::Wait { on: t, position });
            q.enqueued.fetch_add(1, Ordering::AcqRel);
        }
        self.log(|| EmulatedOp::Wait {
            stream: q.id,
            event: event.id,
            on,
            satisfied,
        });
        drop(items);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_completes_when_stream_reaches_it() {
        let emu = EmulatedStreams::with_log();
        let s = emu.create_stream();
        let ev = emu.create_event().unwrap();
        assert!(emu.is_complete(&ev).unwrap(), "never recorded: complete");
        emu.launch(&s, 0, 16);
        emu.record(&ev, &s).unwrap();
        emu.launch(&s, 16, 16);
        assert!(!emu.is_complete(&ev).unwrap());
        assert_eq!(emu.advance(&s, 1), 1);
        assert!(
            emu.is_complete(&ev).unwrap(),
            "only work before the record counts"
        );
        assert_eq!(emu.pending(&s), 1);
    }

    #[test]
    fn wait_orders_later_work_after_event() {
        let emu = EmulatedStreams::with_log();
        let (s, t) = (emu.create_stream(), emu.create_stream());
        let ev = emu.create_event().unwrap();
        emu.launch(&s, 0, 64);
        emu.record(&ev, &s).unwrap();
        emu.wait(&t, &ev).unwrap();
        emu.launch(&t, 0, 64);
        assert_eq!(emu.advance(&t, 10), 0, "t is blocked behind s");
        assert_eq!(emu.advance(&s, 10), 1);
        assert_eq!(emu.advance(&t, 10), 2);
        assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
        assert_eq!(emu.calls().waits_pending, 1);
    }

    #[test]
    fn unordered_overlapping_use_is_a_hazard() {
        let emu = EmulatedStreams::new();
        let (s, t) = (emu.create_stream(), emu.create_stream());
        emu.launch(&s, 0, 64);
        emu.launch(&t, 32, 64);
        emu.launch(&t, 1000, 64);
        emu.advance(&t, 10);
        let hazards = emu.hazards();
        assert_eq!(hazards.len(), 1, "{hazards:?}");
        assert!(emu.run_until_idle());
    }

    #[test]
    fn satisfied_wait_enqueues_nothing() {
        let emu = EmulatedStreams::with_log();
        let (s, t) = (emu.create_stream(), emu.create_stream());
        let ev = emu.create_event().unwrap();
        emu.record(&ev, &s).unwrap();
        emu.wait(&t, &ev).unwrap();
        assert_eq!(emu.pending(&t), 0);
        assert!(matches!(
            emu.log_entries().last(),
            Some(EmulatedOp::Wait {
                satisfied: true,
                ..
            })
        ));
    }
}
