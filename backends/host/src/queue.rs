//! The execution engine behind a host stream: an in-order job queue, a worker thread
//! that drains it, a completion counter, and the stream's error slot.
//!
//! Hand-offs between threads are the cost that matters here (a futex wake is ~20 µs on
//! small VMs, a spinning hand-off ~0.1 µs), so:
//!
//! - **Whoever waits, works — when the worker sleeps.** A thread that blocks on the
//!   stream without a time limit (`synchronize`, an untimed event wait) while the worker
//!   sleeps does not wake it: it takes the executor lock and runs the queued jobs itself,
//!   on its own (cache-hot) core. While the worker is awake the waiter leaves the jobs to
//!   it: taking them would leave the worker blocked on the executor lock, to be woken
//!   again, and a worker of another stream waiting here would end up running this
//!   stream's work instead of its own. Jobs are only ever popped by the holder of the
//!   executor lock, one at a time, and each is finished before the lock is released, so
//!   execution stays strictly in order no matter which thread runs a job. Timed waits and
//!   queries never run jobs, since a job may block for longer than the caller is willing
//!   to wait.
//! - **A sleeping waiter is woken at its point, not before.** Sleepers register the
//!   completion count they wait for; a job's completion wakes them only once the
//!   smallest of those is reached, so a thread waiting for the end of a long queue (or
//!   for another device's task) sleeps through the jobs before it.
//! - **Both sides spin briefly before they sleep.** The worker polls for new jobs for a
//!   few microseconds after its queue runs dry, and waiters poll the completion counter
//!   before they sleep on the condition variable. The polling backs off from spinning
//!   to yielding (crossbeam's `Backoff`), so on a machine with fewer cores than busy
//!   threads a poller hands its core to the thread it is waiting for.
//! - **An event costs no job while work is queued.** Recording an event attaches its
//!   mark to the last queued job, completed right after that job runs; only an event
//!   recorded on a drained queue queues a mark job of its own.
//! - **The counters live on their own cache lines** (`CachePadded`): the executor bumps
//!   `completed` while submitters bump `queued`, and neither should invalidate the
//!   other's line.
//!
//! The queue is a `VecDeque` under a mutex rather than a lock-free channel because a
//! job's number must equal its position in the queue (events are numbers on the
//! timeline): assigning the number and enqueueing must be one step, which one short
//! critical section gives directly.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crossbeam_utils::{Backoff, CachePadded};
use xpu_hal::backend::FaultState;
use xpu_hal::{Error, Result};

use crate::event::HostEvent;

/// How long the worker polls for more work before it sleeps, and a waiter polls for
/// completion before it sleeps.
const SPIN: Duration = Duration::from_micros(30);

/// One unit of stream work.
pub(crate) enum Job {
    /// Work that returns its own result, and what it costs.
    Work(Box<dyn FnOnce() -> Result<()> + Send>, Cost),
    /// An event's point on the timeline.
    Mark(Arc<HostEvent>),
}

/// Owed injected delay is slept once it reaches this many nanoseconds (see `owe`).
const OWED_SLEEP_NS: i64 = 50_000;

/// What a job's work is, for an injected slowdown.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cost {
    /// The operations it does ([`xpu_hal::backend::Fault::Slow`] delays each).
    pub ops: u64,
    /// Whether its time is the device's own work, which
    /// [`xpu_hal::backend::Fault::Throttle`] stretches: not a wait for other work, nor a
    /// host function (which may spend its time waiting for other ranks).
    pub stretches: bool,
}

/// A queued job, and the event to complete right after it (set when an event is
/// recorded while the job is still queued: the event needs no job of its own).
struct Entry {
    job: Job,
    mark: Option<Arc<HostEvent>>,
}

/// The job queue proper, guarded by one mutex.
struct Jobs {
    queue: VecDeque<Entry>,
    /// Jobs ever submitted; a job's number is this count right after its push.
    submitted: u64,
    /// Whether the worker sleeps on `work_cv`.
    worker_sleeping: bool,
    /// Set when the stream is dropped: the worker drains what is left and exits.
    closed: bool,
}

use xpu_hal::backend::lock;

/// The state a stream's worker, its submitters and its waiters share.
pub(crate) struct Timeline {
    jobs: Mutex<Jobs>,
    /// Queued jobs not yet popped, readable without the lock (for spinning).
    queued: CachePadded<AtomicUsize>,
    work_cv: Condvar,
    /// Held while popping and running one job: the in-order guarantee.
    exec: Mutex<()>,
    /// Jobs finished (run or skipped), in submission order.
    completed: CachePadded<AtomicU64>,
    /// First unreported error of this stream; while set, new work is skipped.
    error: Mutex<Option<Error>>,
    has_error: AtomicBool,
    /// Threads sleeping (or about to) on `done_cv`.
    sleepers: AtomicUsize,
    /// The smallest completion count a sleeper on `done_cv` waits for (`u64::MAX` when
    /// none): a job's completion wakes the sleepers only once it reaches this, so a
    /// thread waiting for the end of a long queue is not woken by every job.
    wake_at: AtomicU64,
    /// Whether the worker sleeps on `work_cv` (until it has woken and taken the lock):
    /// only then do waiters run jobs themselves.
    asleep: AtomicBool,
    done_lock: Mutex<()>,
    done_cv: Condvar,
    /// The device's id, for messages.
    pub(crate) device: String,
    /// The device's injected faults: once lost, nothing more runs or is accepted;
    /// slowed, every job takes longer.
    faults: Arc<FaultState>,
    /// Injected delay not slept yet, in nanoseconds (negative: slept ahead of it; only
    /// the job runner touches it).
    owed_ns: AtomicI64,
}

impl Timeline {
    fn new(device: String, faults: Arc<FaultState>) -> Self {
        Timeline {
            jobs: Mutex::new(Jobs {
                queue: VecDeque::new(),
                submitted: 0,
                worker_sleeping: false,
                closed: false,
            }),
            queued: CachePadded::new(AtomicUsize::new(0)),
            work_cv: Condvar::new(),
            exec: Mutex::new(()),
            completed: CachePadded::new(AtomicU64::new(0)),
            error: Mutex::new(None),
            has_error: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            wake_at: AtomicU64::new(u64::MAX),
            asleep: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done_cv: Condvar::new(),
            device,
            faults,
            owed_ns: AtomicI64::new(0),
        }
    }

    /// Jobs completed so far.
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    /// Jobs submitted so far.
    pub(crate) fn submitted(&self) -> u64 {
        lock(&self.jobs).submitted
    }

    /// The pending error, if any, without reporting it.
    pub(crate) fn peek_error(&self) -> Option<Error> {
        if !self.has_error.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.error).clone()
    }

    /// Reports (and clears) the pending error; on a lost device, always an error.
    pub(crate) fn take_error(&self) -> Result<()> {
        if !self.has_error.load(Ordering::Acquire) {
            return self.faults.check();
        }
        let mut slot = lock(&self.error);
        self.has_error.store(false, Ordering::Release);
        match slot.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn set_error(&self, e: Error) {
        let mut slot = lock(&self.error);
        if slot.is_none() {
            *slot = Some(e);
        }
        self.has_error.store(true, Ordering::Release);
    }

    fn push(&self, job: Job) -> Result<u64> {
        self.push_locked(&mut lock(&self.jobs), job)
    }

    fn push_locked(&self, jobs: &mut Jobs, job: Job) -> Result<u64> {
        self.faults.check()?;
        if jobs.closed {
            return Err(Error::DeviceLost {
                device: self.device.clone(),
                message: "the stream has been shut down".to_string(),
            });
        }
        jobs.queue.push_back(Entry { job, mark: None });
        jobs.submitted += 1;
        self.queued.fetch_add(1, Ordering::SeqCst);
        if jobs.worker_sleeping {
            jobs.worker_sleeping = false;
            self.work_cv.notify_one();
        }
        Ok(jobs.submitted)
    }

    /// An event at the current end of the queue, completed when execution passes it.
    /// While the last job is still queued the event rides on it (an event right after
    /// another is the same event); otherwise a mark job is queued.
    fn record(self: &Arc<Self>) -> Result<Arc<HostEvent>> {
        self.faults.check()?;
        let mut jobs = lock(&self.jobs);
        let submitted = jobs.submitted;
        if !jobs.closed {
            if let Some(last) = jobs.queue.back_mut() {
                return Ok(match &last.job {
                    Job::Mark(m) => m.clone(),
                    Job::Work(..) => last
                        .mark
                        .get_or_insert_with(|| Arc::new(HostEvent::new(self.clone(), submitted)))
                        .clone(),
                });
            }
        }
        let event = Arc::new(HostEvent::new(self.clone(), submitted + 1));
        self.push_locked(&mut jobs, Job::Mark(event.clone()))?;
        Ok(event)
    }

    fn pop(&self) -> Option<Entry> {
        let job = lock(&self.jobs).queue.pop_front();
        if job.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        job
    }

    /// Runs queued jobs while holding the executor lock; returns how many ran.
    fn run_queued(&self, _exec: &MutexGuard<'_, ()>, limit: u64) -> u64 {
        let mut ran = 0;
        while ran < limit {
            let Some(entry) = self.pop() else { break };
            run(entry.job, self);
            if let Some(mark) = entry.mark {
                mark.reached();
            }
            // Counted before the executor lock is released, so that a thread holding
            // the lock with an empty queue knows every submitted job is complete.
            self.finish_one();
            ran += 1;
        }
        ran
    }

    fn finish_one(&self) {
        let completed = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
        if self.sleepers.load(Ordering::SeqCst) > 0
            && completed >= self.wake_at.load(Ordering::SeqCst)
        {
            let _guard = lock(&self.done_lock);
            // Every sleeper wakes and those not yet done register their target again.
            self.wake_at.store(u64::MAX, Ordering::SeqCst);
            self.done_cv.notify_all();
        }
    }

    /// Blocks until at least `target` jobs have completed, running queued jobs on this
    /// thread whenever the worker is not running one.
    pub(crate) fn drive(&self, target: u64) {
        loop {
            if self.completed() >= target {
                return;
            }
            if !self.asleep.load(Ordering::SeqCst) {
                // The worker is awake and will run the jobs: taking them from it would
                // leave it blocked on the executor lock, to be woken again.
                self.wait_for(target, None);
                return;
            }
            match self.exec.try_lock() {
                Ok(guard) => {
                    let needed = target.saturating_sub(self.completed());
                    if self.run_queued(&guard, needed) == 0 {
                        // Nothing queued while we hold the lock: everything submitted
                        // has completed, so `target` has been reached.
                        return;
                    }
                }
                Err(TryLockError::Poisoned(p)) => {
                    drop(p.into_inner());
                    self.exec.clear_poison();
                }
                // The worker is running a job and will go on with the rest.
                Err(TryLockError::WouldBlock) => {
                    self.wait_for(target, None);
                    return;
                }
            }
        }
    }

    /// Waits (without running jobs) until at least `target` jobs have completed;
    /// `false` on timeout.
    pub(crate) fn wait_for(&self, target: u64, timeout: Option<Duration>) -> bool {
        if self.completed() >= target {
            return true;
        }
        let start = Instant::now();
        let backoff = Backoff::new();
        while start.elapsed() < SPIN {
            backoff.snooze();
            if self.completed() >= target {
                return true;
            }
        }
        let deadline = timeout.map(|t| start + t);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut guard = lock(&self.done_lock);
        let reached = loop {
            // Registered under the lock, before the check: a completion that the check
            // misses sees the registration, and its notification waits for this thread
            // to be asleep (it takes the lock).
            self.wake_at.fetch_min(target, Ordering::SeqCst);
            if self.completed() >= target {
                break true;
            }
            match deadline {
                None => {
                    guard = self.done_cv.wait(guard).unwrap_or_else(|p| p.into_inner());
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break false;
                    }
                    guard = self
                        .done_cv
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

    /// Waits for work; `false` once the stream is closed and drained.
    fn wait_for_work(&self) -> bool {
        let start = Instant::now();
        let backoff = Backoff::new();
        while start.elapsed() < SPIN {
            if self.queued.load(Ordering::SeqCst) > 0 {
                return true;
            }
            backoff.snooze();
        }
        let mut jobs = lock(&self.jobs);
        loop {
            if !jobs.queue.is_empty() {
                return true;
            }
            if jobs.closed {
                return false;
            }
            jobs.worker_sleeping = true;
            self.asleep.store(true, Ordering::SeqCst);
            jobs = self.work_cv.wait(jobs).unwrap_or_else(|p| p.into_inner());
            self.asleep.store(false, Ordering::SeqCst);
        }
    }
}

/// The submitting side of a stream's queue. Dropping it lets the worker finish what
/// was enqueued and exit.
pub(crate) struct Queue {
    timeline: Arc<Timeline>,
}

impl Queue {
    /// Starts a worker thread named `name` for a stream of the device whose injected
    /// faults `faults` holds.
    pub(crate) fn start(device: String, name: String, faults: Arc<FaultState>) -> Result<Self> {
        let timeline = Arc::new(Timeline::new(device, faults));
        let worker_timeline = timeline.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || worker(&worker_timeline))
            .map_err(|e| {
                Error::backend_message(
                    "host",
                    format!("could not start the worker thread `{name}`: {e}"),
                )
            })?;
        Ok(Queue { timeline })
    }

    pub(crate) fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    /// Enqueues a job; returns its number (the completion count once it is done).
    pub(crate) fn push(&self, job: Job) -> Result<u64> {
        self.timeline.push(job)
    }

    /// An event at the current end of the queue (see `Timeline::record`).
    pub(crate) fn record(&self) -> Result<Arc<HostEvent>> {
        self.timeline.record()
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let mut jobs = lock(&self.timeline.jobs);
        jobs.closed = true;
        self.timeline.work_cv.notify_all();
    }
}

fn worker(timeline: &Timeline) {
    while timeline.wait_for_work() {
        let guard = match timeline.exec.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        timeline.run_queued(&guard, u64::MAX);
    }
}

/// Runs one job (or skips work while an error is pending); the job and everything it
/// captured are dropped before this returns, so completion implies release.
fn run(job: Job, timeline: &Timeline) {
    match job {
        Job::Mark(mark) => mark.reached(),
        Job::Work(work, cost) => {
            if timeline.has_error.load(Ordering::Acquire) {
                // Skipped: an earlier job failed and the error has not been reported.
                return;
            }
            if let Err(e) = timeline.faults.check() {
                // The device failed with this job still queued: it never runs.
                timeline.set_error(e);
                return;
            }
            // An injected straggler (a delay per operation) or throttle (a stretch in
            // proportion to the work): the work takes longer, its result is the same.
            let delay = u64::try_from(timeline.faults.delay().as_nanos())
                .unwrap_or(u64::MAX)
                .saturating_mul(cost.ops);
            owe(timeline, delay);
            // Timed only when a throttle will stretch it.
            let started = (cost.stretches && timeline.faults.throttled()).then(Instant::now);
            match catch_unwind(AssertUnwindSafe(work)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => timeline.set_error(e),
                Err(payload) => timeline.set_error(Error::from_panic(
                    &format!("work on a stream of {}", timeline.device),
                    &*payload,
                )),
            }
            if let Some(started) = started {
                let stretch = timeline.faults.stretch(started.elapsed());
                owe(
                    timeline,
                    u64::try_from(stretch.as_nanos()).unwrap_or(u64::MAX),
                );
            }
        }
    }
}

/// Adds `ns` to the time the stream's injected slowdown owes, and sleeps what it owes
/// once that reaches [`OWED_SLEEP_NS`]. A sleep costs tens of microseconds more than it
/// asks for: the excess is credited against what later work owes, so that the device
/// is as slow as asked over time, and each sleep still lands beside the work that
/// owed most of it (where timing events around that work see it).
fn owe(timeline: &Timeline, ns: u64) {
    if ns == 0 {
        return;
    }
    let ns = i64::try_from(ns).unwrap_or(i64::MAX);
    let owed = timeline
        .owed_ns
        .fetch_add(ns, Ordering::Relaxed)
        .saturating_add(ns);
    if owed >= OWED_SLEEP_NS {
        let start = Instant::now();
        std::thread::sleep(Duration::from_nanos(owed.unsigned_abs()));
        let slept = i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX);
        // What was owed less what was slept: negative when the sleep overshot.
        timeline.owed_ns.fetch_sub(
            slept.min(owed.saturating_add(OWED_SLEEP_NS)),
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(f: impl FnOnce() + Send + 'static) -> Job {
        Job::Work(
            Box::new(move || {
                f();
                Ok(())
            }),
            Cost {
                ops: 1,
                stretches: true,
            },
        )
    }

    /// Waiters for many different points, some running jobs, some timed, all return
    /// once their point is reached: a completion that reaches a sleeper's point always
    /// wakes it, whatever other sleepers wait for.
    #[test]
    fn every_waiter_wakes_at_its_point() {
        let queue = Queue::start(
            "host:test".into(),
            "xpu-test-queue".into(),
            FaultState::new("host:test"),
        )
        .unwrap();
        let timeline = queue.timeline().clone();
        let jobs = 2_000u64;
        let waiters: Vec<_> = (0..8u64)
            .map(|w| {
                let t = timeline.clone();
                std::thread::spawn(move || {
                    for k in 1..=50u64 {
                        let mut target = (k * 40 + w * 7).min(jobs);
                        match (w + k) % 3 {
                            // Driving is for points already submitted (events).
                            0 => {
                                target = target.min(t.submitted());
                                t.drive(target)
                            }
                            1 => assert!(t.wait_for(target, None)),
                            _ => while !t.wait_for(target, Some(Duration::from_micros(50))) {},
                        }
                        assert!(t.completed() >= target, "returned before {target}");
                    }
                })
            })
            .collect();
        for i in 0..jobs {
            queue
                .push(job(move || {
                    if i % 64 == 0 {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }))
                .unwrap();
            if i % 256 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for w in waiters {
            w.join().unwrap();
        }
        timeline.drive(jobs);
        assert_eq!(timeline.completed(), jobs);
    }

    /// A thread waiting for a stream whose worker sleeps may run the jobs itself (the
    /// worker may also wake and take some), in order either way; while the worker is
    /// busy with a job the waiter leaves the rest to it.
    #[test]
    fn a_waiter_runs_jobs_only_while_the_worker_sleeps() {
        let queue = Queue::start(
            "host:test".into(),
            "xpu-test-queue".into(),
            FaultState::new("host:test"),
        )
        .unwrap();
        let timeline = queue.timeline().clone();
        // Let the worker fall asleep.
        while !timeline.asleep.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let ran_on = Arc::new(Mutex::new(Vec::new()));
        for i in 0..4 {
            let ran_on = ran_on.clone();
            queue
                .push(job(move || {
                    lock(&ran_on).push((i, std::thread::current().name().map(String::from)));
                }))
                .unwrap();
        }
        timeline.drive(4);
        let ran = lock(&ran_on).clone();
        assert_eq!(ran.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        // A job that blocks keeps the worker awake: the waiter waits for it.
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        let ran_on2 = ran_on.clone();
        queue
            .push(job(move || {
                while !g.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                lock(&ran_on2).push((4, std::thread::current().name().map(String::from)));
            }))
            .unwrap();
        while timeline.queued.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            gate.store(true, Ordering::SeqCst);
        });
        timeline.drive(5);
        opener.join().unwrap();
        assert_eq!(lock(&ran_on)[4].1.as_deref(), Some("xpu-test-queue"));
    }
}
