//! Scheduling a task graph with given costs, executing nothing.
//!
//! Like StarPU running over SimGrid, this module plans where and when each task of a
//! graph runs from a cost model alone — with the placement policies the runtime uses
//! — so that placements can be planned for machines one does not have and policies
//! compared on known graphs. `xpu sched simulate --graph FILE` runs it from the
//! command line.
//!
//! # The model
//!
//! A [`CostGraph`] has `P` processors, tasks, and edges (dependencies).
//!
//! - Task `t` takes `cost(t, p)` on processor `p`, or cannot run there (an infinite
//!   cost; `null` in JSON). Every task can run on at least one processor. A task runs
//!   on one processor, without preemption, and a processor runs one task at a time.
//! - Edge `e = (a → b)` means `b` starts after `a` finishes and `a`'s output reaches
//!   `b`'s processor: with `a` on `p` and `b` on `q`, `start(b) ≥ finish(a) +
//!   comm(e, p, q)`, where `comm(e, p, q) = cost(e) × links[p][q]`. The links matrix
//!   defaults to 1 between two processors and 0 on one processor. Transfers overlap
//!   computation and each other (no link contention).
//! - The makespan is the latest finish time; [`CostGraph::lower_bound`] bounds it from
//!   below (critical path at the smallest costs without transfers, and the total
//!   smallest work spread evenly).
//!
//! [`Schedule::validate`] checks every one of these rules on a schedule.
//!
//! # The JSON format
//!
//! ```json
//! {
//!   "processors": 3,
//!   "tasks": [{"id": "t1", "cost": [14, 16, 9]},
//!             {"id": "t2", "cost": [13, null, 18]}],
//!   "edges": [{"from": "t1", "to": "t2", "cost": 18}],
//!   "links": [[0, 1, 2], [1, 0, 2], [2, 2, 0]]
//! }
//! ```
//!
//! - `processors`: a count (processors named `p0`, `p1`, …) or a list of unique names.
//! - `tasks[].cost`: one entry per processor, `null` where the task cannot run; or an
//!   object from processor names to costs, a processor left out (or `null`) meaning the
//!   task cannot run there. Costs are non-negative numbers.
//! - `edges[].cost`: the transfer time when the two tasks run on different processors
//!   (default 0: a dependency without data). At most one edge per pair of tasks.
//! - `links` (optional extension): a `P × P` matrix of non-negative multipliers of edge
//!   costs, row = producer's processor, column = consumer's processor, for machines
//!   whose links differ (NVLink pairs beside PCIe, a slow host link). Without it:
//!   1 off the diagonal and 0 on it.
//!
//! Unknown fields are refused, so that a misspelt one is not silently ignored. Every
//! input error is an [`xpu_hal::Error::InvalidArgument`] naming the task or edge and the
//! fix; a graph with a cycle names the tasks on one.
//!
//! # The policies
//!
//! | policy | kind | order | placement | insertion |
//! |---|---|---|---|---|
//! | [`heft`] | static list | decreasing upward rank | earliest finish | yes |
//! | [`heft_la`] | static list | decreasing upward rank | smallest largest finish of the children, tentatively placed | yes |
//! | [`peft`] | static list | ready task with the largest mean OCT | smallest earliest finish + OCT | yes |
//! | [`dmda`] | online | submission order, when ready | earliest expected finish | no |
//! | [`eager`] | dynamic (event-driven) | central FIFO | first idle processor that can run it | — |
//! | [`ws`] | dynamic (event-driven) | per-processor deques, LIFO, stealing the oldest | where its producer ran | — |
//! | `best` ([`best`]) | | runs `heft`, `heft-la` and `peft` | keeps the smallest makespan | |
//!
//! - **HEFT** (Topcuoglu, Hariri & Wu, IEEE TPDS 2002). The upward rank of a task is
//!   its mean cost over the processors it can run on plus the largest, over its
//!   out-edges, of the edge's mean transfer time ([`CostGraph::mean_comm`]: the edge's
//!   cost with the default links) plus the child's rank. Tasks are taken by decreasing
//!   rank, each placed on the processor where it finishes earliest, in the first idle
//!   gap between already placed tasks where it fits. On the paper's 10-task graph it
//!   gives the paper's schedule, makespan 80.
//! - **HEFT-LA** (Bittencourt, Sakellariou & Madeira, PDP 2010, one-level lookahead).
//!   HEFT's order, but for each processor the task could go on, its children are
//!   tentatively placed (HEFT's way, counting only their predecessors placed so far),
//!   and the task goes where the largest of their finish times is smallest. It sees
//!   the cost of moving the task's output, which HEFT ignores when it places the task.
//! - **PEFT** (Arabnejad & Barbosa, IEEE TPDS 2014). The Optimistic Cost Table
//!   ([`optimistic_cost_table`]) gives, for each task and processor, the time left to
//!   the end of the graph if every later task ran where best for it. Ready tasks are
//!   taken by decreasing mean OCT, each placed (with insertion) to minimise its
//!   earliest finish plus its OCT on that processor: a lookahead at the cost of the
//!   OCT table alone. On the paper's sample graph it gives the paper's table and
//!   schedule (makespan 122, where HEFT takes 133).
//! - **dmda** (StarPU's `dmda`). Online: tasks are decided in submission order (input
//!   order) as soon as their predecessors are decided, each appended to the queue of
//!   the processor where it is expected to finish first — after the processor's last
//!   task, once its inputs have arrived, plus its cost. Unlike StarPU, which charges
//!   the transfers of a task's inputs one after the other from the moment it decides,
//!   the model here lets each input move as soon as it is produced (the same model as
//!   the other policies, so their makespans compare).
//! - **eager** (StarPU's `eager`). Event-driven: ready tasks join one FIFO; an idle
//!   processor takes the oldest task it can run. Costs play no part in placement, so
//!   it is the baseline the cost-aware policies must beat.
//! - **ws** (StarPU's `ws`, Cilk's work stealing). Event-driven: each processor has a
//!   deque; tasks ready at the start are dealt round-robin, and a task made ready by a
//!   task finishing on processor `p` goes on `p`'s deque (or, if `p` cannot run it, on
//!   the next processor's that can). An idle processor pops the newest task of its own
//!   deque, else steals the oldest task it can run from the most loaded other
//!   processor (by queued tasks) that has one.
//!
//! The dynamic policies simulate an execution: at each moment, tasks finishing then
//! complete first and release their successors; then idle processors take work,
//! lowest index first. A processor that takes a task waits on it for its inputs.
//!
//! # Tie-breaking
//!
//! Every policy is deterministic. Times and ranks that differ by less than one part in
//! 10¹² are ties, so that rounding cannot decide. Tasks of equal rank go in
//! [`CostGraph::topological_order`] (Kahn's order, taking the ready task first in input
//! order), which also keeps the order topological when a rank equals a successor's (a
//! task of zero cost). Processors of equal score go to the lowest index; HEFT-LA
//! breaks a tie in its lookahead by the task's own finish time first. `best` prefers
//! `heft`, then `heft-la`, then `peft` on equal makespans.
//!
//! # Complexity
//!
//! For `v` tasks, `e` edges and `p` processors, with insertion scanning a processor's
//! placed tasks: HEFT `O(e·p + v²·p)`; PEFT adds the OCT table, `O(e·p²)`; HEFT-LA
//! multiplies HEFT's placement by the number of children and processors, `O(v²·p²·d)`
//! with `d` the largest out-degree; dmda `O(e·p + v·p)`; eager and ws `O(e + v·(v + p))`
//! at most (scanning queues). Graphs of thousands of tasks plan in milliseconds except
//! HEFT-LA on wide graphs.
//!
//! # Which to use
//!
//! For planning a static graph (a training step recorded once, replayed many times),
//! `best`: the static list policies with lookahead usually win, and the best of three
//! is cheap. HEFT alone is the reference and the fastest of them. dmda is what the
//! runtime does online when tasks arrive one at a time and cannot be reordered; eager
//! and ws model the cost-unaware dynamic policies, and show how much the cost model
//! buys.

mod common;
mod dmda;
mod eager;
mod events;
mod graph;
mod heft;
mod peft;
mod schedule;
mod ws;

use std::fmt;
use std::str::FromStr;

use xpu_hal::Error;

pub use dmda::dmda;
pub use eager::eager;
pub use graph::{CostGraph, Edge, Task, MAX_PROCESSORS};
pub use heft::{heft, heft_la, heft_order, upward_ranks};
pub use peft::{optimistic_cost_table, peft};
pub use schedule::{Placed, Schedule};
pub use ws::ws;

/// A scheduling policy, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// [`heft`].
    Heft,
    /// [`heft_la`].
    HeftLa,
    /// [`peft`].
    Peft,
    /// [`dmda`].
    Dmda,
    /// [`eager`].
    Eager,
    /// [`ws`].
    Ws,
    /// [`best`]: the smallest makespan of `heft`, `heft-la` and `peft`.
    Best,
}

impl Policy {
    /// Every policy, `best` last.
    pub const ALL: [Policy; 7] = [
        Policy::Heft,
        Policy::HeftLa,
        Policy::Peft,
        Policy::Dmda,
        Policy::Eager,
        Policy::Ws,
        Policy::Best,
    ];

    /// The policies `best` chooses among, in its order of preference on equal makespans.
    pub const BEST_OF: [Policy; 3] = [Policy::Heft, Policy::HeftLa, Policy::Peft];

    /// The policy's name: `heft`, `heft-la`, `peft`, `dmda`, `eager`, `ws`, `best`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Heft => "heft",
            Policy::HeftLa => "heft-la",
            Policy::Peft => "peft",
            Policy::Dmda => "dmda",
            Policy::Eager => "eager",
            Policy::Ws => "ws",
            Policy::Best => "best",
        }
    }

    /// Schedules `graph` with this policy.
    pub fn schedule(self, graph: &CostGraph) -> Schedule {
        match self {
            Policy::Heft => heft(graph),
            Policy::HeftLa => heft_la(graph),
            Policy::Peft => peft(graph),
            Policy::Dmda => dmda(graph),
            Policy::Eager => eager(graph),
            Policy::Ws => ws(graph),
            Policy::Best => best(graph).1,
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

    /// Parses a policy name (as [`Policy::name`] writes it; `heft_la` and `heftla` are
    /// accepted for `heft-la`).
    fn from_str(s: &str) -> Result<Self, Error> {
        let wanted = s.trim().to_ascii_lowercase();
        if wanted == "heft_la" || wanted == "heftla" {
            return Ok(Policy::HeftLa);
        }
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
                Error::invalid(format!(
                    "unknown scheduling policy {s:?}: use one of {}",
                    names.join(", ")
                ))
            })
    }
}

/// Runs [`heft`], [`heft_la`] and [`peft`] and returns the schedule with the smallest
/// makespan, with the policy that made it (ties: that order).
pub fn best(graph: &CostGraph) -> (Policy, Schedule) {
    let mut chosen: Option<(Policy, Schedule)> = None;
    for policy in Policy::BEST_OF {
        let schedule = policy.schedule(graph);
        let better = match &chosen {
            None => true,
            Some((_, s)) => common::clearly_less(schedule.makespan, s.makespan),
        };
        if better {
            chosen = Some((policy, schedule));
        }
    }
    // BEST_OF is not empty, so `chosen` is set; the fallback keeps this panic-free.
    chosen.unwrap_or_else(|| (Policy::Heft, heft(graph)))
}
