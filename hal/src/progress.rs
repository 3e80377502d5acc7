//! [`StreamProgress`]: how far a stream's in-order work has completed, and its first
//! unreported error — the bookkeeping every backend with a completion thread needs.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::Error;

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
