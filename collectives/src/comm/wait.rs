//! Short waits between the ranks' threads.
//!
//! Waking a sleeping thread costs tens of microseconds on small virtual machines, and
//! even `sched_yield` costs microseconds there — more than a small collective takes. So
//! a rank that waits for others spins, re-reading the condition, for a bounded time. It
//! spins outright when every rank can have a core of its own; when ranks outnumber the
//! cores, spinning would keep the awaited thread off its core, so it backs off to
//! yielding at once.

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

/// How long an exclusive spin goes before it also yields its core at each round of
/// polls: longer than a small collective takes when every rank has a core, short
/// beside the time slice a rank sharing this core would otherwise wait.
const YIELD_AFTER: Duration = Duration::from_micros(4);

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
                // Still waiting after a while: the awaited rank may share this core
                // (another process took one), so let it run.
                if waited >= YIELD_AFTER {
                    std::thread::yield_now();
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
        if !self.spin(spin, || done() || stop()) {
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
