//! [`VulkanEvent`]: a value of a stream's timeline semaphore plus the stream position
//! whose host-side work (read-backs, releases) must also be done.

use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use xpu_hal::backend::EventImpl;
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
    pub(crate) result: OnceLock<Result<()>>,
}

impl Mark {
    pub(crate) fn complete(&self, error: Option<&Error>, device: &str) {
        let _ = self.time.set(Instant::now());
        let _ = self.result.set(match error {
            None => Ok(()),
            Some(e) => Err(Error::aborted(format!(
                "work enqueued before this event on {device} failed: {e}"
            ))),
        });
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

impl VulkanEvent {
    fn outcome(&self) -> Result<()> {
        match self.mark.result.get() {
            Some(r) => r.clone(),
            None => Err(Error::backend_message(
                "vulkan",
                "internal error: an event completed without its outcome",
            )),
        }
    }
}

impl EventImpl for VulkanEvent {
    fn query(&self) -> Result<bool> {
        if self.stream.completed() < self.pos {
            return Ok(false);
        }
        self.outcome().map(|()| true)
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        if !self.stream.wait_pos(self.pos, timeout) {
            return Err(Error::Timeout {
                message: format!(
                    "an event on {} did not complete within {:?}",
                    self.stream.dev.name,
                    timeout.unwrap_or_default()
                ),
            });
        }
        self.outcome()
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
