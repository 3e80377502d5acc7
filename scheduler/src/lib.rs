//! # xpu-scheduler: task graphs over every device
//!
//! A training framework describes its work as tasks over data; the scheduler decides
//! where and when each task runs, moves the data there, and overlaps computation with
//! the copies. It sits above the HAL the way StarPU, Legion/Realm and Taskflow sit above
//! their devices, and works on any mix of backends.
//!
//! ## Sequential task flow
//!
//! Tasks are submitted in program order ([`Scheduler::submit`]), each naming a
//! [`Codelet`], the [`Handle`]s it touches with how it touches them ([`AccessMode`]:
//! read, write, read-write, commutative reduce) and scalars. The dependencies are
//! inferred from the accesses ([`deps`]: read after write, write after read, write after
//! write; reductions of one handle commute among themselves) plus explicit ones
//! ([`Task::after`]). The result of any run is the result of running the tasks one after
//! another in submission order — for every policy and every mix of devices, which the
//! tests check byte for byte against a sequential run on one host device.
//!
//! ## Deferred execution
//!
//! Submission never waits for execution. A task is placed as soon as it is submitted
//! (`dmda`) or as soon as what it depends on has run (`eager`, `ws`) and enqueued on its
//! device's task stream at once, behind waits for the points on other streams it depends
//! on (module `stream`: with several devices an event follows every task that writes
//! data, so a wait covers exactly that task, and a stream never waits twice for what it
//! already waits for). The device runs it when its inputs are ready. Each device has a
//! second stream for the copies of 64 KiB and more that bring data to it, so transfers
//! overlap computation; smaller copies, whose time is latency, go on the task stream,
//! where they cost no hand-off between threads.
//!
//! ## Data
//!
//! A [`Handle`] is a logical buffer with a home in host memory and at most one replica
//! per device, kept coherent with the MSI protocol (module `data`): a write leaves the
//! writer's replica the only valid copy; a read where the replica is invalid first
//! copies from the cheapest valid one — a peer copy from a device of the same backend
//! that allows it, else through the home. When a device's memory is full, the least
//! recently used replicas there are dropped, a replica holding the only valid copy being
//! written back home first; a task whose data a device cannot hold even then goes to the
//! next candidate device. [`Scheduler::read`] and [`Scheduler::unregister`] bring the
//! latest value home; [`Scheduler::write`] replaces a handle's value in place (its
//! device copies dropped), so that a recorded graph replays on new inputs.
//!
//! ## Codelets and placement
//!
//! A [`Codelet`] has one implementation per kind of device: a kernel in any format the
//! HAL loads (host function, WGSL/SPIR-V, PTX/CUDA C, plugin-native) or a HAL builtin
//! operation, which every backend runs. A task may run on every device that has an
//! implementation and supports the codelet's dtypes, or be pinned to one. Among those
//! the [`Policy`] chooses. `dmda` places a task when it is submitted, on the device with
//! the earliest expected finish (the later of the device's expected free time and the
//! expected finish of its inputs' writers, plus the predicted transfers of the task's
//! inputs and the task's predicted time there). `heft` holds tasks until the next wait
//! and places them together with HEFT. `eager` and `ws`
//! queue ready tasks (tasks whose dependencies have all been dispatched) and give each
//! device a worker thread that takes one whenever its device has fewer than a few tasks
//! in flight: from one central queue (`eager`), or from its own deque, stealing from the
//! most loaded other deque when it is empty (`ws`).
//!
//! ## Standard operations as tasks
//!
//! [`Task::op`] submits one of the HAL's standard operations (matmul, norms,
//! activations, losses, optimizer updates, random numbers: [`xpu_hal::ops`]) over
//! [`TensorRef`]s — views at offsets of handles — with the task's accesses derived from
//! the operation's, on the devices whose capabilities list it ([`op`]).
//!
//! ## Collectives as tasks
//!
//! [`Scheduler::collective`] (and [`Scheduler::all_reduce`]) runs an all-reduce,
//! reduce-scatter or all-gather of an `xpu-collectives` communicator over one handle per
//! rank as a task: it waits for what wrote those handles, tasks that read them after
//! wait for it, and the operation is enqueued on each rank's task stream — so a
//! gradient bucket's all-reduce overlaps the backward computation that follows it on
//! other handles (the DDP pattern).
//!
//! ## Recorded graphs and static placement
//!
//! A training step repeats. [`Scheduler::record`] keeps a sequence of submissions as a
//! [`Graph`] (tasks with merged accesses, their devices, their dependencies inside the
//! graph); [`Scheduler::replay`] submits it again without validation, placement or
//! dependency inference beyond each handle's first access in the graph.
//! [`Scheduler::plan`] places a recorded graph with a list-scheduling policy of [`sim`]
//! (HEFT by default) from the learned task times and copy bandwidths, for replays with
//! that static placement.
//!
//! ## Performance models
//!
//! Task times are measured with device timestamps while a codelet's model learns
//! (every run until [`perfmodel::MIN_SAMPLES`]-plus samples, then now and then), per
//! (codelet, device architecture, footprint), as a history and a size regression
//! `a·n^b + c` ([`perfmodel`]); an uncalibrated codelet is spread to where it has been
//! measured least. Models persist under `XPU_CACHE_DIR/perfmodels`. Copy bandwidths to
//! each device are measured the same way.
//!
//! ## Failures
//!
//! A task that cannot start (bad arguments, no device can run it, out of memory
//! everywhere) is refused by `submit` with the reason. A task that fails on its device is
//! reported once, by the next wait. Failures follow the data: a task that reads what a
//! failed task wrote fails with `Aborted` naming it; every other task runs, also those
//! the device's stream skipped behind the failure, which are dispatched again. A device
//! that is lost is dropped from placement and what it had not finished runs elsewhere;
//! data whose only copy was on it is gone until overwritten, and tasks that need it fail
//! naming the handle (`runtime::recovery`).
//!
//! ## Observability
//!
//! [`Scheduler::stats`] counts tasks per device, copies, bytes moved and evictions.
//! Profiling ([`Scheduler::start_profiling`], or `XPU_PROFILE=FILE`) times every task and
//! copy with device timestamps and writes a Chrome/Perfetto trace — one track per device
//! stream, flow arrows for dependencies, a counter of replica memory — with a per-device
//! summary of busy time, idle time and bytes moved ([`profile`]).
//!
//! ## Planning without devices
//!
//! [`sim`] schedules a task graph with given costs on given processors, executing
//! nothing, with HEFT and the other list-scheduling policies: `xpu sched simulate`.
//!
//! ## Not yet
//!
//! A collective task on a stream that failed is not run again: it fails.

pub mod codelet;
mod data;
pub mod deps;
pub mod op;
pub mod perfmodel;
pub mod policy;
pub mod profile;
mod runtime;
pub mod sim;
mod stream;
mod task;

pub use codelet::{Builtin, Codelet, CodeletBuilder, Implementation};
pub use data::Handle;
pub use deps::AccessMode;
pub use op::{OpSlot, TensorRef};
pub use policy::{Candidate, Policy};
pub use profile::Profile;
pub use runtime::{CollectiveTask, Graph, SchedStats, Scheduler, SchedulerOptions};
pub use stream::Point;
pub use task::{Task, TaskId};
