//! The execution engine behind a host stream: one worker thread draining an in-order
//! queue of jobs, a completion counter, and the stream's error slot.
//!
//! Hand-offs are the cost that matters here (a futex wake is ~20 µs on small VMs, a
//! spin hand-off ~0.1 µs), so both sides spin briefly before they block: the worker
//! keeps polling the queue for a short while after its last job, and a waiter polls
//! the completion counter before it sleeps on the condition variable.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use xpu_hal::{Error, Result};

/// How long the worker polls for more work before it sleeps, and a waiter polls for
/// completion before it sleeps.
const SPIN: Duration = Duration::from_micros(30);

/// One unit of stream work.
pub(crate) enum Job {
    /// Work that returns its own result.
    Work(Box<dyn FnOnce() -> Result<()> + Send>),
    /// An event's point on the timeline.
    Mark(Arc<Mark>),
}

/// What an event records when the worker reaches it.
#[derive(Default)]
pub(crate) struct Mark {
    /// When the worker reached it.
    pub(crate) time: OnceLock<Instant>,
    /// The outcome of the work before it.
    pub(crate) result: OnceLock<Result<()>>,
}

/// The state a stream's worker and its waiters share.
pub(crate) struct Timeline {
    /// Jobs finished (run or skipped), in submission order.
    completed: AtomicU64,
    /// First unreported error of this stream; while set, new jobs are skipped.
    error: Mutex<Option<Error>>,
    has_error: AtomicBool,
    /// Number of threads sleeping (or about to) on `cv`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    /// The device's name, for messages.
    pub(crate) device: String,
}

impl Timeline {
    fn new(device: String) -> Self {
        Timeline {
            completed: AtomicU64::new(0),
            error: Mutex::new(None),
            has_error: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            device,
        }
    }

    /// Jobs completed so far.
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    /// The pending error, if any, without reporting it.
    pub(crate) fn peek_error(&self) -> Option<Error> {
        if !self.has_error.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reports (and clears) the pending error.
    pub(crate) fn take_error(&self) -> Result<()> {
        if !self.has_error.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        self.has_error.store(false, Ordering::Release);
        match slot.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn set_error(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.has_error.store(true, Ordering::Release);
    }

    fn finish_one(&self) {
        self.completed.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.cv.notify_all();
        }
    }

    /// Waits until at least `target` jobs have completed; `false` on timeout.
    pub(crate) fn wait_for(&self, target: u64, timeout: Option<Duration>) -> bool {
        if self.completed() >= target {
            return true;
        }
        let start = Instant::now();
        while start.elapsed() < SPIN {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            if self.completed() >= target {
                return true;
            }
        }
        let deadline = timeout.map(|t| start + t);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let reached = loop {
            if self.completed() >= target {
                break true;
            }
            match deadline {
                None => {
                    guard = self.cv.wait(guard).unwrap_or_else(|p| p.into_inner());
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break false;
                    }
                    guard = self
                        .cv
                        .wait_timeout(guard, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        };
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        reached
    }
}

/// The submitting side of a stream's queue.
pub(crate) struct Queue {
    timeline: Arc<Timeline>,
    /// The sender and the number of jobs submitted, updated together so that job
    /// numbers follow queue order even with several submitting threads.
    submit: Mutex<(Sender<Job>, u64)>,
}

impl Queue {
    /// Starts a worker thread named `name`.
    pub(crate) fn start(device: String, name: String) -> Result<Self> {
        let timeline = Arc::new(Timeline::new(device));
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let worker_timeline = timeline.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || worker(rx, worker_timeline))
            .map_err(|e| {
                Error::backend_message(
                    "host",
                    format!("could not start the worker thread `{name}`: {e}"),
                )
            })?;
        Ok(Queue {
            timeline,
            submit: Mutex::new((tx, 0)),
        })
    }

    pub(crate) fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    /// Enqueues a job; returns its number (the completion count once it is done).
    pub(crate) fn push(&self, job: Job) -> Result<u64> {
        let mut guard = self.submit.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.send(job).map_err(|_| Error::DeviceLost {
            device: self.timeline.device.clone(),
            message: "the stream's worker thread has stopped".to_string(),
        })?;
        guard.1 += 1;
        Ok(guard.1)
    }

    /// Jobs submitted so far.
    pub(crate) fn submitted(&self) -> u64 {
        self.submit.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

fn worker(rx: Receiver<Job>, timeline: Arc<Timeline>) {
    loop {
        let job = match rx.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => match spin_recv(&rx) {
                Some(job) => job,
                None => match rx.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                },
            },
        };
        run(job, &timeline);
        timeline.finish_one();
    }
}

/// Polls the queue for up to [`SPIN`].
fn spin_recv(rx: &Receiver<Job>) -> Option<Job> {
    let start = Instant::now();
    while start.elapsed() < SPIN {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
        if let Ok(job) = rx.try_recv() {
            return Some(job);
        }
    }
    None
}

/// Runs one job (or skips work while an error is pending); the job and everything it
/// captured are dropped before this returns, so completion implies release.
fn run(job: Job, timeline: &Timeline) {
    match job {
        Job::Mark(mark) => {
            let _ = mark.time.set(Instant::now());
            let result = match timeline.peek_error() {
                None => Ok(()),
                Some(e) => Err(Error::aborted(format!(
                    "work enqueued before this event on {} failed: {e}",
                    timeline.device
                ))),
            };
            let _ = mark.result.set(result);
        }
        Job::Work(work) => {
            if timeline.has_error.load(Ordering::Acquire) {
                // Skipped: an earlier job failed and the error has not been reported.
                return;
            }
            match catch_unwind(AssertUnwindSafe(work)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => timeline.set_error(e),
                Err(payload) => timeline.set_error(Error::from_panic(
                    &format!("work on a stream of {}", timeline.device),
                    &*payload,
                )),
            }
        }
    }
}
