//! [`SimStream`]: an in-order queue of work, run by a thread of its own.
//!
//! Every operation becomes a job on the stream's queue; the worker thread pops jobs in
//! order and runs them. A job that moves data or computes takes at least the simulated
//! time ([`SimConfig::copy_time`], or the latency for computations): the worker does
//! the work and then sleeps for whatever is left of that time, so a slow simulated
//! device is slow in wall-clock time too, which is what a scheduler or a collective
//! sees.
//!
//! Failures follow the HAL's rules. A failing job (a kernel trap, a panic, a waited-on
//! event whose work failed, an external event reporting failure) sets the stream's
//! error; until `synchronize` or `query` reports it, later work is skipped and events
//! complete with an `Aborted` error naming the cause. After the report the stream
//! runs work again. Dropping the stream lets the queued work finish first.
//!
//! A lost device ([`Health`]) fails the operations that reach the worker with
//! `DeviceLost`. After an injected loss more is true: every later call fails with
//! `DeviceLost`, queued work fails with it instead of running (the first such job
//! becomes the stream's error, events complete with `DeviceLost`), and reporting the
//! error does not make the stream usable again.
//!
//! A straggler ([`Health::slow`]) makes the worker sleep the injected delay before
//! every job that computes or copies ([`Health::operate`]), on top of its simulated
//! time; enqueueing does not wait, and results do not change.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xpu_plugin_sdk::{
    BufferRange, Builtin, Error, ErrorCode, ExternalWait, Handle, HostDestination, HostSource,
    KernelArg, LaunchDims, Op, Result, Scalar, Stream,
};

use crate::arena::Buffer;
use crate::bytecode::{self, Frame, Kernel, Lanes, Use};
use crate::config::SimConfig;
use crate::event::{Mark, SimEvent};
use crate::health::Health;
use crate::ops::{self, view, view_mut};
use crate::SimNpu;

type Work = Box<dyn FnOnce() -> Result<()> + Send>;

/// One unit of stream work.
enum Job {
    /// Work taking at least `cost`.
    Run { cost: Duration, work: Work },
    /// An event's point on the timeline.
    Mark(Arc<Mark>),
    /// Hold later work until an event of this plugin completes.
    WaitEvent(Handle<SimEvent>),
    /// Hold later work until an event of another backend completes.
    WaitExternal(ExternalWait),
}

struct State {
    jobs: VecDeque<Job>,
    submitted: u64,
    completed: u64,
    /// The first failure not yet reported; while set, work is skipped.
    error: Option<Error>,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a job is queued or the stream closes.
    work: Condvar,
    /// Signalled when a job completes.
    done: Condvar,
    /// `plugin.simnpu:0 stream 3`, for messages.
    name: String,
    /// The device's health: every job that computes or copies counts as an operation.
    health: Arc<Health>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A stream of the simulated NPU.
pub struct SimStream {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    config: SimConfig,
}

impl SimStream {
    pub(crate) fn new(name: String, config: SimConfig, health: Arc<Health>) -> Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                submitted: 0,
                completed: 0,
                error: None,
                closed: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            name,
            health,
        });
        let for_worker = shared.clone();
        let worker = std::thread::Builder::new()
            .name(shared.name.replace("plugin.", ""))
            .spawn(move || run_worker(&for_worker))
            .map_err(|e| {
                Error::internal(format!(
                    "{}: could not start the stream's thread: {e}",
                    shared.name
                ))
            })?;
        Ok(SimStream {
            shared,
            worker: Some(worker),
            config,
        })
    }

    fn push(&self, job: Job) -> Result<()> {
        self.shared.health.check_call()?;
        let mut s = self.shared.lock();
        if s.closed {
            return Err(Error::internal(format!(
                "{} is being destroyed",
                self.shared.name
            )));
        }
        s.jobs.push_back(job);
        s.submitted += 1;
        self.shared.work.notify_one();
        Ok(())
    }

    /// Enqueues `work`, which takes at least `cost` on the stream's timeline.
    pub(crate) fn run(
        &self,
        cost: Duration,
        work: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        self.push(Job::Run {
            cost,
            work: Box::new(work),
        })
    }
}

impl Drop for SimStream {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
        if let Some(worker) = self.worker.take() {
            // The worker drains the queue, then exits; it catches the panics of jobs, so
            // joining only fails if the worker itself is broken, and then there is
            // nothing left to wait for.
            let _ = worker.join();
        }
    }
}

fn run_worker(shared: &Shared) {
    loop {
        let (job, failed) = {
            let mut s = shared.lock();
            loop {
                if let Some(job) = s.jobs.pop_front() {
                    break (job, s.error.clone());
                }
                if s.closed {
                    return;
                }
                s = shared.work.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        let outcome = execute(shared, job, failed.as_ref());
        let mut s = shared.lock();
        if let Err(e) = outcome {
            s.error.get_or_insert(e);
        }
        s.completed += 1;
        shared.done.notify_all();
    }
}

/// Runs one job; `failed` is the stream's unreported error, which makes work skip.
fn execute(shared: &Shared, job: Job, failed: Option<&Error>) -> Result<()> {
    match job {
        Job::Mark(mark) => {
            // A device lost by an injected fault fails its events with the loss itself.
            let outcome = shared.health.check_call();
            mark.complete(match failed {
                _ if outcome.is_err() => outcome,
                None => Ok(()),
                Some(e) => Err(Error::aborted(format!(
                    "work before this event on {} failed: {e}",
                    shared.name
                ))),
            });
            Ok(())
        }
        // Skipped: the stream's error is reported first.
        _ if failed.is_some() => Ok(()),
        Job::Run { cost, work } => {
            shared.health.operate()?;
            let start = Instant::now();
            let outcome = catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|payload| {
                Err(Error::from_panic(
                    ErrorCode::Aborted,
                    &format!("work on {}", shared.name),
                    &*payload,
                ))
            });
            let left = cost.saturating_sub(start.elapsed());
            if !left.is_zero() {
                std::thread::sleep(left);
            }
            outcome
        }
        // Waits on a device lost by an injected fault fail like the rest of its work (an
        // external event is still handed back through the SDK, which waits for it first).
        Job::WaitEvent(event) => {
            shared.health.check_call()?;
            match event.mark.wait(None) {
                Some(Err(e)) => Err(Error::aborted(format!(
                    "{} waited for an event whose work failed: {e}",
                    shared.name
                ))),
                _ => Ok(()),
            }
        }
        Job::WaitExternal(wait) => {
            shared.health.check_call()?;
            wait.wait()
        }
    }
}

impl Stream<SimNpu> for SimStream {
    fn copy_host_to_device(&self, src: HostSource, dst: BufferRange<Buffer>) -> Result<()> {
        self.run(self.config.copy_time(dst.length), move || {
            // SAFETY: the worker runs this before the copy is reported complete, so the
            // host keeps `src` valid; `dst` is in bounds (SDK) and no other work of this
            // stream runs meanwhile.
            unsafe { view_mut::<u8>(&dst) }.copy_from_slice(unsafe { src.as_slice() });
            Ok(())
        })
    }

    fn copy_device_to_host(
        &self,
        src: BufferRange<Buffer>,
        mut dst: HostDestination,
    ) -> Result<()> {
        self.run(self.config.copy_time(src.length), move || {
            // SAFETY: as for host-to-device copies.
            unsafe { dst.as_mut_slice() }.copy_from_slice(unsafe { view::<u8>(&src) });
            Ok(())
        })
    }

    fn copy_device_to_device(
        &self,
        src: BufferRange<Buffer>,
        dst: BufferRange<Buffer>,
    ) -> Result<()> {
        self.run(self.config.copy_time(src.length), move || {
            // SAFETY: both ranges are in bounds of live buffers of this device, of equal
            // length and disjoint (checked by the SDK).
            unsafe {
                std::ptr::copy(
                    src.buffer.ptr(src.offset),
                    dst.buffer.ptr(dst.offset),
                    src.length as usize,
                )
            };
            Ok(())
        })
    }

    fn builtin(&self, op: Builtin<Buffer>) -> Result<()> {
        self.run(self.config.latency, move || ops::execute(&op))
    }

    fn run_op(&self, op: Op<Buffer>) -> Result<()> {
        // A device lost by an injected fault refuses before looking at the operation.
        self.shared.health.check_call()?;
        let op = crate::std_ops::prepare(op)?;
        self.run(self.config.latency, move || crate::std_ops::execute(&op))
    }

    fn launch(
        &self,
        kernel: &Handle<Kernel>,
        dims: LaunchDims,
        args: Vec<KernelArg<Buffer>>,
    ) -> Result<()> {
        self.shared.health.check_call()?;
        let function = kernel.function.clone();
        check_launch(&function, &args)?;
        let invocations = dims.invocations();
        self.run(self.config.latency, move || {
            let mut frame = Frame {
                buffers: Vec::with_capacity(args.len()),
                scalars: Vec::with_capacity(args.len()),
            };
            for (arg, use_) in args.iter().zip(&function.uses) {
                let (lanes, value) = match arg {
                    KernelArg::Buffer { range: Some(r), .. } if use_.writes() => {
                        // SAFETY: in bounds and 4-byte aligned (checked at launch); a
                        // written argument overlaps no other (checked at launch), so
                        // this one `&mut` view of it is unaliased.
                        let lanes = unsafe { view_mut::<f32>(r) };
                        (Some(Lanes::Write(lanes)), 0.0)
                    }
                    KernelArg::Buffer { range: Some(r), .. } if use_.is_buffer() => {
                        // SAFETY: as above; shared views of read arguments may overlap.
                        let lanes = unsafe { view::<f32>(r) };
                        (Some(Lanes::Read(lanes)), 0.0)
                    }
                    KernelArg::Scalar(Scalar::F32(v)) => (None, *v),
                    _ => (None, 0.0),
                };
                frame.buffers.push(lanes);
                frame.scalars.push(value);
            }
            bytecode::run(&function, invocations, &mut frame)
                .map_err(|e| e.context(format!("kernel `{}`", function.name)))
        })
    }

    fn record_event(&self) -> Result<SimEvent> {
        let mark = Mark::new(self.shared.name.clone());
        self.push(Job::Mark(mark.clone()))?;
        Ok(SimEvent {
            mark,
            health: self.shared.health.clone(),
        })
    }

    fn wait_event(&self, event: &Handle<SimEvent>) -> Result<()> {
        self.push(Job::WaitEvent(event.clone()))
    }

    fn wait_external(&self, event: ExternalWait) -> Result<()> {
        self.push(Job::WaitExternal(event))
    }

    fn synchronize(&self) -> Result<()> {
        let mut s = self.shared.lock();
        let target = s.submitted;
        while s.completed < target {
            s = self.shared.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        // The work has stopped either way; a device lost by an injected fault stays
        // lost after its error was reported.
        match s.error.take() {
            Some(e) => Err(e),
            None => self.shared.health.check_call(),
        }
    }

    fn query(&self) -> Result<bool> {
        let mut s = self.shared.lock();
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        self.shared.health.check_call()?;
        Ok(s.completed >= s.submitted)
    }
}

/// Checks a launch's arguments against the function: count, kinds, access, scalar
/// dtypes, alignment, and no written buffer overlapping another argument.
fn check_launch(f: &bytecode::Function, args: &[KernelArg<Buffer>]) -> Result<()> {
    let name = &f.name;
    if args.len() != usize::from(f.params) {
        return Err(Error::invalid_argument(format!(
            "kernel `{name}` takes {} arguments; the launch passed {}",
            f.params,
            args.len()
        )));
    }
    for (i, (arg, use_)) in args.iter().zip(&f.uses).enumerate() {
        match arg {
            KernelArg::Buffer { range, access } => {
                if *use_ == Use::Scalar {
                    return Err(Error::invalid_argument(format!(
                        "kernel `{name}` reads argument {i} as an f32 scalar, but a buffer was passed"
                    )));
                }
                if !use_.allowed_by(*access) {
                    return Err(Error::invalid_argument(format!(
                        "kernel `{name}` {} argument {i}, but it was passed as {access:?}",
                        match use_ {
                            Use::Read => "loads from",
                            Use::Write => "stores to",
                            _ => "loads from and stores to",
                        }
                    )));
                }
                if let Some(r) = range {
                    if r.offset % 4 != 0 {
                        return Err(Error::invalid_argument(format!(
                            "kernel `{name}`: buffer argument {i} starts at offset {}, which is not aligned to f32 elements",
                            r.offset
                        )));
                    }
                }
            }
            KernelArg::Scalar(s) => {
                if use_.is_buffer() {
                    return Err(Error::invalid_argument(format!(
                        "kernel `{name}` uses argument {i} as a buffer, but a scalar was passed"
                    )));
                }
                if *use_ == Use::Scalar && !matches!(s, Scalar::F32(_)) {
                    return Err(Error::invalid_argument(format!(
                        "kernel `{name}` reads argument {i} as an f32 scalar, but {s:?} was passed"
                    )));
                }
            }
        }
    }
    let ranges: Vec<(usize, &BufferRange<Buffer>, bool)> = args
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            KernelArg::Buffer {
                range: Some(r),
                access,
            } => Some((i, r, access.writes())),
            _ => None,
        })
        .collect();
    for (n, (i, a, a_writes)) in ranges.iter().enumerate() {
        for (j, b, b_writes) in &ranges[n + 1..] {
            if (*a_writes || *b_writes) && a.overlaps(b) {
                return Err(Error::invalid_argument(format!(
                    "kernel `{name}`: buffer arguments {i} and {j} overlap and one of them is written"
                )));
            }
        }
    }
    Ok(())
}

impl Use {
    /// Whether the function stores to the argument.
    fn writes(self) -> bool {
        matches!(self, Use::Write | Use::ReadWrite)
    }
}
