//! [`Event`]: a point on a stream's timeline.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::EventImpl;
use crate::device::Device;
use crate::error::{Error, Result};

/// A point on a stream's timeline, from [`crate::Stream::record_event`]. It completes
/// when all work enqueued before it has finished. Cheap to clone; thread-safe; any
/// stream of any backend may wait on it.
#[derive(Clone)]
pub struct Event {
    // Held inline rather than behind one more `Arc`: recording an event allocates only
    // what the backend allocates.
    device: Device,
    imp: Arc<dyn EventImpl>,
}

impl Event {
    pub(crate) fn new(device: Device, imp: Arc<dyn EventImpl>) -> Self {
        Event { device, imp }
    }

    /// The device whose stream recorded it.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The backend implementation.
    pub fn implementation(&self) -> &Arc<dyn EventImpl> {
        &self.imp
    }

    /// `Ok(true)` once complete; the error of the work before it if that failed.
    pub fn query(&self) -> Result<bool> {
        self.imp.query()
    }

    /// Blocks until complete; returns the error of the work before it if that failed.
    pub fn wait(&self) -> Result<()> {
        self.imp.wait(None)
    }

    /// Like [`Event::wait`], giving up with [`Error::Timeout`] after `timeout`.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        self.imp.wait(Some(timeout))
    }

    /// Device time from `earlier` to this event. Waits for both. Both must come from
    /// the same device, which must support event timing.
    pub fn elapsed_since(&self, earlier: &Event) -> Result<Duration> {
        if earlier.device() != self.device() {
            return Err(Error::invalid(format!(
                "elapsed time needs two events of one device, got {} and {}; time each device separately",
                earlier.device().id(),
                self.device().id()
            )));
        }
        if !self.device().capabilities().event_timing {
            return Err(Error::unsupported(format!(
                "{} does not time events",
                self.device().id()
            )));
        }
        earlier.wait()?;
        self.wait()?;
        self.imp.elapsed_since(&**earlier.implementation())
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.device().id().to_string())
            .finish()
    }
}
