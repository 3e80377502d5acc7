//! [`PluginEvent`]: a plugin event as a HAL event.

use std::any::Any;
use std::sync::{Arc, Weak};
use std::time::Duration;

use xpu_hal::backend::EventImpl;
use xpu_hal::{Error, Result};
use xpu_plugin_sdk::abi::*;

use crate::device::DeviceShared;
use crate::load::{Args, Handle};
use crate::stream::{explain, ForeignFailure, StreamShared};

/// One `xpu_event`, destroyed with `event_destroy` when the last holder goes.
///
/// When a query or wait sees it complete, the resources its stream held for the work
/// before it are released.
pub struct PluginEvent {
    pub(crate) device: Arc<DeviceShared>,
    pub(crate) handle: Handle<xpu_event>,
    stream: Weak<StreamShared>,
    /// The number of the stream's last operation before the event.
    seq: u64,
    foreign: ForeignFailure,
}

/// Whether an error from an event means the work before it is over (it failed), as
/// opposed to not known to be over.
fn finished(e: &Error) -> bool {
    !matches!(e, Error::Timeout { .. } | Error::DeviceLost { .. })
}

impl PluginEvent {
    pub(crate) fn new(stream: &Arc<StreamShared>, handle: Handle<xpu_event>, seq: u64) -> Self {
        PluginEvent {
            device: stream.device.clone(),
            handle,
            stream: Arc::downgrade(stream),
            seq,
            foreign: stream.foreign.clone(),
        }
    }

    fn complete(&self) {
        if let Some(stream) = self.stream.upgrade() {
            stream.release_through(self.seq);
        }
    }

    fn outcome<T>(&self, result: Result<T>) -> Result<T> {
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                if finished(&e) {
                    self.complete();
                }
                Err(explain(e, &self.foreign, false))
            }
        }
    }
}

impl EventImpl for PluginEvent {
    fn query(&self) -> Result<bool> {
        let plugin = &self.device.plugin;
        let mut a = xpu_event_query_args::new();
        a.event = self.handle.0;
        // SAFETY: the event is live (destroyed only in `Drop`).
        let r = unsafe {
            plugin.call(
                plugin.table.event_query,
                &mut a,
                "event_query",
                &self.device.id,
            )
        };
        let done = self.outcome(r.map(|()| a.done != 0))?;
        if done {
            self.complete();
        }
        Ok(done)
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let plugin = &self.device.plugin;
        let mut a = xpu_event_wait_args::new();
        a.event = self.handle.0;
        a.timeout_ns = match timeout {
            None => u64::MAX,
            Some(d) => u64::try_from(d.as_nanos())
                .unwrap_or(u64::MAX - 1)
                .min(u64::MAX - 1),
        };
        // SAFETY: the event is live.
        let r = unsafe {
            plugin.call(
                plugin.table.event_wait,
                &mut a,
                "event_wait",
                &self.device.id,
            )
        };
        self.outcome(r)?;
        self.complete();
        Ok(())
    }

    fn elapsed_since(&self, earlier: &dyn EventImpl) -> Result<Duration> {
        let plugin = &self.device.plugin;
        let Some(f) = plugin.table.event_elapsed else {
            return Err(Error::unsupported(format!(
                "{} does not time events (the plugin has no event_elapsed)",
                self.device.id
            )));
        };
        let Some(earlier) = earlier.as_any().downcast_ref::<PluginEvent>() else {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                "internal error: an event of another backend reached elapsed_since",
            ));
        };
        let mut a = xpu_event_elapsed_args::new();
        a.start = earlier.handle.0;
        a.end = self.handle.0;
        // SAFETY: both events are live, of this device and complete (HAL guarantee).
        unsafe { plugin.call(f, &mut a, "event_elapsed", &self.device.id) }?;
        Ok(Duration::from_nanos(a.elapsed_ns))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for PluginEvent {
    fn drop(&mut self) {
        let mut a = xpu_event_args::new();
        a.event = self.handle.0;
        let plugin = &self.device.plugin;
        // SAFETY: the last holder is gone (streams waiting on it held it until their
        // wait was done); destroyed exactly once, before its device is closed.
        unsafe {
            plugin.release(
                plugin.table.event_destroy,
                a,
                "event_destroy",
                &self.device.id,
            )
        };
    }
}
