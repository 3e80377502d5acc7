//! Operations one thread enqueues for several ranks at once ([`Communicator::grouped`]),
//! as a framework's single thread drives several GPUs between `ncclGroupStart` and
//! `ncclGroupEnd`.
//!
//! Outside a group, a rank's call to an operation that is not small waits until every
//! rank has arrived, so one thread cannot call every rank in turn (the first call would
//! wait for the second), and a thread per rank wakes and sleeps at each operation — on a
//! machine whose cores are busy computing, each wake-up can wait for a scheduler tick.
//! Inside a group, no call waits for another rank:
//!
//! - a small operation is always queued on the rank's stream (`small.rs`);
//! - any other arrives *deferred*: the rank enqueues a host function on its stream that
//!   waits for the operation's plan, then runs its share in shared memory
//!   ([`Work::participate_queued`]), and the call returns. The last rank to arrive plans
//!   the operation in shared memory, queued on the streams, and hands each deferred
//!   rank the plan ([`Deferred`]).
//!
//! So a group needs every device to run host functions and every buffer to be host
//! addressable (host devices); [`Communicator::can_group`] says whether it may be used.
//! A call refused inside a group (invalid arguments, or an override that forces an
//! enqueued algorithm) fails the communicator: the ranks called before it have queued
//! their parts already.

use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use xpu_hal::{Error, Result};

use super::shared_memory::Work;
use super::{Communicator, Shared};

thread_local! {
    /// The communicator whose group this thread is in (its shared state's address), or 0.
    static GROUP: Cell<usize> = const { Cell::new(0) };
}

/// The address that names `shared` in [`GROUP`].
fn key(shared: &Arc<Shared>) -> usize {
    Arc::as_ptr(shared) as usize
}

/// Whether this thread is in a group of the communicator of `shared`.
pub(super) fn in_group(shared: &Arc<Shared>) -> bool {
    GROUP.with(|g| g.get() == key(shared))
}

/// Leaves the group when dropped, also when the closure panics.
struct Leave(usize);

impl Drop for Leave {
    fn drop(&mut self) {
        GROUP.with(|g| g.set(self.0));
    }
}

impl Communicator {
    /// Whether [`Communicator::grouped`] may be used: every device runs host functions
    /// and is host addressable, and the communicator lies within this process.
    pub fn can_group(&self) -> bool {
        self.span.is_none()
            && self.shared.host_functions
            && self
                .shared
                .devices
                .iter()
                .all(|d| d.capabilities().host_addressable)
    }

    /// Runs `f`, in which this thread may call the collective operations of several (or
    /// all) of this communicator's ranks in turn: none of those calls waits for another
    /// rank. Each rank's part is queued on its stream and runs when every rank's stream
    /// has reached the operation, as outside a group. Point-to-point calls are not
    /// grouped.
    ///
    /// Fails with [`Error::Unsupported`] where [`Communicator::can_group`] is false, and
    /// with [`Error::InvalidArgument`] when this thread is already in a group. A call
    /// refused inside the group, or `f` failing after a call was made, fails the
    /// communicator: ranks called before have queued parts that would wait for the
    /// others (see the module's doc). Thread-safe: other threads may call other ranks
    /// meanwhile, grouped or not.
    pub fn grouped<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !self.can_group() {
            return Err(Error::unsupported(
                "grouped calls need every device of the communicator to run host functions and be host addressable, within one process; call each rank from a thread of its own",
            ));
        }
        let outer = GROUP.with(Cell::get);
        if outer != 0 {
            return Err(Error::invalid(
                "this thread is already in a group of calls; groups do not nest",
            ));
        }
        let seqs = || -> Vec<u64> {
            self.shared
                .seqs
                .iter()
                .map(|s| s.load(std::sync::atomic::Ordering::Acquire))
                .collect()
        };
        let before = seqs();
        GROUP.with(|g| g.set(key(&self.shared)));
        let _leave = Leave(outer);
        let result = f();
        if let Err(e) = &result {
            if seqs() != before {
                // Calls made before the error queued parts that the ranks not called
                // would never match: they must not wait for them.
                self.shared.fail(Error::aborted(format!(
                    "a group of calls failed after some ranks had queued their parts ({e}); the communicator is now failed: make a new one"
                )));
            }
        }
        result
    }
}

/// A deferred rank's wait for its operation's plan.
pub(crate) struct Deferred {
    state: Mutex<Plan>,
    planned: Condvar,
}

enum Plan {
    /// Not planned yet.
    Waiting,
    /// Planned: the rank runs its share of this work.
    Ready(Arc<Work>),
    /// The operation will not run, for this reason.
    Failed(Error),
    /// The rank's host function will not run (its stream skipped it, or it could not be
    /// enqueued): the work is abandoned as soon as it is planned.
    Gone,
}

/// How long a deferred rank sleeps between looks at whether the communicator was
/// aborted.
const LOOK: Duration = Duration::from_millis(10);

impl Deferred {
    pub(super) fn new() -> Arc<Deferred> {
        Arc::new(Deferred {
            state: Mutex::new(Plan::Waiting),
            planned: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the rank its plan (or why there is none).
    pub(super) fn plan(&self, plan: Result<Arc<Work>>) {
        let mut st = self.lock();
        match (&*st, plan) {
            (Plan::Gone, Ok(work)) => work.abandon(),
            (Plan::Waiting, Ok(work)) => *st = Plan::Ready(work),
            (Plan::Waiting, Err(e)) => *st = Plan::Failed(e),
            _ => {}
        }
        drop(st);
        self.planned.notify_all();
    }

    /// The rank's host function will not run: the others must not wait for its share.
    pub(super) fn give_up(&self) {
        let mut st = self.lock();
        match std::mem::replace(&mut *st, Plan::Gone) {
            Plan::Ready(work) => work.abandon(),
            Plan::Failed(e) => *st = Plan::Failed(e),
            Plan::Waiting | Plan::Gone => {}
        }
    }

    /// Waits for the plan until `deadline`, or until `stopped` says why it will not
    /// come (the communicator was aborted or failed).
    pub(super) fn wait(
        &self,
        deadline: Instant,
        stopped: impl Fn() -> Option<Error>,
    ) -> Result<Arc<Work>> {
        let mut st = self.lock();
        loop {
            match &*st {
                Plan::Ready(work) => return Ok(work.clone()),
                Plan::Failed(e) => return Err(e.clone()),
                Plan::Gone => {
                    return Err(Error::aborted(
                        "internal error: a grouped operation's share ran after it was given up",
                    ))
                }
                Plan::Waiting => {}
            }
            if let Some(e) = stopped() {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    message: "not every rank arrived at a grouped operation in time: call every rank's part of each operation inside the group".to_string(),
                });
            }
            st = self
                .planned
                .wait_timeout(st, LOOK.min(deadline - now))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}
