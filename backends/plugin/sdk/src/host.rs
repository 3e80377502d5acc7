//! What the host lends a plugin: host memory for copies ([`HostSource`],
//! [`HostDestination`]) and events of other backends to wait for ([`ExternalWait`]).

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Host memory a host-to-device copy reads.
///
/// The host keeps the bytes valid and unchanged from the moment the copy is enqueued
/// until the stream reports it complete: until `stream_synchronize` returns, or until
/// an event recorded after the copy completes. Reading them is therefore only sound
/// while the copy is outstanding, which the SDK cannot check: [`HostSource::as_slice`]
/// is `unsafe` and its caller states why the copy has not been reported complete yet
/// (typically: "the stream's worker runs this before it marks the copy done").
pub struct HostSource {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are the host's, lent for the copy's lifetime to whichever plugin
// thread runs it; the pointer itself is only an address.
unsafe impl Send for HostSource {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for HostSource {}

impl HostSource {
    /// Host memory from a pointer and a length.
    ///
    /// # Safety
    /// `ptr` is valid for reads of `len` bytes (or `len` is 0) for as long as the
    /// value's accessors are used.
    pub unsafe fn from_raw_parts(ptr: *const u8, len: usize) -> Self {
        HostSource { ptr, len }
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The bytes.
    ///
    /// # Safety
    /// The copy this memory was passed to is still outstanding (not yet reported
    /// complete by `stream_synchronize` or by a later event), so the host still keeps
    /// the bytes valid and unchanged.
    pub unsafe fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: per the contract of this function and of `from_raw_parts`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl fmt::Debug for HostSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostSource({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// Host memory a device-to-host copy writes. The same lifetime rules as [`HostSource`]
/// apply, and nobody else touches the bytes while the copy is outstanding.
pub struct HostDestination {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: as for `HostSource`; the host does not touch the bytes while the copy is
// outstanding, so the one thread that runs the copy has them to itself.
unsafe impl Send for HostDestination {}
// SAFETY: shared references only expose the address; writing needs `&mut`.
unsafe impl Sync for HostDestination {}

impl HostDestination {
    /// Host memory from a pointer and a length.
    ///
    /// # Safety
    /// `ptr` is valid for writes of `len` bytes (or `len` is 0) and not accessed by
    /// anyone else for as long as the value's accessors are used.
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> Self {
        HostDestination { ptr, len }
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The bytes, to write.
    ///
    /// # Safety
    /// As for [`HostSource::as_slice`].
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: per the contract of this function and of `from_raw_parts`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl fmt::Debug for HostDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostDestination({:p}, {} bytes)", self.ptr, self.len)
    }
}

type Callback = Box<dyn FnOnce(&Result<()>) + Send>;

enum State {
    Pending(Vec<Callback>),
    Done(Result<()>),
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An event of another backend that a stream's later work must wait for
/// (`stream_wait_external`).
///
/// The SDK does the ABI's part: on a thread of its own it calls the host's `wait`
/// exactly once, completes this value with the outcome, and then calls `release`
/// exactly once. (If [`Stream::wait_external`](crate::Stream::wait_external) returns an
/// error, the SDK calls only `release`.) The plugin only has to hold its stream's later work until
/// [`ExternalWait::wait`] returns — from its own worker thread, with
/// [`ExternalWait::on_complete`] to signal a device-side fence, or by polling. If the
/// host reports that the work before its event failed, the outcome is an
/// [`ErrorCode::Aborted`](crate::ErrorCode::Aborted) error, and the header asks that
/// the stream's later work then fails with it.
///
/// Cheap to clone; all clones see the same outcome.
#[derive(Clone)]
pub struct ExternalWait(Arc<Shared>);

/// The completing side of an [`ExternalWait`]. Dropping it without completing completes
/// the wait with an `Aborted` error, so a waiter is never stranded.
pub struct ExternalSignal(Option<Arc<Shared>>);

impl ExternalWait {
    /// A pending wait and the signal that completes it (the SDK makes these for
    /// `stream_wait_external`; tests of a stream implementation can too).
    pub fn pending() -> (ExternalWait, ExternalSignal) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Pending(Vec::new())),
            cv: Condvar::new(),
        });
        (ExternalWait(shared.clone()), ExternalSignal(Some(shared)))
    }

    /// A wait that is already complete with `result`.
    pub fn completed(result: Result<()>) -> ExternalWait {
        ExternalWait(Arc::new(Shared {
            state: Mutex::new(State::Done(result)),
            cv: Condvar::new(),
        }))
    }

    /// Blocks until the external event completes; its outcome.
    pub fn wait(&self) -> Result<()> {
        let mut state = self.0.lock();
        loop {
            if let State::Done(result) = &*state {
                return result.clone();
            }
            state = self.0.cv.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks for at most `timeout`; the outcome, or `None` if still pending.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<()>> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.0.lock();
        loop {
            if let State::Done(result) = &*state {
                return Some(result.clone());
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => timeout,
            };
            if left.is_zero() {
                return None;
            }
            state = self
                .0
                .cv
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The outcome if the event has completed, `None` while it is pending.
    pub fn poll(&self) -> Option<Result<()>> {
        match &*self.0.lock() {
            State::Done(result) => Some(result.clone()),
            State::Pending(_) => None,
        }
    }

    /// Runs `f` with the outcome once the event completes: on the thread that completes
    /// it, or at once on this thread if it already has. `f` must not block for long.
    pub fn on_complete(&self, f: impl FnOnce(&Result<()>) + Send + 'static) {
        let mut state = self.0.lock();
        match &mut *state {
            State::Pending(callbacks) => callbacks.push(Box::new(f)),
            State::Done(result) => {
                let result = result.clone();
                drop(state);
                f(&result);
            }
        }
    }
}

impl fmt::Debug for ExternalWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.poll() {
            None => f.write_str("ExternalWait(pending)"),
            Some(r) => write!(f, "ExternalWait({r:?})"),
        }
    }
}

impl ExternalSignal {
    /// Completes the wait with `result` and runs the registered callbacks.
    pub fn complete(mut self, result: Result<()>) {
        self.finish(result);
    }

    fn finish(&mut self, result: Result<()>) {
        let Some(shared) = self.0.take() else {
            return;
        };
        let callbacks = {
            let mut state = shared.lock();
            match std::mem::replace(&mut *state, State::Done(result.clone())) {
                State::Pending(callbacks) => callbacks,
                State::Done(_) => Vec::new(),
            }
        };
        shared.cv.notify_all();
        for callback in callbacks {
            callback(&result);
        }
    }
}

impl Drop for ExternalSignal {
    fn drop(&mut self) {
        self.finish(Err(Error::aborted(
            "the wait for an event of another backend ended without an outcome",
        )));
    }
}

impl fmt::Debug for ExternalSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExternalSignal")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn waits_complete_once_and_run_callbacks() {
        let (wait, signal) = ExternalWait::pending();
        assert!(wait.poll().is_none());
        assert!(wait.wait_timeout(Duration::from_millis(1)).is_none());
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        wait.on_complete(move |r| {
            assert!(r.is_ok());
            c.fetch_add(1, Ordering::SeqCst);
        });
        let w = wait.clone();
        let t = std::thread::spawn(move || w.wait());
        signal.complete(Ok(()));
        assert_eq!(t.join().unwrap(), Ok(()));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let c = calls.clone();
        wait.on_complete(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_dropped_signal_aborts_the_wait() {
        let (wait, signal) = ExternalWait::pending();
        drop(signal);
        let err = wait.wait().unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::Aborted);
    }
}
