//! [`StreamProgress`]: how far a stream's in-order work has completed, and its first
//! unreported error — the bookkeeping every backend with a completion thread needs —
//! and [`EventOutcome`], what an event reports once the work before it has run.

use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The outcome of the work enqueued before an event, set once when the event completes.
#[derive(Debug, Default)]
pub struct EventOutcome {
    result: OnceLock<Result<()>>,
}

impl EventOutcome {
    /// Records the outcome: success, or an `Aborted` error naming `error`, the stream's
    /// unreported failure at that point, on `device`. Later calls change nothing.
    pub fn complete(&self, error: Option<&Error>, device: &str) {
        let _ = self.result.set(match error {
            None => Ok(()),
            Some(e) => Err(Error::aborted(format!(
                "work enqueued before this event on {device} failed: {e}"
            ))),
        });
    }

    /// The recorded outcome; an internal error of `backend` if none was recorded.
    pub fn get(&self, backend: &str) -> Result<()> {
        match self.result.get() {
            Some(r) => r.clone(),
            None => Err(Error::backend_message(
                backend,
                "internal error: an event completed without recording its outcome",
            )),
        }
    }
}

struct State {
    completed: u64,
    error: Option<Error>,
}

/// The completed position of a stream whose work finishes in order (positions count
/// up from 1), with blocking waits, plus the stream's first unreported error (sticky
/// until [`StreamProgress::take_error`] reports it). Thread-safe.
pub struct StreamProgress {
    state: Mutex<State>,
    cv: Condvar,
}

impl Default for StreamProgress {
    fn default() -> Self {
        StreamProgress::new()
    }
}

impl StreamProgress {
    /// Nothing completed, no error.
    pub fn new() -> Self {
        StreamProgress {
            state: Mutex::new(State {
                completed: 0,
                error: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The highest position completed so far.
    pub fn completed(&self) -> u64 {
        self.lock().completed
    }

    /// Marks everything up to `pos` complete and wakes the waiters.
    pub fn advance(&self, pos: u64) {
        let mut s = self.lock();
        s.completed = s.completed.max(pos);
        drop(s);
        self.cv.notify_all();
    }

    /// Blocks until `pos` has completed; `false` if `timeout` passed first.
    pub fn wait(&self, pos: u64, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self.lock();
        while s.completed < pos {
            match deadline {
                None => s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    s = self
                        .cv
                        .wait_timeout(s, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        true
    }

    /// Records `e` unless an unreported error is already there (the first one wins).
    pub fn set_error(&self, e: Error) {
        let mut s = self.lock();
        if s.error.is_none() {
            s.error = Some(e);
        }
    }

    /// The unreported error, if any, leaving it in place.
    pub fn peek_error(&self) -> Option<Error> {
        self.lock().error.clone()
    }

    /// Reports (removes) the unreported error, if any.
    pub fn take_error(&self) -> Option<Error> {
        self.lock().error.take()
    }

    /// `EventImpl::query` for an event at `pos` with `outcome`.
    pub fn query_event(&self, pos: u64, outcome: &EventOutcome, backend: &str) -> Result<bool> {
        if self.completed() < pos {
            return Ok(false);
        }
        outcome.get(backend).map(|()| true)
    }

    /// `EventImpl::wait` for an event at `pos` with `outcome`, on `device`.
    pub fn wait_event(
        &self,
        pos: u64,
        timeout: Option<Duration>,
        outcome: &EventOutcome,
        device: &str,
        backend: &str,
    ) -> Result<()> {
        if !self.wait(pos, timeout) {
            return Err(Error::Timeout {
                message: format!(
                    "an event on {device} did not complete within {:?}",
                    timeout.unwrap_or_default()
                ),
            });
        }
        outcome.get(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_until_advanced_and_keeps_the_first_error() {
        let p = Arc::new(StreamProgress::new());
        assert!(!p.wait(1, Some(Duration::from_millis(1))));
        let q = p.clone();
        let t = std::thread::spawn(move || q.wait(3, None));
        p.advance(2);
        p.advance(3);
        assert!(t.join().unwrap());
        p.advance(1);
        assert_eq!(p.completed(), 3, "never moves backwards");
        p.set_error(Error::aborted("first"));
        p.set_error(Error::aborted("second"));
        assert!(p.peek_error().unwrap().to_string().contains("first"));
        assert!(p.take_error().unwrap().to_string().contains("first"));
        assert!(p.take_error().is_none());
    }
}
