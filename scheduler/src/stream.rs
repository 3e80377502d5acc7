//! The scheduler's streams, points on them, and the waits between them.
//!
//! Every device gets two streams: one for tasks and one for the copies that bring data
//! to it, so that transfers overlap computation. Work is enqueued at once (deferred
//! execution): a task goes on its device's stream as soon as it is placed, behind waits
//! for the points it depends on, and the stream runs it when they have passed.
//!
//! A [`Point`] is a position on one of these streams: everything enqueued there up to
//! and including the `seq`-th operation. A stream keeps the events recorded on it (the
//! most recent [`HISTORY`]); a wait for a point uses the earliest kept event at or after
//! it, and records one at the current end only when none is kept. With several devices
//! the scheduler records an event after every task that writes data, so that a wait on
//! another device
//! waits for that task and not also for the work queued behind it since (a lazily
//! recorded event would cover that too, and two devices exchanging data every step would
//! run one after the other). Each stream also remembers, per other stream, the latest
//! point it already waits for, so a chain of tasks between two devices costs one wait
//! per hop, not one per dependency.

use std::collections::VecDeque;

use xpu_hal::{Event, Result, Stream};

/// Events a stream keeps for later waits.
pub(crate) const HISTORY: usize = 256;

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
    /// Events recorded on it, oldest first, with the `seq` each covers.
    history: VecDeque<(u64, Event)>,
    /// Per stream index: the latest point of that stream this one already waits for.
    waits_for: Vec<u64>,
}

impl StreamSlot {
    pub(crate) fn new(stream: Stream, streams: usize) -> StreamSlot {
        StreamSlot {
            stream,
            seq: 0,
            history: VecDeque::new(),
            waits_for: vec![0; streams],
        }
    }

    /// Counts one operation just enqueued; returns its point.
    pub(crate) fn advance(&mut self, index: usize) -> Point {
        self.seq += 1;
        Point {
            stream: index,
            seq: self.seq,
        }
    }

    /// An event that completes once everything up to `seq` has run: the earliest kept
    /// event at or after `seq`, else a new one at the current end.
    pub(crate) fn event_covering(&mut self, seq: u64) -> Result<Event> {
        let i = self.history.partition_point(|(covered, _)| *covered < seq);
        if let Some((_, e)) = self.history.get(i) {
            return Ok(e.clone());
        }
        self.event_at_end()
    }

    /// An event at the current end (recorded unless the newest kept one is there).
    pub(crate) fn event_at_end(&mut self) -> Result<Event> {
        if let Some((covered, e)) = self.history.back() {
            if *covered == self.seq {
                return Ok(e.clone());
            }
        }
        let e = self.stream.record_event()?;
        self.history.push_back((self.seq, e.clone()));
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        Ok(e)
    }
}

/// Makes stream `on` wait for `point` (nothing when it is on `on` itself or already
/// waited for).
pub(crate) fn wait_for(slots: &mut [StreamSlot], on: usize, point: Point) -> Result<()> {
    if point.stream == on || point.seq == 0 {
        return Ok(());
    }
    if slots[on].waits_for[point.stream] >= point.seq {
        return Ok(());
    }
    let source = &mut slots[point.stream];
    let i = source
        .history
        .partition_point(|(covered, _)| *covered < point.seq);
    let (through, event) = match source.history.get(i) {
        Some((covered, e)) => (*covered, e.clone()),
        None => {
            let e = source.event_at_end()?;
            (source.seq, e)
        }
    };
    slots[on].stream.wait_event(&event)?;
    // The event covers everything enqueued on that stream up to `through`.
    slots[on].waits_for[point.stream] = through.max(point.seq);
    Ok(())
}
