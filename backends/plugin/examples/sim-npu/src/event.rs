//! [`SimEvent`]: a point on a stream's timeline, completed by the stream's worker with
//! a timestamp and the outcome of the work before it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xpu_plugin_sdk::{Error, Event, Result};

use crate::health::Health;

/// What the worker records when it reaches the event.
pub(crate) struct Mark {
    done: Mutex<Option<(Instant, Result<()>)>>,
    cv: Condvar,
    /// The stream, for messages (`plugin.simnpu:0 stream 3`).
    stream: String,
}

impl Mark {
    pub(crate) fn new(stream: String) -> Arc<Mark> {
        Arc::new(Mark {
            done: Mutex::new(None),
            cv: Condvar::new(),
            stream,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<(Instant, Result<()>)>> {
        self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Completes the event (once; later calls are ignored).
    pub(crate) fn complete(&self, outcome: Result<()>) {
        let mut done = self.lock();
        if done.is_none() {
            *done = Some((Instant::now(), outcome));
            self.cv.notify_all();
        }
    }

    /// Blocks until complete or `timeout` passes; the outcome, or `None` on timeout.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut done = self.lock();
        loop {
            if let Some((_, outcome)) = &*done {
                return Some(outcome.clone());
            }
            done = match (timeout, deadline) {
                (None, _) | (Some(_), None) => {
                    self.cv.wait(done).unwrap_or_else(|p| p.into_inner())
                }
                (Some(_), Some(d)) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.cv
                        .wait_timeout(done, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    fn time(&self) -> Option<Instant> {
        self.lock().as_ref().map(|(t, _)| *t)
    }
}

/// An event of the simulated NPU.
pub struct SimEvent {
    pub(crate) mark: Arc<Mark>,
    /// The device's health: queries and waits fail once it is lost.
    pub(crate) health: Arc<Health>,
}

impl Event for SimEvent {
    fn query(&self) -> Result<bool> {
        self.health.check_call()?;
        match &*self.mark.lock() {
            None => Ok(false),
            Some((_, outcome)) => outcome.clone().map(|()| true),
        }
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.health.check_call()?;
        match self.mark.wait(timeout) {
            Some(outcome) => outcome,
            None => Err(Error::timeout(format!(
                "an event of {} did not complete within {:?}",
                self.mark.stream,
                timeout.unwrap_or_default()
            ))),
        }
    }

    fn elapsed_since(&self, earlier: &Self) -> Result<Duration> {
        match (earlier.mark.time(), self.mark.time()) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a)),
            _ => Err(Error::invalid_argument(
                "elapsed time needs both events complete; wait for them first",
            )),
        }
    }
}
