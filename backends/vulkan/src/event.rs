//! [`VulkanEvent`]: a value of a stream's timeline semaphore plus the stream position
//! whose host-side work (read-backs, releases) must also be done.

use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use xpu_hal::backend::{EventImpl, EventOutcome};
use xpu_hal::{Error, Result};

use crate::stream::StreamShared;

/// What an event records when its batch completes.
#[derive(Default)]
pub(crate) struct Mark {
    /// When the completion thread saw the batch finish (fallback timing).
    pub(crate) time: OnceLock<Instant>,
    /// Device time in nanoseconds, from a timestamp written at the end of the batch.
    pub(crate) device_ns: OnceLock<u64>,
    /// The timestamp query slot, when the device writes timestamps.
    pub(crate) slot: OnceLock<u32>,
    /// The outcome of the work before the event.
    pub(crate) outcome: EventOutcome,
}

impl Mark {
    pub(crate) fn complete(&self, error: Option<&Error>, device: &str) {
        let _ = self.time.set(Instant::now());
        self.outcome.complete(error, device);
    }
}

/// An event on a Vulkan stream.
#[derive(Clone)]
pub struct VulkanEvent {
    pub(crate) stream: Arc<StreamShared>,
    pub(crate) gpu_value: u64,
    pub(crate) pos: u64,
    pub(crate) mark: Arc<Mark>,
}

impl EventImpl for VulkanEvent {
    fn query(&self) -> Result<bool> {
        self.stream
            .progress
            .query_event(self.pos, &self.mark.outcome, crate::NAME)
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.stream.progress.wait_event(
            self.pos,
            timeout,
            &self.mark.outcome,
            &self.stream.dev.name,
            crate::NAME,
        )
    }

    fn elapsed_since(&self, earlier: &dyn EventImpl) -> Result<Duration> {
        let Some(earlier) = earlier.as_any().downcast_ref::<VulkanEvent>() else {
            return Err(Error::backend_message(
                "vulkan",
                "internal error: an event of another backend reached the Vulkan backend",
            ));
        };
        if let (Some(a), Some(b)) = (earlier.mark.device_ns.get(), self.mark.device_ns.get()) {
            return Ok(Duration::from_nanos(b.saturating_sub(*a)));
        }
        match (earlier.mark.time.get(), self.mark.time.get()) {
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
