//! The scheduler's streams, points on them, and the waits between them.
//!
//! Every device gets two streams: one for tasks and one for the copies that bring data
//! to it, so that transfers overlap computation. Work is enqueued at once (deferred
//! execution): a task goes on its device's stream as soon as it is placed, behind waits
//! for the points it depends on, and the stream runs it when they have passed.
//!
//! A [`Point`] is a position on one of these streams: everything enqueued there up to
//! and including the `seq`-th operation. Events are recorded lazily: only when another
//! stream must wait for a point, and one event then serves every later wait for that
//! point or an earlier one. Each stream also remembers, per other stream, the latest
//! point it already waits for, so a chain of tasks between two devices costs one wait
//! per hop, not one per dependency.

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
    /// The latest event recorded on it, with the `seq` it covers.
    last_event: Option<(u64, Event)>,
    /// Per stream index: the latest point of that stream this one already waits for.
    waits_for: Vec<u64>,
}

impl StreamSlot {
    pub(crate) fn new(stream: Stream, streams: usize) -> StreamSlot {
        StreamSlot {
            stream,
            seq: 0,
            last_event: None,
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

    /// An event that completes once everything up to `seq` has run.
    pub(crate) fn event_covering(&mut self, seq: u64) -> Result<Event> {
        if let Some((covered, e)) = &self.last_event {
            if *covered >= seq {
                return Ok(e.clone());
            }
        }
        let e = self.stream.record_event()?;
        self.last_event = Some((self.seq, e.clone()));
        Ok(e)
    }

    /// The latest event recorded, if it covers everything enqueued.
    pub(crate) fn event_at_end(&mut self) -> Result<Event> {
        let seq = self.seq;
        self.event_covering(seq)
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
    let covered = slots[point.stream].seq;
    let event = slots[point.stream].event_covering(point.seq)?;
    slots[on].stream.wait_event(&event)?;
    // The event covers everything enqueued on that stream when it was recorded.
    let through = match &slots[point.stream].last_event {
        Some((c, _)) => *c,
        None => covered,
    };
    slots[on].waits_for[point.stream] = through.max(point.seq);
    Ok(())
}
