//! Short waits between the ranks' threads.
//!
//! Waking a sleeping thread costs tens of microseconds on small virtual machines, and
//! even `sched_yield` costs microseconds there — more than a small collective takes. So
//! a rank that waits for others spins, re-reading the condition, for a bounded time. It
//! spins outright when every rank can have a core of its own; when ranks outnumber the
//! cores, spinning would keep the awaited thread off its core, so it backs off to
//! yielding at once.
//!
//! Ranks that could each have a core do not always get one: the kernel may run two of
//! them on one core while another sits idle (a wake-up placed beside the waker, a
//! thread kept where its cache is warm), and there a spinning waiter holds the core the
//! awaited rank needs until its time slice ends. So a waiter that knows whom it waits
//! for asks where they last ran ([`current_core`]) and yields at once, at every round of
//! polls, when one of them ran on its own core.

use std::time::{Duration, Instant};

/// How a bounded wait ([`Spinner::wait_until`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The condition holds.
    Done,
    /// The stop condition held first.
    Stopped,
    /// The deadline passed first.
    TimedOut,
}

use crossbeam_utils::Backoff;

/// The core the calling thread runs on now, [`NO_CORE`] where the system cannot say.
/// Cheap (the kernel keeps it in memory the thread reads), but only a hint: the thread
/// may move right after.
pub(crate) fn current_core() -> u32 {
    // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's state.
    let core = unsafe { libc::sched_getcpu() };
    u32::try_from(core).unwrap_or(NO_CORE)
}

/// Whether the threads a waiter waits for share its core, as far as it can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Core {
    /// The system does not say where threads run.
    Unknown,
    /// None of them last ran on the waiter's core.
    Own,
    /// One of them did. Of two threads that wait for each other by turns on one core,
    /// only one must move off it (`move_off`), or both would move to the same other
    /// core together.
    Shared { move_off: bool },
}

/// How often a thread may move itself off its core ([`move_off_this_core`]).
const MOVE_EVERY: Duration = Duration::from_millis(2);

thread_local! {
    /// When this thread last moved itself off its core.
    static MOVED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Whether a thread that last moved itself at `last` may move again at `now`.
fn may_move(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|t| now.duration_since(t) >= MOVE_EVERY)
}

/// Moves the calling thread to another core it may run on, leaving its affinity as it
/// was: the kernel picks the core, and the thread may run anywhere again at once. At
/// most once every [`MOVE_EVERY`] per thread, and never where it may run on one core
/// only; `false` when it did not move.
fn move_off_this_core() -> bool {
    let now = Instant::now();
    if !may_move(MOVED.get(), now) {
        return false;
    }
    MOVED.set(Some(now));
    let core = current_core();
    let Ok(core) = usize::try_from(core) else {
        return false;
    };
    let Some(allowed) = crate::process::cores::allowed_set() else {
        return false;
    };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: plain reads and writes of the set, within its size (CPU_COUNT/CPU_ISSET
    // bound the index).
    unsafe {
        if core >= libc::CPU_SETSIZE as usize
            || !libc::CPU_ISSET(core, &allowed)
            || libc::CPU_COUNT(&allowed) < 2
        {
            return false;
        }
        let mut elsewhere = allowed;
        libc::CPU_CLR(core, &mut elsewhere);
        // The thread moves before this returns; restoring the set then leaves it there.
        if libc::sched_setaffinity(0, size, &elsewhere) != 0 {
            return false;
        }
        libc::sched_setaffinity(0, size, &allowed) == 0
    }
}

/// What [`current_core`] answers when it cannot tell.
pub(crate) const NO_CORE: u32 = u32::MAX;

/// How long an exclusive spin goes before it also yields its core at each round of
/// polls: longer than a small collective takes when every rank has a core, short
/// beside the time slice a rank sharing this core would otherwise wait.
const YIELD_AFTER: Duration = Duration::from_micros(4);

/// How long an exclusive spin trusts a hint that the awaited ranks run on other cores
/// before it yields anyway (the hint may be stale: a rank may have moved to this core
/// since it last said where it ran).
const HINT_TRUSTED_FOR: Duration = Duration::from_micros(50);

/// How a group of `ranks` threads waits for each other on this machine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spinner {
    /// Whether every rank can run on a core of its own.
    exclusive: bool,
}

impl Spinner {
    pub fn new(ranks: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        Spinner {
            exclusive: ranks <= cores,
        }
    }

    /// Spins until `done()` holds or `budget` has passed; returns whether it holds.
    pub fn spin(&self, budget: Duration, done: impl Fn() -> bool) -> bool {
        self.spin_beside(budget, done, || Core::Unknown)
    }

    /// [`Spinner::spin`] for a waiter that can tell whether a thread it waits for shares
    /// its core (`shares_core`, asked between rounds of polls). While one does, the
    /// waiter moves to another core if it is the one to move and may, or else yields at
    /// every round; while none does, it yields only after [`HINT_TRUSTED_FOR`]; when it
    /// cannot tell, it yields at every round after [`YIELD_AFTER`].
    pub fn spin_beside(
        &self,
        budget: Duration,
        done: impl Fn() -> bool,
        shares_core: impl Fn() -> Core,
    ) -> bool {
        let polls = |n: usize| {
            for _ in 0..n {
                if done() {
                    return true;
                }
                std::hint::spin_loop();
            }
            false
        };
        if self.exclusive {
            // Read the clock only every few dozen polls, and not at all when the first
            // ones succeed (the common case): it costs more than a poll.
            if polls(32) {
                return true;
            }
            let start = Instant::now();
            loop {
                if polls(32) {
                    return true;
                }
                let waited = start.elapsed();
                if waited >= budget {
                    return done();
                }
                // Still waiting after a while, the awaited rank may share this core
                // (another process took one); or it does: let it run.
                match shares_core() {
                    // The awaited rank needs this core: take another if there is one
                    // and this waiter is the one of the two to move, else let it run.
                    Core::Shared { move_off } => {
                        if !(move_off && move_off_this_core()) {
                            std::thread::yield_now();
                        }
                    }
                    // It ran elsewhere: keep this core, since yielding it to another
                    // process's busy thread would cost a whole time slice; but only for
                    // so long, since where it ran is a hint that may be stale.
                    Core::Own if waited >= HINT_TRUSTED_FOR => std::thread::yield_now(),
                    Core::Own => {}
                    Core::Unknown if waited >= YIELD_AFTER => std::thread::yield_now(),
                    Core::Unknown => {}
                }
            }
        }
        let start = Instant::now();
        let backoff = Backoff::new();
        while !done() {
            if start.elapsed() >= budget {
                return false;
            }
            backoff.snooze();
        }
        true
    }

    /// Waits until `done()` holds: spins for up to `spin`, then sleeps in short steps,
    /// giving up when `stop()` holds or at `deadline`.
    ///
    /// `deadline` is asked for only when the spin ends unfulfilled, so that short waits
    /// do not read the clock for it.
    pub fn wait_until(
        &self,
        spin: Duration,
        deadline: impl FnOnce() -> Instant,
        done: impl Fn() -> bool,
        stop: impl Fn() -> bool,
    ) -> Waited {
        self.wait_until_beside(spin, deadline, done, stop, || Core::Unknown)
    }

    /// [`Spinner::wait_until`], spinning as [`Spinner::spin_beside`] does.
    pub fn wait_until_beside(
        &self,
        spin: Duration,
        deadline: impl FnOnce() -> Instant,
        done: impl Fn() -> bool,
        stop: impl Fn() -> bool,
        shares_core: impl Fn() -> Core,
    ) -> Waited {
        if !self.spin_beside(spin, || done() || stop(), shares_core) {
            let deadline = deadline();
            while !done() && !stop() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        if done() {
            Waited::Done
        } else if stop() {
            Waited::Stopped
        } else {
            Waited::TimedOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity() -> libc::cpu_set_t {
        // SAFETY: all-zero is a valid empty set, filled by the call for this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            set
        }
    }

    fn same(a: &libc::cpu_set_t, b: &libc::cpu_set_t) -> bool {
        // SAFETY: reads of valid sets, within their size.
        (0..libc::CPU_SETSIZE as usize)
            .all(|c| unsafe { libc::CPU_ISSET(c, a) == libc::CPU_ISSET(c, b) })
    }

    #[test]
    fn moving_off_a_core_leaves_the_threads_affinity_as_it_was() {
        std::thread::spawn(|| {
            let before = affinity();
            // SAFETY: a read of a valid set.
            let cores = unsafe { libc::CPU_COUNT(&before) };
            let moved = move_off_this_core();
            assert!(same(&before, &affinity()));
            assert_eq!(moved, cores >= 2 && current_core() != NO_CORE);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_moves_itself_at_most_once_every_few_milliseconds() {
        let t = Instant::now();
        assert!(may_move(None, t));
        // Not again within MOVE_EVERY (decided on the clock's readings, not timed here).
        assert!(!may_move(Some(t), t));
        assert!(!may_move(Some(t), t + MOVE_EVERY / 2));
        assert!(may_move(Some(t), t + MOVE_EVERY));
    }

    #[test]
    fn a_thread_allowed_one_core_stays_there() {
        std::thread::spawn(|| {
            let core = current_core();
            if core == NO_CORE {
                return;
            }
            // SAFETY: a valid set with one core this thread runs on, for this thread.
            let one = unsafe {
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(core as usize, &mut one);
                let size = std::mem::size_of::<libc::cpu_set_t>();
                assert_eq!(libc::sched_setaffinity(0, size, &one), 0);
                one
            };
            assert!(!move_off_this_core());
            assert!(same(&one, &affinity()));
        })
        .join()
        .unwrap();
    }
}
