//! [`CudaEvent`]: a timing-enabled `CUevent` recorded on a stream, plus the stream
//! position whose outcome (the first error before it) the event reports.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;
use xpu_hal::backend::{EventImpl, EventOutcome};
use xpu_hal::{Error, Result};

use crate::driver::cu;
use crate::stream::{CuEvent, StreamShared};
use crate::NAME;

/// The outcome of the work before an event, set by the completion thread.
pub(crate) type Mark = EventOutcome;

/// An event on a CUDA stream.
#[derive(Clone)]
pub struct CudaEvent {
    pub(crate) stream: Arc<StreamShared>,
    pub(crate) pos: u64,
    pub(crate) mark: Arc<Mark>,
    pub(crate) event: Arc<CuEvent>,
}

impl CudaEvent {
    /// The raw `CUevent`, for code that mixes xpu with direct CUDA calls.
    pub fn raw(&self) -> sys::CUevent {
        self.event.event
    }
}

impl EventImpl for CudaEvent {
    fn query(&self) -> Result<bool> {
        self.stream.progress.query_event(self.pos, &self.mark, NAME)
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.stream
            .progress
            .wait_event(self.pos, timeout, &self.mark, &self.stream.dev.name, NAME)
    }

    fn elapsed_since(&self, earlier: &dyn EventImpl) -> Result<Duration> {
        let Some(earlier) = earlier.as_any().downcast_ref::<CudaEvent>() else {
            return Err(Error::backend_message(
                NAME,
                "internal error: an event of another backend reached the CUDA backend",
            ));
        };
        let dev = &self.event.dev;
        dev.bind()?;
        let mut ms = 0f32;
        let (start, end) = (earlier.event.event, self.event.event);
        cu(
            &dev.name,
            "measuring elapsed time",
            "cuEventElapsedTime",
            // SAFETY: both events are live, timing-enabled and complete (HAL guarantee).
            || unsafe { sys::cuEventElapsedTime(&mut ms, start, end) },
        )?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
