//! Placement policies: which device a task runs on.
//!
//! A policy sees, for each device that can run the task, what the scheduler knows at
//! the moment of placement: how many tasks are still queued there, when the device is
//! expected to be free, how long the task would take there (if the performance model is
//! calibrated) and how long it would take to bring the task's data there. It returns the
//! candidate to use. A task pinned to a device skips the policy.
//!
//! - **`eager`** ignores costs: ready tasks wait in one central queue, and each device's
//!   worker takes the oldest task it can run whenever the device has room (fewer than a
//!   few tasks in flight). Use it as a baseline, or when tasks are alike.
//! - **`ws`** (work stealing): each device has a deque of ready tasks; a task made ready
//!   by one dispatched on a device goes to that device's deque (its inputs are there), a
//!   device with room takes its newest task, and an idle device steals the oldest task
//!   of the most loaded other device that it can run. Use it for irregular graphs of
//!   alike devices, where locality matters more than speed differences.
//! - **`dmda`** (StarPU's "deque model data aware", HEFT's rule applied online): the
//!   device with the earliest expected finish — when it is free, plus the transfers of
//!   the task's inputs, plus the task's predicted time there. A task whose model is not
//!   calibrated on every candidate goes where it has been measured least, so that the
//!   models learn. Use it when devices differ in speed or data movement matters.
//! - **`heft`** (static list scheduling, Topcuoglu et al.): submitted tasks are held
//!   until the next wait (or until [`HEFT_WINDOW`] are held), then placed together by
//!   HEFT — upward ranks, insertion into idle gaps — on the performance models' costs
//!   and the measured bandwidths, and dispatched in the order of their planned starts.
//!   It sees the whole window where `dmda` sees one task at a time; it costs a wait
//!   before anything runs. Use it for a step submitted whole before waiting, once the
//!   models know the codelets (uncalibrated, every task is guessed at 1 µs). The same
//!   planning applies to a recorded graph through `Scheduler::plan`.
//!
//! Choose with [`crate::SchedulerOptions::policy`] or `XPU_SCHED`.

use std::fmt;
use std::str::FromStr;

/// Tasks `heft` holds at most before it plans and dispatches them.
pub const HEFT_WINDOW: usize = 1024;

use xpu_hal::Error;

/// A device that can run the task, as the policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The device's index in the scheduler.
    pub device: usize,
    /// Tasks placed there that have not completed.
    pub queued: u64,
    /// Seconds from now until the device is expected to be free.
    pub free_in: f64,
    /// Predicted seconds of the task there, when the model is calibrated.
    pub exec: Option<f64>,
    /// Times the task's codelet has been measured there.
    pub samples: u64,
    /// Predicted seconds to bring the task's inputs there (bytes over the measured
    /// bandwidth, plus a fixed hand-off cost per input copied).
    pub transfer: f64,
    /// Seconds from now until the last of the task's inputs is expected to be written
    /// (wherever its writer runs), 0 when they all are already.
    pub inputs_in: f64,
}

/// The placement policies (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Cost-unaware: one central queue, served by each device when it has room.
    Eager,
    /// Work stealing between per-device deques.
    Ws,
    /// Earliest expected finish time, with performance and transfer models.
    #[default]
    Dmda,
    /// HEFT over the tasks submitted since the last wait.
    Heft,
}

impl Policy {
    /// Every policy, by name.
    pub const ALL: [Policy; 4] = [Policy::Eager, Policy::Ws, Policy::Dmda, Policy::Heft];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Eager => "eager",
            Policy::Ws => "ws",
            Policy::Dmda => "dmda",
            Policy::Heft => "heft",
        }
    }

    /// Whether tasks wait in queues for a device to take them (`eager`, `ws`), rather
    /// than being placed when submitted (`dmda`).
    pub fn queued(self) -> bool {
        matches!(self, Policy::Eager | Policy::Ws)
    }

    /// The index in `candidates` (never empty) of the device to use, for a task placed
    /// when submitted (queued policies use it only for pinned or single-candidate
    /// tasks, where it is trivial).
    pub fn choose(self, candidates: &[Candidate]) -> usize {
        let by = |key: &dyn Fn(&Candidate) -> (f64, f64)| {
            let mut best = 0;
            for (i, c) in candidates.iter().enumerate().skip(1) {
                if key(c) < key(&candidates[best]) {
                    best = i;
                }
            }
            best
        };
        match self {
            Policy::Eager | Policy::Ws => by(&|c| (c.queued as f64, c.device as f64)),
            // `heft` places windows of tasks; a single task (one run again after a
            // failure) goes by dmda's rule.
            Policy::Dmda | Policy::Heft => {
                if candidates.iter().any(|c| c.exec.is_none()) {
                    // Calibrate: where the codelet has been measured least.
                    return by(&|c| (c.samples as f64, c.queued as f64));
                }
                // HEFT's earliest finish, online: the device must be free and the
                // inputs written, then copied there, then the task runs.
                by(&|c| {
                    (
                        c.free_in.max(c.inputs_in) + c.transfer + c.exec.unwrap_or(0.0),
                        c.queued as f64,
                    )
                })
            }
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Policy, Error> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
                Error::invalid(format!(
                    "unknown scheduling policy `{s}`; use one of {}",
                    names.join(", ")
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(device: usize, queued: u64, free_in: f64, exec: Option<f64>, transfer: f64) -> Candidate {
        Candidate {
            inputs_in: 0.0,
            device,
            queued,
            free_in,
            exec,
            samples: if exec.is_some() { 10 } else { 0 },
            transfer,
        }
    }

    #[test]
    fn eager_takes_the_least_loaded_and_dmda_the_earliest_finish() {
        let cs = [
            c(0, 5, 1.0, Some(1.0), 0.0),
            c(1, 1, 0.1, Some(10.0), 0.0),
            c(2, 3, 0.5, Some(1.0), 2.0),
        ];
        assert_eq!(Policy::Eager.choose(&cs), 1);
        // Finishes: 2.0, 10.1, 3.5.
        assert_eq!(Policy::Dmda.choose(&cs), 0);
    }

    #[test]
    fn dmda_calibrates_where_it_has_measured_least() {
        let mut cs = [c(0, 0, 0.0, Some(1.0), 0.0), c(1, 0, 0.0, None, 0.0)];
        cs[0].samples = 7;
        assert_eq!(Policy::Dmda.choose(&cs), 1);
    }

    #[test]
    fn policies_parse_by_name() {
        assert_eq!("dmda".parse::<Policy>().unwrap(), Policy::Dmda);
        let e = "heftt".parse::<Policy>().unwrap_err();
        assert!(e.to_string().contains("eager, ws, dmda"), "{e}");
    }
}
