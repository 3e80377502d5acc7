//! [`HostStream`]: a HAL stream executed by one worker thread.

use std::sync::Arc;
use std::time::Duration;

use xpu_hal::backend::{BatchOp, BuiltinOp, EventImpl, FaultState, StreamImpl};
use xpu_hal::ops::{Op, RawTensor};
use xpu_hal::{
    Error, HostArg, HostKernelContext, HostSlice, KeptBatch, KernelDesc, KernelImpl, LaunchDims,
    RawAllocation, RawKernelArg, RawSlice, Result,
};

use crate::event::HostEvent;
use crate::kernel::HostKernel;
use crate::memory::Region;
use crate::ops;
use crate::queue::{Cost, Job, Queue};
use crate::std_ops::{self, OpThreads};

/// An in-order queue of work on a virtual host device, run by its own worker thread.
///
/// Its [`StreamImpl`] methods can be called directly by code that knows it has a host
/// device (the benchmarks do, to measure what the HAL's validation and dynamic
/// dispatch add); they assume the HAL's guarantees listed on [`StreamImpl`].
pub struct HostStream {
    queue: Queue,
    threads: Arc<OpThreads>,
}

impl HostStream {
    pub(crate) fn new(
        device: String,
        name: String,
        threads: Arc<OpThreads>,
        faults: Arc<FaultState>,
    ) -> Result<Self> {
        Ok(HostStream {
            queue: Queue::start(device, name, faults)?,
            threads,
        })
    }

    /// Queues `f`, one operation of the device's own work.
    fn work(&self, f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        self.work_of(1, f)
    }

    /// Queues `f`, `ops` operations of the device's own work.
    fn work_of(&self, ops: u64, f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        self.push(
            Cost {
                ops,
                stretches: true,
            },
            f,
        )
    }

    /// Queues `f`, which costs `cost`.
    fn push(&self, cost: Cost, f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        self.queue.push(Job::Work(Box::new(f), cost)).map(|_| ())
    }

    /// Records an event and returns it as the concrete host type.
    pub fn record(&self) -> Result<Arc<HostEvent>> {
        self.queue.record()
    }

    /// Queues a wait for other work: one operation, not stretched by a throttle.
    fn wait_until(&self, what: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        self.push(
            Cost {
                ops: 1,
                stretches: false,
            },
            what,
        )
    }
}

fn host_range(slice: &HostSlice) -> *mut u8 {
    // The HAL checked offset + len <= the buffer's length.
    slice.memory.as_ptr().wrapping_add(slice.offset)
}

/// `kernel` as the host kernel it is (the HAL hands a backend only its own kernels).
fn host_kernel(kernel: &Arc<dyn KernelImpl>) -> Result<&HostKernel> {
    kernel.as_any().downcast_ref::<HostKernel>().ok_or_else(|| {
        Error::backend_message(
            "host",
            "internal error: a kernel of another backend reached the host backend",
        )
    })
}

/// Calls `kernel` with `args` (on the stream's worker, in order); the arguments' memory
/// is looked up here, off the submitting thread.
fn run_kernel(kernel: &HostKernel, dims: LaunchDims, args: &[RawKernelArg]) -> Result<()> {
    let mut host_args = Vec::with_capacity(args.len());
    for arg in args {
        host_args.push(match arg {
            RawKernelArg::Scalar(s) => HostArg::Scalar(*s),
            RawKernelArg::Buffer(Some(slice), access) => {
                let region = Region::from_raw(slice)?;
                if access.writes() {
                    // SAFETY: `args` holds the memory for the whole call, so the bytes
                    // outlive the kernel; the HAL guarantees a writable buffer overlaps
                    // no other argument, so this is the only reference to them.
                    HostArg::Write(unsafe { region.bytes_mut() })
                } else {
                    // SAFETY: as above; read-only arguments may share bytes with each
                    // other, which shared slices allow.
                    HostArg::Read(unsafe { region.bytes() })
                }
            }
            RawKernelArg::Buffer(None, access) if access.writes() => HostArg::Write(&mut []),
            RawKernelArg::Buffer(None, _) => HostArg::Read(&[]),
        });
    }
    let mut ctx = HostKernelContext {
        dims,
        args: host_args,
    };
    (kernel.function())(&mut ctx)
        .map_err(|msg| Error::aborted(format!("host kernel `{}` failed: {msg}", kernel.name())))
}

/// Runs one operation of a batch (on the stream's worker, in order), standard
/// operations on the device's `threads`.
fn run_op(op: &BatchOp, threads: &OpThreads) -> Result<()> {
    match op {
        BatchOp::Builtin(op) => ops::execute(op),
        BatchOp::Launch { kernel, dims, args } => {
            run_kernel(host_kernel(kernel.backend_kernel())?, *dims, args)
        }
        BatchOp::Op(op) => std_ops::execute(op, threads),
    }
}

impl StreamImpl for HostStream {
    fn copy_host_to_device(&self, src: HostSlice, dst: RawSlice) -> Result<()> {
        let dst = Region::from_raw(&dst)?;
        self.work(move || {
            // SAFETY: both ranges are in bounds (checked by the HAL) of memory held alive
            // by `src` and `dst`; host memory and device memory never overlap; the user
            // cannot touch the host buffer while this job holds it.
            unsafe { std::ptr::copy_nonoverlapping(host_range(&src), dst.ptr(), dst.len()) };
            drop(src);
            Ok(())
        })
    }

    fn copy_device_to_host(&self, src: RawSlice, dst: HostSlice) -> Result<()> {
        let src = Region::from_raw(&src)?;
        self.work(move || {
            // SAFETY: as in `copy_host_to_device`, with the roles swapped.
            unsafe { std::ptr::copy_nonoverlapping(src.ptr(), host_range(&dst), src.len()) };
            drop(dst);
            Ok(())
        })
    }

    fn copy_device_to_device(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        let (src, dst) = (Region::from_raw(&src)?, Region::from_raw(&dst)?);
        self.work(move || {
            // SAFETY: in bounds of live allocations; the HAL guarantees the ranges are
            // disjoint and of equal length.
            unsafe { std::ptr::copy_nonoverlapping(src.ptr(), dst.ptr(), dst.len()) };
            Ok(())
        })
    }

    fn copy_peer(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        // Every host device's memory is this process's memory: a peer copy is a copy.
        self.copy_device_to_device(src, dst)
    }

    fn builtin(&self, op: BuiltinOp) -> Result<()> {
        self.work(move || ops::execute(&op))
    }

    fn run_op(&self, op: Op<RawTensor>) -> Result<()> {
        let threads = self.threads.clone();
        self.work(move || std_ops::execute(&op, &threads))
    }

    fn launch(
        &self,
        kernel: &Arc<dyn KernelImpl>,
        desc: &KernelDesc,
        dims: LaunchDims,
        args: Vec<RawKernelArg>,
    ) -> Result<()> {
        let _ = desc;
        let kernel = host_kernel(kernel)?.clone();
        // A host function may wait for other ranks: not stretched by a throttle.
        let cost = Cost {
            ops: 1,
            stretches: false,
        };
        self.push(cost, move || run_kernel(&kernel, dims, &args))
    }

    fn batch(&self, ops: Vec<BatchOp>) -> Result<()> {
        // One job for all of them: each runs in turn, and the first failure ends the
        // job, as it would make the stream skip the jobs after it.
        let threads = self.threads.clone();
        self.work_of(ops.len() as u64, move || {
            ops.iter().try_for_each(|op| run_op(op, &threads))
        })
    }

    fn batch_kept(
        &self,
        kept: &KeptBatch,
        memory: Vec<Option<Arc<dyn RawAllocation>>>,
    ) -> Result<()> {
        // Bound on the worker as it runs them: the submitting thread only queues the job.
        let kept = kept.clone();
        let threads = self.threads.clone();
        self.work_of(kept.len() as u64, move || {
            kept.bound(&memory)
                .try_for_each(|op| run_op(&op?, &threads))
        })
    }

    fn record_event(&self) -> Result<Arc<dyn EventImpl>> {
        Ok(self.record()?)
    }

    fn wait_event(&self, event: &Arc<dyn EventImpl>) -> Result<()> {
        if event.as_any().downcast_ref::<HostEvent>().is_none() {
            return Err(Error::backend_message(
                "host",
                "internal error: an event of another backend reached the host backend",
            ));
        }
        let event = event.clone();
        self.wait_until(move || event.wait(None))
    }

    fn wait_foreign_event(&self, event: xpu_hal::ForeignEvent) -> Result<()> {
        self.wait_until(move || event.wait())
    }

    fn synchronize(&self) -> Result<()> {
        let target = self.queue.timeline().submitted();
        self.queue.timeline().drive(target);
        self.queue.timeline().take_error()
    }

    fn query(&self) -> Result<bool> {
        let done = self.queue.timeline().completed() >= self.queue.timeline().submitted();
        self.queue.timeline().take_error()?;
        Ok(done)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl HostStream {
    /// Blocks until all work is done, giving up after `timeout`.
    pub fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        let target = self.queue.timeline().submitted();
        if !self.queue.timeline().wait_for(target, Some(timeout)) {
            return Err(Error::Timeout {
                message: format!(
                    "a stream of {} did not finish within {timeout:?}",
                    self.queue.timeline().device
                ),
            });
        }
        self.queue.timeline().take_error()
    }
}
