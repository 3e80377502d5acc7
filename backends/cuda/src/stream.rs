//! [`CudaStream`]: an in-order queue on a non-blocking `CUstream`.
//!
//! # Checkpoints and completion
//! Operations go straight to the `CUstream`; what they hold (buffers, staging leases,
//! events waited for) collects in the stream's pending list. A *checkpoint* records a
//! `CUevent` at the end of the stream and hands the event, the pending list and the xpu
//! events to complete to the stream's completion thread, which synchronises the event,
//! collects errors, completes the xpu events, releases what the work held and advances
//! the completed position. Checkpoints are taken by `record_event`, `synchronize`,
//! `query`, and after [`CHECKPOINT_LIMIT`] operations (so held resources are released
//! in bounded time).
//!
//! # Host steps
//! Host work that must happen in stream order (filling a staging buffer from a
//! `HostBuffer` that earlier work may still write, draining a staging buffer into a
//! `HostBuffer`) is a `cuLaunchHostFunc` callback that runs one [`HostCopy`]: a memcpy
//! between raw addresses. A callback owns nothing but those addresses — the staging
//! lease and the `HostBuffer`'s memory stay in the pending list like every other held
//! resource — so nothing it drops can call the driver (CUDA forbids driver calls in a
//! callback; the last reference to a pinned buffer, say, unregisters it). Callbacks
//! never block, so the driver's callback thread is never held up.
//!
//! An operation made of several steps (a device copy into staging and the host copy
//! out of it) is issued under one hold of the submission lock, and what it holds joins
//! the pending list only after its last step: a checkpoint can never fall between the
//! steps and release the staging buffer while a later step still reads it.
//!
//! # Waiting for another backend's event
//! A wait for a foreign event must not start later work before `Event::wait` would
//! return, but it must not block inside a host callback either: the driver runs the
//! callbacks of a context on one thread, so a callback blocked on a foreign event that
//! itself depends on other CUDA work (a host stream waiting on a CUDA event whose
//! completion needs another callback) would deadlock. Nor may it block the enqueuing
//! thread, which may be the very thread that lets the foreign event complete later
//! (it opens a gate a host kernel waits on, say). So the wait happens on the device:
//!
//! - Each stream that waits for a foreign event gets a pinned, device-mapped host word
//!   (`cuMemHostAlloc` with `DEVICEMAP`) and a helper thread. Every wait takes the next
//!   *ticket* `n` of the stream and enqueues a device-side wait for `word >= n` (a
//!   cyclic 32-bit comparison); the event goes to the helper thread, which waits for
//!   the stream's foreign events one after another, in order, and after each stores its
//!   ticket into the word. The word therefore only ever moves forward, and reaching `n`
//!   means every wait up to `n` is satisfied. The word is held by the pending list like
//!   any resource, so it lives until the device has passed the wait.
//! - The device-side wait is `cuStreamWaitValue32(word >= n)` where the device reports
//!   `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR` and the driver exports
//!   `cuStreamWaitValue32_v2`; elsewhere it is a one-thread kernel (hand-written PTX,
//!   see `builtins::flag_wait_kernel`) that spins on the word with volatile loads. The
//!   spinning kernel occupies one block slot of the GPU while it waits.
//!
//! A failed foreign event is recorded with its ticket, and the completion
//! thread reports it at the first checkpoint after the wait, exactly where a failing
//! operation in the stream would be reported.

use std::any::Any;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, SendError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::sys::{self, CUdeviceptr, CUevent, CUstream};
use xpu_hal::backend::{BuiltinOp, EventImpl, StreamImpl, StreamProgress};
use xpu_hal::{
    downcast_raw, Error, ForeignEvent, HostSlice, KernelDesc, KernelImpl, LaunchDims, RawKernelArg,
    RawSlice, Result,
};

use crate::device::{lock, DeviceShared};
use crate::driver::{cu, panic_message};
use crate::event::{CudaEvent, Mark};
use crate::memory::{CudaBuffer, StagingPool};
use crate::NAME;

/// Operations enqueued before a checkpoint is taken without being asked.
pub const CHECKPOINT_LIMIT: u32 = 256;

/// Something enqueued work keeps alive until it completes.
pub(crate) type Held = Arc<dyn Any + Send + Sync>;

/// A memcpy the host runs in stream order, from a `cuLaunchHostFunc` callback. Plain
/// addresses only (it is `Copy`, so it owns nothing whose drop could call CUDA); the
/// memory behind them is held by the operation's pending list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostCopy {
    /// The first byte read.
    pub(crate) from: usize,
    /// The first byte written.
    pub(crate) to: usize,
    /// Bytes copied.
    pub(crate) len: usize,
}

/// One step of an operation (see [`StreamShared::enqueue_steps`]).
pub(crate) enum Step<'a> {
    /// Device work issued on the `CUstream` (the context is current).
    Device(Box<dyn FnOnce(CUstream) -> Result<()> + 'a>),
    /// A host copy run in stream order.
    Host(HostCopy),
}

/// A `CUevent`, destroyed on drop (an error then is recorded on the device).
pub(crate) struct CuEvent {
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) event: CUevent,
}

// SAFETY: CUDA events may be used from any thread.
unsafe impl Send for CuEvent {}
// SAFETY: as above.
unsafe impl Sync for CuEvent {}

impl CuEvent {
    fn new(dev: &Arc<DeviceShared>, timing: bool) -> Result<Self> {
        let mut flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        if !timing {
            flags |= sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        }
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: context current (callers bind first); valid out-pointer.
        cu(&dev.name, "creating an event", "cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut event, flags)
        })?;
        Ok(CuEvent {
            dev: dev.clone(),
            event,
        })
    }
}

impl Drop for CuEvent {
    fn drop(&mut self) {
        let e = self.event;
        // SAFETY: our event, destroyed once; the driver defers the release if the
        // event is still pending.
        self.dev
            .release("destroying an event", "cuEventDestroy_v2", || unsafe {
                sys::cuEventDestroy_v2(e)
            });
    }
}

struct Checkpoint {
    pos: u64,
    event: Arc<CuEvent>,
    held: Vec<Held>,
    marks: Vec<Arc<Mark>>,
    waited: Vec<CudaEvent>,
    /// The last foreign-wait ticket enqueued before the checkpoint.
    foreign_upto: u64,
}

struct SubmitState {
    pos: u64,
    held: Vec<Held>,
    waited: Vec<CudaEvent>,
    /// Operations since the last checkpoint.
    ops: u32,
    tx: Option<Sender<Checkpoint>>,
    /// The last foreign-wait ticket handed out (0: none yet).
    foreign_ticket: u64,
    /// The device-side foreign-wait bridge, started by the first such wait.
    foreign: Option<ForeignWaiter>,
}

/// A pinned, device-mapped host word that a stream waits on (`cuStreamWaitValue32`)
/// and a helper thread writes. Freed (`cuMemFreeHost`) by whoever drops it last, never
/// inside a callback.
pub(crate) struct FlagWord {
    dev: Arc<DeviceShared>,
    host: *mut u32,
    device: CUdeviceptr,
}

// SAFETY: the word is plain pinned host memory owned by this value; the host only
// touches it atomically (`set`), and the device only reads it.
unsafe impl Send for FlagWord {}
// SAFETY: as above.
unsafe impl Sync for FlagWord {}

impl FlagWord {
    fn new(dev: &Arc<DeviceShared>) -> Result<Self> {
        dev.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        let size = std::mem::size_of::<u32>();
        cu(
            &dev.name,
            "allocating the word for waits on other backends' events",
            "cuMemHostAlloc",
            // SAFETY: context current; valid out-pointer.
            || unsafe { sys::cuMemHostAlloc(&mut p, size, flags) },
        )?;
        // From here on, dropping `word` frees the memory.
        let mut word = FlagWord {
            dev: dev.clone(),
            host: p.cast::<u32>(),
            device: 0,
        };
        word.set(0);
        let mut device: CUdeviceptr = 0;
        cu(
            &dev.name,
            "mapping the word for waits on other backends' events",
            "cuMemHostGetDevicePointer_v2",
            // SAFETY: `p` is pinned memory from cuMemHostAlloc with DEVICEMAP; valid
            // out-pointer; flags must be 0.
            || unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, p, 0) },
        )?;
        word.device = device;
        Ok(word)
    }

    /// Stores `value` for the device to see.
    fn set(&self, value: u32) {
        // SAFETY: `host` is a live, page-aligned (so 4-aligned) word of pinned memory
        // for the lifetime of `self`, which the host only accesses through atomics.
        let word = unsafe { AtomicU32::from_ptr(self.host) };
        word.store(value, Ordering::Release);
    }
}

impl Drop for FlagWord {
    fn drop(&mut self) {
        let p = self.host.cast::<c_void>();
        // SAFETY: from cuMemHostAlloc, freed once; the device no longer reads it (every
        // wait on it is behind a checkpoint that holds this word until the device has
        // passed it) and the helper thread has stopped writing it.
        self.dev.release(
            "freeing the word for waits on other backends' events",
            "cuMemFreeHost",
            || unsafe { sys::cuMemFreeHost(p) },
        );
    }
}

/// The device-side foreign-wait bridge of one stream: its word and the channel to its
/// helper thread. Dropping it lets the thread finish the waits queued and exit.
struct ForeignWaiter {
    flag: Arc<FlagWord>,
    tx: Sender<(u64, ForeignEvent)>,
}

/// Failures of foreign events, by ticket, until the completion thread reports them.
#[derive(Default)]
struct ForeignErrors(Mutex<Vec<(u64, Error)>>);

impl ForeignErrors {
    fn push(&self, ticket: u64, e: Error) {
        lock(&self.0).push((ticket, e));
    }

    /// The failures of tickets up to `upto`, removed.
    fn take_upto(&self, upto: u64) -> Vec<Error> {
        let mut all = lock(&self.0);
        let (due, later): (Vec<_>, Vec<_>) = all.drain(..).partition(|(t, _)| *t <= upto);
        *all = later;
        due.into_iter().map(|(_, e)| e).collect()
    }
}

/// Waits for a foreign event; a failure (or a panic) is recorded with `ticket`.
fn wait_foreign(event: &ForeignEvent, ticket: u64, errors: &ForeignErrors) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| event.wait()));
    let failure = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => Error::aborted(format!("an event this stream waited for failed: {e}")),
        Err(p) => Error::aborted(format!(
            "waiting for another backend's event panicked: {}",
            panic_message(&*p)
        )),
    };
    errors.push(ticket, failure);
}

/// The helper thread of a [`ForeignWaiter`]: waits for the events in ticket order and
/// publishes each ticket once its event is done (or failed).
fn run_foreign_waits(
    flag: Arc<FlagWord>,
    errors: Arc<ForeignErrors>,
    rx: Receiver<(u64, ForeignEvent)>,
) {
    for (ticket, event) in rx {
        wait_foreign(&event, ticket, &errors);
        drop(event);
        // Cyclic 32-bit comparison on the device: the truncation is intended.
        flag.set(ticket as u32);
    }
}

/// What a stream, its events and its completion thread share.
pub(crate) struct StreamShared {
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) stream: CUstream,
    submit: Mutex<SubmitState>,
    pub(crate) progress: StreamProgress,
    foreign_errors: Arc<ForeignErrors>,
}

// SAFETY: a CUstream may be used from any thread (the driver API is thread-safe); the
// mutable state is behind mutexes.
unsafe impl Send for StreamShared {}
// SAFETY: as above.
unsafe impl Sync for StreamShared {}

/// The `cuLaunchHostFunc` callback: runs one [`HostCopy`].
///
/// # Safety
/// `data` must come from `Box::into_raw` of a `Box<HostCopy>` and be passed once; its
/// ranges must be valid, disjoint and held until the callback has run.
unsafe extern "C" fn run_host_copy(data: *mut c_void) {
    // SAFETY: the caller's contract: `data` is a leaked Box<HostCopy>, passed once.
    let copy = *unsafe { Box::from_raw(data.cast::<HostCopy>()) };
    // SAFETY: the caller's contract: both ranges are valid for `len` bytes, disjoint,
    // and their memory is held by the stream until this step has run.
    unsafe { std::ptr::copy_nonoverlapping(copy.from as *const u8, copy.to as *mut u8, copy.len) };
}

impl StreamShared {
    /// Waits until the completion thread has passed `pos`; `false` on timeout.
    pub(crate) fn wait_pos(&self, pos: u64, timeout: Option<Duration>) -> bool {
        self.progress.wait(pos, timeout)
    }

    pub(crate) fn completed(&self) -> u64 {
        self.progress.completed()
    }

    fn set_error(&self, e: Error) {
        self.progress.set_error(e);
    }

    fn take_error(&self) -> Result<()> {
        let stream_error = self.progress.take_error();
        match stream_error.or_else(|| self.dev.take_error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Enqueues one operation: `f` issues it on the `CUstream` (with the context
    /// current and the submission lock held); `held` is kept until it completes.
    pub(crate) fn enqueue(
        &self,
        held: Vec<Held>,
        f: impl FnOnce(CUstream) -> Result<()>,
    ) -> Result<()> {
        self.enqueue_steps(held, vec![Step::Device(Box::new(f))])
    }

    /// Enqueues an operation of several steps, in order, under one hold of the
    /// submission lock; `held` joins the pending list after the last step issued, so
    /// the checkpoint that releases it comes after every step that uses it. A failure
    /// stops at the failing step; what was issued before it stays held.
    pub(crate) fn enqueue_steps(&self, held: Vec<Held>, steps: Vec<Step<'_>>) -> Result<()> {
        let mut st = lock(&self.submit);
        self.dev.bind()?;
        let mut issued = 0u32;
        let mut outcome = Ok(());
        for step in steps {
            let r = match step {
                Step::Device(f) => f(self.stream),
                Step::Host(copy) => self.launch_host_copy(copy),
            };
            if let Err(e) = r {
                outcome = Err(e);
                break;
            }
            issued += 1;
        }
        if issued == 0 {
            return outcome;
        }
        st.held.extend(held);
        st.ops += issued;
        if st.ops >= CHECKPOINT_LIMIT {
            self.checkpoint(&mut st, None)?;
        }
        outcome
    }

    /// Accounts work that other code issued straight on the `CUstream` (NCCL): the next
    /// checkpoint covers it, and `held` is kept until it completes.
    pub(crate) fn issued_outside(&self, held: Vec<Held>) -> Result<()> {
        let mut st = lock(&self.submit);
        st.held.extend(held);
        st.ops += 1;
        if st.ops >= CHECKPOINT_LIMIT {
            self.checkpoint(&mut st, None)?;
        }
        Ok(())
    }

    /// Enqueues `copy` as a host callback. The caller holds the submission lock and
    /// has bound the context.
    fn launch_host_copy(&self, copy: HostCopy) -> Result<()> {
        let data = Box::into_raw(Box::new(copy)).cast::<c_void>();
        let stream = self.stream;
        // SAFETY: the callback takes ownership of `data` when it runs; it calls no CUDA
        // function and owns nothing but plain addresses, whose memory the operation
        // holds in the pending list until a checkpoint after this step.
        let r = cu(
            &self.dev.name,
            "enqueueing a host step",
            "cuLaunchHostFunc",
            || unsafe { sys::cuLaunchHostFunc(stream, Some(run_host_copy), data) },
        );
        if r.is_err() {
            // SAFETY: the launch failed, so the callback will never run: the Box is
            // still ours, reclaimed once here.
            drop(unsafe { Box::from_raw(data.cast::<HostCopy>()) });
        }
        r
    }

    /// Records a checkpoint at the current end of the stream; returns its position and
    /// event. `mark` is completed with the outcome of the work before it.
    fn checkpoint(
        &self,
        st: &mut SubmitState,
        mark: Option<&Arc<Mark>>,
    ) -> Result<(u64, Arc<CuEvent>)> {
        self.dev.bind()?;
        let event = Arc::new(CuEvent::new(&self.dev, mark.is_some())?);
        let (e, s) = (event.event, self.stream);
        cu(
            &self.dev.name,
            "recording an event",
            "cuEventRecord",
            // SAFETY: our event and stream, both live.
            || unsafe { sys::cuEventRecord(e, s) },
        )?;
        st.pos += 1;
        st.ops = 0;
        let item = Checkpoint {
            pos: st.pos,
            event: event.clone(),
            held: std::mem::take(&mut st.held),
            marks: mark.into_iter().cloned().collect(),
            waited: std::mem::take(&mut st.waited),
            foreign_upto: st.foreign_ticket,
        };
        match &st.tx {
            Some(tx) => tx.send(item).map_err(|_| Error::DeviceLost {
                device: self.dev.name.clone(),
                message: "the stream's completion thread has stopped".to_string(),
            })?,
            None => {
                return Err(Error::DeviceLost {
                    device: self.dev.name.clone(),
                    message: "the stream has been shut down".to_string(),
                })
            }
        }
        Ok((st.pos, event))
    }

    /// A checkpoint if anything was enqueued since the last one; the position to wait
    /// for either way.
    fn flush(&self) -> Result<u64> {
        let mut st = lock(&self.submit);
        if st.ops == 0 && st.held.is_empty() && st.waited.is_empty() {
            return Ok(st.pos);
        }
        Ok(self.checkpoint(&mut st, None)?.0)
    }

    /// Starts the device-side foreign-wait bridge of this stream.
    fn start_foreign_waiter(&self) -> Result<ForeignWaiter> {
        let flag = Arc::new(FlagWord::new(&self.dev)?);
        let (tx, rx) = channel();
        let (word, errors) = (flag.clone(), self.foreign_errors.clone());
        std::thread::Builder::new()
            .name(format!("xpu-{}-foreign", self.dev.name))
            .spawn(move || run_foreign_waits(word, errors, rx))
            .map_err(|e| {
                Error::backend_message(
                    NAME,
                    format!(
                        "could not start the thread that waits for other backends' events: {e}"
                    ),
                )
            })?;
        Ok(ForeignWaiter { flag, tx })
    }

    /// Makes the stream wait on the device for a foreign event: `cuStreamWaitValue32` on
    /// the stream's word (or the spin kernel where the device lacks it), which the
    /// helper thread advances once the event is done.
    fn wait_foreign_on_device(&self, event: ForeignEvent) -> Result<()> {
        let mut st = lock(&self.submit);
        let (flag, tx) = match &st.foreign {
            Some(w) => (w.flag.clone(), w.tx.clone()),
            None => {
                let w = self.start_foreign_waiter()?;
                let pair = (w.flag.clone(), w.tx.clone());
                st.foreign = Some(w);
                pair
            }
        };
        let ticket = st.foreign_ticket + 1;
        self.dev.bind()?;
        let (s, addr) = (self.stream, flag.device);
        // The truncation of the ticket is the intended cyclic comparison.
        let value = ticket as u32;
        if self.dev.wait_value {
            let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as c_uint;
            cu(
                &self.dev.name,
                "waiting for another backend's event",
                "cuStreamWaitValue32_v2",
                // SAFETY: our stream; `addr` is the device address of a live pinned
                // word, held below until the device has passed this wait.
                || unsafe { sys::cuStreamWaitValue32_v2(s, addr, value, geq) },
            )?;
        } else {
            let kernel = crate::builtins::flag_wait_kernel(&self.dev)?;
            let function = kernel.function();
            let (mut addr, mut value) = (addr, value);
            let mut params: [*mut c_void; 2] = [
                (&mut addr as *mut CUdeviceptr).cast(),
                (&mut value as *mut u32).cast(),
            ];
            cu(
                &self.dev.name,
                "waiting for another backend's event",
                "cuLaunchKernel",
                // SAFETY: the kernel's signature is (u64, u32), matched by `params`,
                // which outlive the call (the driver copies them); `addr` is the device
                // address of a live pinned word, held below until the kernel has
                // finished; the module lives as long as the device.
                || unsafe {
                    sys::cuLaunchKernel(
                        function,
                        1,
                        1,
                        1,
                        1,
                        1,
                        1,
                        0,
                        s,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                },
            )?;
        }
        st.foreign_ticket = ticket;
        st.held.push(flag.clone());
        st.ops += 1;
        // Sent under the submission lock, so the helper sees tickets in order.
        if let Err(SendError((ticket, event))) = tx.send((ticket, event)) {
            // The helper thread is gone (it never exits while the stream lives, so this
            // is defensive): do its job here rather than leave the stream waiting.
            wait_foreign(&event, ticket, &self.foreign_errors);
            flag.set(ticket as u32);
        }
        Ok(())
    }

    fn run_completion(self: Arc<Self>, rx: Receiver<Checkpoint>) {
        if let Err(e) = self.dev.bind() {
            self.set_error(e);
        }
        for cp in rx {
            let e = cp.event.event;
            if let Err(err) = cu(
                &self.dev.name,
                "waiting for the stream's work",
                "cuEventSynchronize",
                // SAFETY: the event is live (held by `cp`) and was recorded.
                || unsafe { sys::cuEventSynchronize(e) },
            ) {
                self.set_error(err);
            }
            for err in self.foreign_errors.take_upto(cp.foreign_upto) {
                self.set_error(err);
            }
            for w in &cp.waited {
                if let Err(err) = EventImpl::wait(w, None) {
                    self.set_error(Error::aborted(format!(
                        "an event this stream waited for failed: {err}"
                    )));
                }
            }
            // Index checks of standard operations: reported like a failing operation.
            for h in &cp.held {
                if let Some(check) = h.as_ref().downcast_ref::<crate::ops::IndexCheck>() {
                    if let Some(err) = check.failure() {
                        self.set_error(err);
                    }
                }
            }
            let err = self.progress.peek_error();
            for m in &cp.marks {
                m.complete(err.as_ref(), &self.dev.name);
            }
            drop(cp.held);
            drop(cp.waited);
            self.progress.advance(cp.pos);
        }
    }
}

impl Drop for StreamShared {
    fn drop(&mut self) {
        let s = self.stream;
        // SAFETY: the completion thread has finished every checkpoint (it holds an Arc
        // to this value until it exits), so no xpu work is pending on it.
        self.dev
            .release("destroying a stream", "cuStreamDestroy_v2", || unsafe {
                sys::cuStreamDestroy_v2(s)
            });
    }
}

/// A stream on a CUDA device.
pub struct CudaStream {
    pub(crate) shared: Arc<StreamShared>,
}

impl CudaStream {
    pub(crate) fn new(dev: Arc<DeviceShared>) -> Result<Self> {
        dev.bind()?;
        let mut stream: CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        cu(
            &dev.name,
            "creating a stream",
            "cuStreamCreateWithPriority",
            // SAFETY: context current; valid out-pointer; priority 0 is the default.
            || unsafe { sys::cuStreamCreateWithPriority(&mut stream, flags, 0) },
        )?;
        let (tx, rx) = channel();
        let name = format!("xpu-{}-done", dev.name);
        let shared = Arc::new(StreamShared {
            dev,
            stream,
            submit: Mutex::new(SubmitState {
                pos: 0,
                held: Vec::new(),
                waited: Vec::new(),
                ops: 0,
                tx: Some(tx),
                foreign_ticket: 0,
                foreign: None,
            }),
            progress: StreamProgress::new(),
            foreign_errors: Arc::new(ForeignErrors::default()),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run_completion(rx))
            .map_err(|e| {
                Error::backend_message(NAME, format!("could not start a stream thread: {e}"))
            })?;
        Ok(CudaStream { shared })
    }

    /// The raw `CUstream`, for code that mixes xpu with direct CUDA calls
    /// (benchmarks). Work issued on it directly is not tracked by xpu.
    pub fn raw(&self) -> CUstream {
        self.shared.stream
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.submit);
        if st.ops > 0 || !st.held.is_empty() || !st.waited.is_empty() {
            if let Err(e) = self.shared.checkpoint(&mut st, None) {
                self.shared.dev.record_error(e);
            }
        }
        // Closing the channels lets the completion thread and the foreign-wait helper
        // finish what is queued and exit.
        st.tx = None;
        st.foreign = None;
    }
}

/// The device buffer of a validated slice.
pub(crate) fn buffer_of(slice: &RawSlice) -> Result<Arc<CudaBuffer>> {
    downcast_raw::<CudaBuffer>(&slice.memory, NAME)
}

/// Whether no other enqueued operation holds this host memory (the user's buffer and
/// the operation being enqueued hold one share each).
fn host_exclusive(h: &HostSlice) -> bool {
    Arc::strong_count(&h.memory) <= 2
}

impl StreamImpl for CudaStream {
    fn copy_host_to_device(&self, src: HostSlice, dst: RawSlice) -> Result<()> {
        let dst_buf = buffer_of(&dst)?;
        if let Some(pin) = crate::pinned::pinned(&src.memory) {
            let source = src.memory.as_ptr().wrapping_add(src.offset) as usize;
            let (target, len) = (dst_buf.address(dst.offset), src.len);
            let name = self.shared.dev.name.clone();
            return self.shared.enqueue(vec![pin, dst_buf, src.memory], |s| {
                // SAFETY: page-locked host source (registered, in bounds per the HAL)
                // and device destination, valid for `len` bytes and held until the copy
                // completes.
                cu(
                    &name,
                    "copying pinned host memory to the device",
                    "cuMemcpyHtoDAsync_v2",
                    || unsafe {
                        sys::cuMemcpyHtoDAsync_v2(target, source as *const c_void, len, s)
                    },
                )
            });
        }
        let lease = StagingPool::lease(&self.shared.dev, src.len)?;
        let stage = lease.ptr() as usize;
        let len = src.len;
        let from = src.memory.as_ptr().wrapping_add(src.offset) as usize;
        let target = dst_buf.address(dst.offset);
        let name = self.shared.dev.name.clone();
        let copy: Step<'_> = Step::Device(Box::new(move |s| {
            // SAFETY: pinned source and device destination, both valid for `len`
            // bytes and held until the copy completes.
            cu(
                &name,
                "copying host to device",
                "cuMemcpyHtoDAsync_v2",
                || unsafe { sys::cuMemcpyHtoDAsync_v2(target, stage as *const c_void, len, s) },
            )
        }));
        if host_exclusive(&src) {
            // Nothing enqueued can change the host bytes before this copy would read
            // them, so reading them now is reading them in order.
            // SAFETY: the host range is in bounds (HAL); the staging buffer is ours
            // (fresh lease) and at least `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(from as *const u8, stage as *mut u8, len) };
            drop(src);
            return self.shared.enqueue_steps(vec![lease, dst_buf], vec![copy]);
        }
        // Earlier work may still write the host bytes: fill the staging buffer in
        // stream order, then copy. The host memory and the lease are held until both
        // steps have run.
        let fill = Step::Host(HostCopy {
            from,
            to: stage,
            len,
        });
        self.shared
            .enqueue_steps(vec![lease, dst_buf, src.memory], vec![fill, copy])
    }

    fn copy_device_to_host(&self, src: RawSlice, dst: HostSlice) -> Result<()> {
        let src_buf = buffer_of(&src)?;
        if let Some(pin) = crate::pinned::pinned(&dst.memory) {
            let target = dst.memory.as_ptr().wrapping_add(dst.offset) as usize;
            let (source, len) = (src_buf.address(src.offset), dst.len);
            let name = self.shared.dev.name.clone();
            return self.shared.enqueue(vec![pin, src_buf, dst.memory], |s| {
                // SAFETY: device source and page-locked host destination (registered,
                // in bounds per the HAL), valid for `len` bytes and held until the copy
                // completes.
                cu(
                    &name,
                    "copying the device to pinned host memory",
                    "cuMemcpyDtoHAsync_v2",
                    || unsafe { sys::cuMemcpyDtoHAsync_v2(target as *mut c_void, source, len, s) },
                )
            });
        }
        let lease = StagingPool::lease(&self.shared.dev, dst.len)?;
        let stage = lease.ptr() as usize;
        let len = dst.len;
        let source = src_buf.address(src.offset);
        let to = dst.memory.as_ptr().wrapping_add(dst.offset) as usize;
        let name = self.shared.dev.name.clone();
        let copy = Step::Device(Box::new(move |s| {
            // SAFETY: device source and pinned destination, valid for `len` bytes and
            // held until the copy completes.
            cu(
                &name,
                "copying device to host",
                "cuMemcpyDtoHAsync_v2",
                || unsafe { sys::cuMemcpyDtoHAsync_v2(stage as *mut c_void, source, len, s) },
            )
        }));
        // The drain runs after the copy (stream order); the lease and the host memory
        // are held until both have run, so the staging buffer cannot be reused and the
        // host memory cannot be freed (or unpinned) inside the callback.
        let drain = Step::Host(HostCopy {
            from: stage,
            to,
            len,
        });
        self.shared
            .enqueue_steps(vec![lease, src_buf, dst.memory], vec![copy, drain])
    }

    fn copy_device_to_device(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        let (sb, db) = (buffer_of(&src)?, buffer_of(&dst)?);
        let (from, to) = (sb.address(src.offset), db.address(dst.offset));
        let len = usize::try_from(dst.len)
            .map_err(|_| Error::invalid("the copy is larger than the address space"))?;
        let name = self.shared.dev.name.clone();
        self.shared.enqueue(vec![sb, db], |s| {
            // SAFETY: both ranges are in bounds and disjoint (HAL); held until done.
            cu(
                &name,
                "copying device to device",
                "cuMemcpyDtoDAsync_v2",
                || unsafe { sys::cuMemcpyDtoDAsync_v2(to, from, len, s) },
            )
        })
    }

    fn copy_peer(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        let (sb, db) = (buffer_of(&src)?, buffer_of(&dst)?);
        let (from, to) = (sb.address(src.offset), db.address(dst.offset));
        let (src_ctx, dst_ctx) = (sb.dev.context(), db.dev.context());
        let len = usize::try_from(dst.len)
            .map_err(|_| Error::invalid("the copy is larger than the address space"))?;
        let name = self.shared.dev.name.clone();
        self.shared.enqueue(vec![sb, db], |s| {
            // SAFETY: both ranges are in bounds of live allocations of their devices
            // (HAL), both contexts are retained by the buffers' devices, and the buffers
            // are held until the copy completes.
            cu(
                &name,
                "copying from a peer device",
                "cuMemcpyPeerAsync",
                || unsafe { sys::cuMemcpyPeerAsync(to, dst_ctx, from, src_ctx, len, s) },
            )
        })
    }

    fn builtin(&self, op: BuiltinOp) -> Result<()> {
        crate::builtins::dispatch(&self.shared, op)
    }

    fn run_op(&self, op: xpu_hal::ops::Op<xpu_hal::ops::RawTensor>) -> Result<()> {
        crate::ops::dispatch(&self.shared, op)
    }

    fn launch(
        &self,
        kernel: &Arc<dyn KernelImpl>,
        desc: &KernelDesc,
        dims: LaunchDims,
        args: Vec<RawKernelArg>,
    ) -> Result<()> {
        crate::kernel::launch(&self.shared, kernel, desc, dims, args)
    }

    fn record_event(&self) -> Result<Arc<dyn EventImpl>> {
        let mark = Arc::new(Mark::default());
        let (pos, event) = {
            let mut st = lock(&self.shared.submit);
            self.shared.checkpoint(&mut st, Some(&mark))?
        };
        Ok(Arc::new(CudaEvent {
            stream: self.shared.clone(),
            pos,
            mark,
            event,
        }))
    }

    fn wait_event(&self, event: &Arc<dyn EventImpl>) -> Result<()> {
        let Some(e) = event.as_any().downcast_ref::<CudaEvent>() else {
            return Err(Error::backend_message(
                NAME,
                "internal error: an event of another backend reached the CUDA backend",
            ));
        };
        let mut st = lock(&self.shared.submit);
        self.shared.dev.bind()?;
        let (s, ev) = (self.shared.stream, e.event.event);
        cu(
            &self.shared.dev.name,
            "waiting for an event",
            "cuStreamWaitEvent",
            // SAFETY: our stream and a live event (held below until our next checkpoint);
            // the event may belong to another device's context, which CUDA allows.
            || unsafe { sys::cuStreamWaitEvent(s, ev, 0) },
        )?;
        st.waited.push(e.clone());
        st.ops += 1;
        Ok(())
    }

    fn wait_foreign_event(&self, event: ForeignEvent) -> Result<()> {
        self.shared.wait_foreign_on_device(event)
    }

    fn synchronize(&self) -> Result<()> {
        let pos = self.shared.flush()?;
        self.shared.wait_pos(pos, None);
        self.shared.take_error()
    }

    fn query(&self) -> Result<bool> {
        let pos = self.shared.flush()?;
        let done = self.shared.completed() >= pos;
        self.shared.take_error()?;
        Ok(done)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host step's payload is `Copy`, so it can own nothing whose drop calls CUDA
    /// inside the driver's callback (a staging lease, a pinned buffer's last reference);
    /// this stops compiling if it ever could.
    #[test]
    fn host_steps_own_nothing() {
        fn plain<T: Copy + Send + 'static>(_: &T) {}
        let copy = HostCopy {
            from: 0,
            to: 0,
            len: 0,
        };
        plain(&copy);
        assert!(!std::mem::needs_drop::<HostCopy>());
    }

    #[test]
    fn foreign_failures_are_reported_at_the_first_checkpoint_after_their_wait() {
        let errors = ForeignErrors::default();
        errors.push(2, Error::aborted("second"));
        errors.push(5, Error::aborted("fifth"));
        assert!(errors.take_upto(1).is_empty());
        let due = errors.take_upto(4);
        assert_eq!(due.len(), 1);
        assert!(due[0].to_string().contains("second"));
        assert!(errors.take_upto(4).is_empty(), "reported once");
        assert_eq!(errors.take_upto(9).len(), 1);
    }
}
