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

/// An event the application completes (or fails) itself, from any thread, rather than a
/// point on a stream: OpenCL's user event. Streams of any device wait on it with
/// [`crate::Stream::wait_user_event`], which holds their later work until
/// [`UserEvent::complete`], or fails it with [`Error::Aborted`] after
/// [`UserEvent::fail`] — data arriving from the network or a file, a gate for a stage of
/// a pipeline, or a test that must hold a stream at a known point.
///
/// Not `Clone`: this handle decides. Dropping it while the event is pending fails the
/// event, so that nothing waits on it forever. The waits are bridged on the host, as
/// for another backend's event ([`crate::backend::StreamImpl::wait_foreign_event`]).
pub struct UserEvent {
    signal: Arc<Signal>,
}

/// What a [`UserEvent`] shares with the streams that wait on it.
#[derive(Default)]
struct Signal {
    state: std::sync::Mutex<Option<Result<()>>>,
    done: std::sync::Condvar,
}

impl Signal {
    fn set(&self, outcome: Result<()>) -> Result<()> {
        let mut state = crate::backend::lock(&self.state);
        if let Some(was) = &*state {
            return Err(Error::invalid(format!(
                "the user event was already {}; a user event completes or fails once: create another for the next signal",
                if was.is_ok() { "completed" } else { "failed" }
            )));
        }
        *state = Some(outcome);
        self.done.notify_all();
        Ok(())
    }

    fn query(&self) -> Result<bool> {
        match &*crate::backend::lock(&self.state) {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e.clone()),
        }
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let mut state = crate::backend::lock(&self.state);
        loop {
            if let Some(outcome) = &*state {
                return outcome.clone();
            }
            state = match (timeout, deadline) {
                (None, _) | (Some(_), None) => self
                    .done
                    .wait(state)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                (Some(t), Some(deadline)) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(Error::Timeout {
                            message: format!(
                                "the user event was not completed within {t:?}; complete or fail it from the thread that owns it, or wait longer"
                            ),
                        });
                    }
                    self.done
                        .wait_timeout(state, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

impl UserEvent {
    /// A pending user event.
    pub fn new() -> Self {
        UserEvent {
            signal: Arc::default(),
        }
    }

    /// Completes the event: the streams waiting on it go on. An event completes or
    /// fails once; a second call is an [`Error::InvalidArgument`].
    pub fn complete(&self) -> Result<()> {
        self.signal.set(Ok(()))
    }

    /// Fails the event with `message`: the later work of the streams waiting on it
    /// fails with [`Error::Aborted`] carrying it, reported like any failed work (then
    /// the streams work again). An event completes or fails once; a second call is an
    /// [`Error::InvalidArgument`].
    pub fn fail(&self, message: impl Into<String>) -> Result<()> {
        self.signal.set(Err(Error::aborted(format!(
            "a user event was failed: {}",
            message.into()
        ))))
    }

    /// `Ok(true)` once completed, `Ok(false)` while pending, the failure once failed.
    pub fn query(&self) -> Result<bool> {
        self.signal.query()
    }

    /// What streams wait on.
    pub(crate) fn foreign(&self) -> ForeignEvent {
        ForeignEvent(Foreign::User(self.signal.clone()))
    }
}

impl Default for UserEvent {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for UserEvent {
    fn drop(&mut self) {
        // Pending: nothing could complete it any more.
        let _ = self.signal.set(Err(Error::aborted(
            "a user event was dropped before it was completed or failed; keep it until you complete it",
        )));
    }
}

impl fmt::Debug for UserEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserEvent")
            .field("state", &self.query())
            .finish()
    }
}

/// What a stream waits on that its backend did not record: another backend's
/// [`Event`] or a [`UserEvent`]. Backends bridge such waits on the host: later work
/// must not start before [`ForeignEvent::wait`] would return, and fails with its error
/// if it fails.
#[derive(Clone)]
pub struct ForeignEvent(Foreign);

#[derive(Clone)]
enum Foreign {
    Event(Event),
    User(Arc<Signal>),
}

impl ForeignEvent {
    /// Blocks until complete; the error of the work before it, or of the user event's
    /// failure, if it failed.
    pub fn wait(&self) -> Result<()> {
        match &self.0 {
            Foreign::Event(e) => e.wait(),
            Foreign::User(s) => s.wait(None),
        }
    }

    /// `Ok(true)` once complete; its error if it failed.
    pub fn query(&self) -> Result<bool> {
        match &self.0 {
            Foreign::Event(e) => e.query(),
            Foreign::User(s) => s.query(),
        }
    }

    /// The event of another backend, when it is one (a user event is not).
    pub fn event(&self) -> Option<&Event> {
        match &self.0 {
            Foreign::Event(e) => Some(e),
            Foreign::User(_) => None,
        }
    }
}

impl From<Event> for ForeignEvent {
    fn from(event: Event) -> Self {
        ForeignEvent(Foreign::Event(event))
    }
}

impl fmt::Debug for ForeignEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Foreign::Event(e) => e.fmt(f),
            Foreign::User(_) => f.write_str("UserEvent"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_event_completes_or_fails_once() {
        let e = UserEvent::new();
        assert!(!e.query().unwrap());
        let waiter = e.foreign();
        assert!(matches!(
            e.signal.wait(Some(Duration::from_millis(5))),
            Err(Error::Timeout { .. })
        ));
        let t = std::thread::spawn(move || waiter.wait());
        e.complete().unwrap();
        t.join().unwrap().unwrap();
        assert!(e.query().unwrap());
        assert!(matches!(e.complete(), Err(Error::InvalidArgument { .. })));
        assert!(matches!(e.fail("late"), Err(Error::InvalidArgument { .. })));
        assert!(e.query().unwrap());

        let f = UserEvent::new();
        let waiter = f.foreign();
        f.fail("the data never came").unwrap();
        match waiter.wait() {
            Err(Error::Aborted { message }) => assert!(message.contains("the data never came")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(f.query(), Err(Error::Aborted { .. })));
        assert!(waiter.event().is_none());
    }

    #[test]
    fn a_user_event_dropped_pending_fails_its_waiters() {
        let e = UserEvent::new();
        let waiter = e.foreign();
        drop(e);
        match waiter.wait() {
            Err(Error::Aborted { message }) => assert!(message.contains("dropped")),
            other => panic!("{other:?}"),
        }
        // Dropped after completing: the waiters see the completion.
        let e = UserEvent::new();
        let waiter = e.foreign();
        e.complete().unwrap();
        drop(e);
        waiter.wait().unwrap();
        assert!(waiter.query().unwrap());
    }
}
