//! [`HostEvent`]: a numbered point on a host stream's timeline.

use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use xpu_hal::backend::{EventImpl, EventOutcome};
use xpu_hal::{Error, Result};

use crate::queue::Timeline;

/// A point on a host stream: complete once the stream's worker has passed job `seq`.
/// The queue holds the same object and completes it there, so recording an event
/// allocates once.
pub struct HostEvent {
    timeline: Arc<Timeline>,
    seq: u64,
    /// When execution reached it.
    time: OnceLock<Instant>,
    /// The outcome of the work before it.
    outcome: EventOutcome,
}

impl HostEvent {
    pub(crate) fn new(timeline: Arc<Timeline>, seq: u64) -> Self {
        HostEvent {
            timeline,
            seq,
            time: OnceLock::new(),
            outcome: EventOutcome::default(),
        }
    }

    /// Execution has reached it: records the time and the stream's state.
    pub(crate) fn reached(&self) {
        let _ = self.time.set(Instant::now());
        self.outcome
            .complete(self.timeline.peek_error().as_ref(), &self.timeline.device);
    }

    fn outcome(&self) -> Result<()> {
        self.outcome.get(crate::NAME)
    }
}

impl EventImpl for HostEvent {
    fn query(&self) -> Result<bool> {
        if self.timeline.completed() < self.seq {
            return Ok(false);
        }
        self.outcome().map(|()| true)
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let reached = match timeout {
            // Untimed: help run the stream's queued work (see `queue`).
            None => {
                self.timeline.drive(self.seq);
                true
            }
            Some(_) => self.timeline.wait_for(self.seq, timeout),
        };
        if !reached {
            return Err(Error::Timeout {
                message: format!(
                    "an event on {} did not complete within {:?}",
                    self.timeline.device,
                    timeout.unwrap_or_default()
                ),
            });
        }
        self.outcome()
    }

    fn elapsed_since(&self, earlier: &dyn EventImpl) -> Result<Duration> {
        let earlier = earlier
            .as_any()
            .downcast_ref::<HostEvent>()
            .ok_or_else(|| {
                Error::backend_message(
                    "host",
                    "internal error: an event of another backend reached the host backend",
                )
            })?;
        match (earlier.time.get(), self.time.get()) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(*a)),
            _ => Err(Error::invalid(
                "elapsed time needs both events complete; wait for them first",
            )),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
