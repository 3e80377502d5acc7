//! The scheduler's streams, points on them, and the waits between them.
//!
//! Every device gets two streams: one for tasks and one for the copies that bring data
//! to it, so that transfers overlap computation. Work is enqueued at once (deferred
//! execution): a task goes on its device's stream as soon as it is placed, behind waits
//! for the points it depends on, and the stream runs it when they have passed.
//!
//! A [`Point`] is a position on one of these streams: everything enqueued there up to
//! and including the `seq`-th operation. Every operation is followed by an event, kept
//! until the scheduler has seen it complete, so that
//!
//! - a wait on another stream waits for exactly that operation, not also for the work
//!   queued behind it since (two devices exchanging data every step would otherwise run
//!   one after the other), and a point already seen complete needs no wait at all;
//! - when work fails, the scheduler learns which operation failed first on each stream
//!   and which ones the stream skipped after it (see `runtime::recovery`).
//!
//! Each stream also remembers, per other stream, the latest point it already waits for,
//! so a chain of tasks between two devices costs one wait per hop, not one per
//! dependency.

use std::collections::VecDeque;

use xpu_hal::{Event, Result, Stream};

/// A position on a stream (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Point {
    /// The stream's index in the scheduler.
    pub stream: usize,
    /// How many operations had been enqueued on it, this one included.
    pub seq: u64,
}

/// One stream and what the scheduler tracks of it.
pub(crate) struct StreamSlot {
    pub(crate) stream: Stream,
    /// Operations enqueued so far.
    pub(crate) seq: u64,
    /// Every operation up to this one is known to have run without error.
    pub(crate) completed: u64,
    /// The event after each operation not yet seen complete, oldest first, with its
    /// `seq`.
    pub(crate) inflight: VecDeque<(u64, Event)>,
    /// Per stream index: the latest point of that stream this one already waits for.
    waits_for: Vec<u64>,
    /// Set when a recovery saw this stream's failure through its events only: the
    /// stream's own report of it was taken elsewhere meanwhile (a `wait_all` that
    /// synchronizes outside the lock) and is still to come; it is the same failure,
    /// already handled, and is not reported twice.
    pub(crate) error_owed: bool,
}

impl StreamSlot {
    pub(crate) fn new(stream: Stream, streams: usize) -> StreamSlot {
        StreamSlot {
            stream,
            seq: 0,
            completed: 0,
            inflight: VecDeque::new(),
            waits_for: vec![0; streams],
            error_owed: false,
        }
    }

    /// Counts one operation just enqueued and records the event after it; returns its
    /// point.
    pub(crate) fn advance(&mut self, index: usize) -> Result<Point> {
        let event = self.stream.record_event()?;
        self.seq += 1;
        self.inflight.push_back((self.seq, event));
        Ok(Point {
            stream: index,
            seq: self.seq,
        })
    }

    /// The event after operation `seq`; `None` once it is known to have completed.
    pub(crate) fn event_after(&self, seq: u64) -> Option<Event> {
        if seq <= self.completed {
            return None;
        }
        let i = self.inflight.partition_point(|(s, _)| *s < seq);
        self.inflight.get(i).map(|(_, e)| e.clone())
    }

    /// Operations enqueued and not known to have completed.
    pub(crate) fn outstanding(&self) -> u64 {
        self.seq.saturating_sub(self.completed)
    }

    /// Learns which operations have completed; returns `false` when one failed (its
    /// event reports an error), which the caller must recover from.
    pub(crate) fn poll(&mut self) -> bool {
        while let Some((seq, e)) = self.inflight.front() {
            match e.query() {
                Ok(true) => {
                    self.completed = *seq;
                    self.inflight.pop_front();
                }
                Ok(false) => return true,
                Err(_) => return false,
            }
        }
        true
    }

    /// Forgets what it waits for on other streams (after recovery drained them all).
    pub(crate) fn reset_waits(&mut self) {
        self.waits_for.iter_mut().for_each(|w| *w = 0);
    }
}

/// Makes stream `on` wait for `point` (nothing when it is on `on` itself, already
/// waited for, or known to have completed).
pub(crate) fn wait_for(slots: &mut [StreamSlot], on: usize, point: Point) -> Result<()> {
    if point.stream == on || point.seq == 0 {
        return Ok(());
    }
    if slots[on].waits_for[point.stream] >= point.seq {
        return Ok(());
    }
    let Some(event) = slots[point.stream].event_after(point.seq) else {
        return Ok(());
    };
    slots[on].stream.wait_event(&event)?;
    slots[on].waits_for[point.stream] = point.seq;
    Ok(())
}
