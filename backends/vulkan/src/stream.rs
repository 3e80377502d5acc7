//! [`VulkanStream`]: an in-order queue of device work on a Vulkan queue.
//!
//! # Batching
//! Operations are recorded into an open command buffer, separated by full memory
//! barriers (in-order semantics), and submitted as one batch when an event is
//! recorded, the stream is synchronized or queried, a host step is needed, or
//! [`BATCH_LIMIT`] operations have accumulated. Each batch signals the stream's
//! timeline semaphore with the next value.
//!
//! # Host steps and completion
//! A per-stream completion thread takes the batches and host steps in submission order.
//! For a batch it waits for the semaphore value, then runs the batch's *after* actions
//! (device→host copies out of staging buffers), completes the events recorded with it,
//! releases everything the batch held, and advances the stream's completed position.
//! A *host step* (waiting for an event of another device or backend, or reading a host
//! buffer that earlier work of the stream may still write) runs on that thread after
//! all earlier work, then signals a second timeline semaphore that the next batch waits
//! on. So host waits never block the submitting thread, and stream order holds across
//! the host and the device.
//!
//! Events of the same device are waited natively (a semaphore wait in the next
//! submission); their failures are checked when the waiting batch completes.

use std::any::Any;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ash::vk;
use xpu_hal::backend::{BuiltinOp, EventImpl, StreamImpl, StreamProgress};
use xpu_hal::{
    downcast_raw, Error, HostSlice, KernelDesc, KernelImpl, LaunchDims, RawKernelArg, RawSlice,
    Result,
};

use crate::device::DeviceShared;
use crate::error::VkResultExt;
use crate::event::{Mark, VulkanEvent};
use crate::memory::{Placement, VulkanBuffer};
use crate::retire::Retired;
use crate::staging::{Staging, StagingPool};

/// Operations recorded before a batch is submitted without being asked.
pub const BATCH_LIMIT: u32 = 256;

/// Timestamp slots per stream; an event's slot is reused this many events later.
const TIMESTAMP_SLOTS: u32 = 1024;

/// Something a batch keeps alive until it completes.
pub(crate) type Held = Arc<dyn Any + Send + Sync>;
/// Host work run in stream order on the completion thread.
pub(crate) type HostAction = Box<dyn FnOnce() -> Result<()> + Send>;

use xpu_hal::backend::lock;

struct Recording {
    cmd: vk::CommandBuffer,
    held: Vec<Held>,
    after: Vec<HostAction>,
    ops: u32,
}

enum Item {
    Batch {
        pos: u64,
        gpu_value: u64,
        cmd: Option<vk::CommandBuffer>,
        held: Vec<Held>,
        after: Vec<HostAction>,
        marks: Vec<Arc<Mark>>,
        waited: Vec<VulkanEvent>,
    },
    Host {
        pos: u64,
        host_value: u64,
        action: HostAction,
    },
}

struct SubmitState {
    rec: Option<Recording>,
    gpu_value: u64,
    host_value: u64,
    pos: u64,
    waits: Vec<(vk::Semaphore, u64)>,
    /// Events of this device the next batch waits for natively; their outcome is
    /// checked when the batch completes.
    waited: Vec<VulkanEvent>,
    next_slot: u32,
    tx: Option<Sender<Item>>,
}

/// The state a stream, its events and its completion thread share.
pub(crate) struct StreamShared {
    pub(crate) dev: Arc<DeviceShared>,
    queue: usize,
    pub(crate) gpu_sem: vk::Semaphore,
    host_sem: vk::Semaphore,
    pool: vk::CommandPool,
    /// Timestamp queries for events, used as a ring of [`TIMESTAMP_SLOTS`], and the
    /// mapped buffer each batch copies its results into. The completion thread reads the
    /// buffer, never the pool: `vkGetQueryPoolResults` may wait for the whole queue on
    /// some drivers (lavapipe), which would block that thread behind later batches that
    /// wait for a host step only it can run.
    timestamps: Option<(vk::QueryPool, VulkanBuffer)>,
    recycled: Mutex<Vec<vk::CommandBuffer>>,
    submit: Mutex<SubmitState>,
    pub(crate) progress: StreamProgress,
}

// SAFETY: Vulkan handles may move between threads; the externally synchronised ones
// (the command pool and its buffers) are only used under `submit`, or, once a batch is
// submitted, by the completion thread which hands them back through `recycled`.
unsafe impl Send for StreamShared {}
// SAFETY: as above.
unsafe impl Sync for StreamShared {}

fn timeline_semaphore(dev: &DeviceShared) -> Result<vk::Semaphore> {
    let mut kind = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(0);
    let info = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
    // SAFETY: valid device and create info.
    unsafe { dev.device.create_semaphore(&info, None) }.vk(&dev.name, "vkCreateSemaphore")
}

impl StreamShared {
    /// Waits until the completion thread has passed position `pos`; `false` on timeout.
    pub(crate) fn wait_pos(&self, pos: u64, timeout: Option<Duration>) -> bool {
        self.progress.wait(pos, timeout)
    }

    pub(crate) fn completed(&self) -> u64 {
        self.progress.completed()
    }

    fn peek_error(&self) -> Option<Error> {
        self.progress.peek_error()
    }

    fn set_error(&self, e: Error) {
        self.progress.set_error(e);
    }

    fn take_error(&self) -> Result<()> {
        match self.progress.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn command_buffer(&self) -> Result<vk::CommandBuffer> {
        let d = &self.dev.device;
        let cmd = match lock(&self.recycled).pop() {
            Some(cmd) => {
                // SAFETY: the buffer's batch completed; the pool is used under `submit`,
                // which the caller holds.
                unsafe { d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty()) }
                    .vk(&self.dev.name, "vkResetCommandBuffer")?;
                cmd
            }
            None => {
                let info = vk::CommandBufferAllocateInfo::default()
                    .command_pool(self.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool belongs to this device; used under `submit`.
                let v = unsafe { d.allocate_command_buffers(&info) }
                    .vk(&self.dev.name, "vkAllocateCommandBuffers")?;
                v.into_iter().next().ok_or_else(|| {
                    Error::backend_message("vulkan", "vkAllocateCommandBuffers returned nothing")
                })?
            }
        };
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: a reset or fresh primary command buffer of our pool.
        unsafe { d.begin_command_buffer(cmd, &begin) }
            .vk(&self.dev.name, "vkBeginCommandBuffer")?;
        self.barrier(cmd);
        Ok(cmd)
    }

    /// A full memory barrier: everything before completes and is visible to
    /// everything after (including earlier submissions on the queue).
    fn barrier(&self, cmd: vk::CommandBuffer) {
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)];
        // SAFETY: `cmd` is recording.
        unsafe {
            self.dev.device.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &mb,
                &[],
                &[],
            )
        };
    }

    /// Records one operation into the open batch.
    pub(crate) fn record(
        &self,
        held: Vec<Held>,
        after: Option<HostAction>,
        f: impl FnOnce(vk::CommandBuffer) -> Result<()>,
    ) -> Result<()> {
        let mut st = lock(&self.submit);
        let rec = self.open(&mut st)?;
        f(rec.cmd)?;
        self.barrier(rec.cmd);
        rec.held.extend(held);
        rec.after.extend(after);
        rec.ops += 1;
        if rec.ops >= BATCH_LIMIT {
            self.flush(&mut st, Vec::new())?;
        }
        Ok(())
    }

    /// The open batch, begun if there is none.
    fn open<'a>(&self, st: &'a mut SubmitState) -> Result<&'a mut Recording> {
        if st.rec.is_none() {
            let cmd = self.command_buffer()?;
            st.rec = Some(Recording {
                cmd,
                held: Vec::new(),
                after: Vec::new(),
                ops: 0,
            });
        }
        st.rec
            .as_mut()
            .ok_or_else(|| Error::backend_message("vulkan", "internal error: no open batch"))
    }

    /// Records an event at the current end of the stream: a timestamp (where the device
    /// writes them) and a submission that completes `mark`.
    fn record_mark(&self, mark: &Arc<Mark>) -> Result<(u64, u64)> {
        let mut st = lock(&self.submit);
        if let Some((pool, readback)) = &self.timestamps {
            let pool = *pool;
            let slot = st.next_slot;
            st.next_slot = (slot + 1) % TIMESTAMP_SLOTS;
            let rec = self.open(&mut st)?;
            // SAFETY: `rec.cmd` is recording; the slot is inside the pool.
            unsafe {
                self.dev.device.cmd_reset_query_pool(rec.cmd, pool, slot, 1);
                self.dev.device.cmd_write_timestamp(
                    rec.cmd,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    pool,
                    slot,
                );
                // The result lands in the mapped buffer with this batch; the batch's
                // closing barrier makes it visible to the host.
                self.dev.device.cmd_copy_query_pool_results(
                    rec.cmd,
                    pool,
                    slot,
                    1,
                    readback.buffer,
                    u64::from(slot) * 8,
                    8,
                    vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                );
            }
            let _ = mark.slot.set(slot);
        }
        let pos = self.flush(&mut st, vec![mark.clone()])?;
        Ok((pos, st.gpu_value))
    }

    fn read_timestamp(&self, mark: &Mark) {
        let (Some((_, readback)), Some(&slot), Some(period)) =
            (&self.timestamps, mark.slot.get(), self.dev.timestamp_period)
        else {
            return;
        };
        let Some(base) = readback.mapped() else {
            return;
        };
        // SAFETY: the buffer holds TIMESTAMP_SLOTS u64s and stays mapped while the stream
        // lives; the batch that copied this slot's result has completed, and its closing
        // barrier made the write visible to the host. The slot is rewritten only by a
        // batch recorded TIMESTAMP_SLOTS events later.
        let ticks =
            unsafe { std::ptr::read_volatile(base.as_ptr().add(slot as usize * 8).cast::<u64>()) };
        let _ = mark.device_ns.set((ticks as f64 * period) as u64);
    }

    /// Submits the open batch (if any, or if `force_marks` is non-empty, an empty one
    /// that signals them). Returns the position of the submission.
    fn flush(&self, st: &mut SubmitState, marks: Vec<Arc<Mark>>) -> Result<u64> {
        if st.rec.is_none() && marks.is_empty() && st.waits.is_empty() {
            return Ok(st.pos);
        }
        let d = &self.dev.device;
        let rec = st.rec.take();
        if let Some(r) = &rec {
            // Make device writes visible to the host (staging read-back).
            let mb = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ)];
            // SAFETY: `r.cmd` is recording.
            unsafe {
                d.cmd_pipeline_barrier(
                    r.cmd,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::PipelineStageFlags::HOST,
                    vk::DependencyFlags::empty(),
                    &mb,
                    &[],
                    &[],
                );
                d.end_command_buffer(r.cmd)
            }
            .vk(&self.dev.name, "vkEndCommandBuffer")?;
        }
        let value = st.gpu_value + 1;
        let waits = std::mem::take(&mut st.waits);
        let wait_sems: Vec<vk::Semaphore> = waits.iter().map(|w| w.0).collect();
        let wait_values: Vec<u64> = waits.iter().map(|w| w.1).collect();
        let stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; waits.len()];
        let signal_sems = [self.gpu_sem];
        let signal_values = [value];
        let cmds: Vec<vk::CommandBuffer> = rec.iter().map(|r| r.cmd).collect();
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let submit = [vk::SubmitInfo::default()
            .wait_semaphores(&wait_sems)
            .wait_dst_stage_mask(&stages)
            .command_buffers(&cmds)
            .signal_semaphores(&signal_sems)
            .push_next(&mut timeline)];
        let queue = self
            .dev
            .queues
            .get(self.queue)
            .ok_or_else(|| Error::backend_message("vulkan", "internal error: no queue"))?;
        {
            let q = lock(queue);
            // SAFETY: the queue is externally synchronised by its mutex; everything the
            // submission references lives across the call.
            unsafe { d.queue_submit(*q, &submit, vk::Fence::null()) }
                .vk(&self.dev.name, "vkQueueSubmit")?;
        }
        st.gpu_value = value;
        st.pos += 1;
        let (held, after, cmd) = match rec {
            Some(r) => (r.held, r.after, Some(r.cmd)),
            None => (Vec::new(), Vec::new(), None),
        };
        let item = Item::Batch {
            pos: st.pos,
            gpu_value: value,
            cmd,
            held,
            after,
            marks,
            waited: std::mem::take(&mut st.waited),
        };
        self.send(st, item)?;
        Ok(st.pos)
    }

    fn send(&self, st: &mut SubmitState, item: Item) -> Result<()> {
        match &st.tx {
            Some(tx) => tx.send(item).map_err(|_| Error::DeviceLost {
                device: self.dev.name.clone(),
                message: "the stream's completion thread has stopped".to_string(),
            }),
            None => Err(Error::DeviceLost {
                device: self.dev.name.clone(),
                message: "the stream has been shut down".to_string(),
            }),
        }
    }

    /// Runs `f` now, on this thread, if the stream has nothing pending — then doing the
    /// work immediately is the same as doing it in order. The submission lock is held
    /// meanwhile, so nothing can be enqueued on this stream before `f` is done.
    /// `None` when the stream is busy.
    pub(crate) fn if_idle<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let st = lock(&self.submit);
        if st.rec.is_some() || !st.waits.is_empty() || self.completed() < st.pos {
            return None;
        }
        Some(f())
    }

    /// Runs `action` on the completion thread after all earlier work; later work waits
    /// for it.
    pub(crate) fn host_step(&self, action: HostAction) -> Result<()> {
        let mut st = lock(&self.submit);
        self.flush(&mut st, Vec::new())?;
        st.host_value += 1;
        st.pos += 1;
        let item = Item::Host {
            pos: st.pos,
            host_value: st.host_value,
            action,
        };
        self.send(&mut st, item)?;
        let h = st.host_value;
        st.waits.push((self.host_sem, h));
        Ok(())
    }

    fn complete(&self, pos: u64) {
        self.progress.advance(pos);
    }

    fn run_completion(self: &Arc<Self>, rx: Receiver<Item>) {
        for item in rx {
            match item {
                Item::Batch {
                    pos,
                    gpu_value,
                    cmd,
                    held,
                    after,
                    marks,
                    waited,
                } => {
                    let sems = [self.gpu_sem];
                    let values = [gpu_value];
                    let info = vk::SemaphoreWaitInfo::default()
                        .semaphores(&sems)
                        .values(&values);
                    // SAFETY: our own semaphore; the value was submitted.
                    let waited_ok = unsafe { self.dev.device.wait_semaphores(&info, u64::MAX) }
                        .vk(&self.dev.name, "vkWaitSemaphores");
                    if let Err(e) = waited_ok {
                        self.set_error(e);
                    }
                    for action in after {
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(action)) {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => self.set_error(e),
                            Err(p) => self.set_error(Error::from_panic("a host copy", &*p)),
                        }
                    }
                    for e in &waited {
                        // The semaphore value can be signalled before the other stream's
                        // completion thread has recorded the event's outcome: wait for it.
                        if let Err(err) = EventImpl::wait(e, None) {
                            self.set_error(Error::aborted(format!(
                                "an event this stream waited for failed: {err}"
                            )));
                        }
                    }
                    let err = self.peek_error();
                    for m in marks {
                        self.read_timestamp(&m);
                        m.complete(err.as_ref(), &self.dev.name);
                    }
                    drop(held);
                    if let Some(cmd) = cmd {
                        lock(&self.recycled).push(cmd);
                    }
                    self.complete(pos);
                }
                Item::Host {
                    pos,
                    host_value,
                    action,
                } => {
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(action)) {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => self.set_error(e),
                        Err(p) => self.set_error(Error::from_panic("a host step", &*p)),
                    }
                    let info = vk::SemaphoreSignalInfo::default()
                        .semaphore(self.host_sem)
                        .value(host_value);
                    // SAFETY: our own semaphore; values only increase.
                    if let Err(e) = unsafe { self.dev.device.signal_semaphore(&info) }
                        .vk(&self.dev.name, "vkSignalSemaphore")
                    {
                        self.set_error(e);
                    }
                    self.complete(pos);
                }
            }
        }
    }
}

impl Drop for StreamShared {
    fn drop(&mut self) {
        // The completion thread has seen every batch finish (it holds an Arc to this
        // value until it exits), but a driver may still be finishing the submissions on
        // its queue: the objects are destroyed once the queues have passed them.
        self.dev.graveyard.retire(
            &self.dev.device,
            &self.dev.queues,
            Retired {
                semaphores: vec![self.gpu_sem, self.host_sem],
                command_pools: vec![self.pool],
                query_pools: self
                    .timestamps
                    .as_ref()
                    .map(|(q, _)| *q)
                    .into_iter()
                    .collect(),
            },
        );
    }
}

/// A stream on a Vulkan device.
pub struct VulkanStream {
    pub(crate) shared: Arc<StreamShared>,
    staging: Arc<StagingPool>,
    /// The completion thread, waited for when the stream is dropped.
    completion: Option<std::thread::JoinHandle<()>>,
}

impl VulkanStream {
    pub(crate) fn new(dev: Arc<DeviceShared>) -> Result<Self> {
        let gpu_sem = timeline_semaphore(&dev)?;
        let host_sem = match timeline_semaphore(&dev) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: unused semaphore of this device.
                unsafe { dev.device.destroy_semaphore(gpu_sem, None) };
                return Err(e);
            }
        };
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(dev.queue_family);
        // SAFETY: valid device and create info.
        let pool = match unsafe { dev.device.create_command_pool(&info, None) }
            .vk(&dev.name, "vkCreateCommandPool")
        {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: unused semaphores of this device.
                unsafe {
                    dev.device.destroy_semaphore(gpu_sem, None);
                    dev.device.destroy_semaphore(host_sem, None);
                }
                return Err(e);
            }
        };
        let timestamps = if dev.timestamp_period.is_some() {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(TIMESTAMP_SLOTS);
            // SAFETY: valid device and create info. Without a pool (or its read-back
            // buffer), events fall back to host-observed times.
            unsafe { dev.device.create_query_pool(&info, None) }
                .ok()
                .and_then(|q| {
                    match VulkanBuffer::new(
                        &dev,
                        u64::from(TIMESTAMP_SLOTS) * 8,
                        Placement::Staging,
                    ) {
                        Ok(b) if b.mapped().is_some() => Some((q, b)),
                        _ => {
                            // SAFETY: the pool was just created and is unused.
                            unsafe { dev.device.destroy_query_pool(q, None) };
                            None
                        }
                    }
                })
        } else {
            None
        };
        let (tx, rx) = channel();
        let queue = dev.pick_queue();
        let name = format!("xpu-{}-done", dev.name);
        let shared = Arc::new(StreamShared {
            dev,
            queue,
            gpu_sem,
            host_sem,
            pool,
            timestamps,
            recycled: Mutex::new(Vec::new()),
            submit: Mutex::new(SubmitState {
                rec: None,
                gpu_value: 0,
                host_value: 0,
                pos: 0,
                waits: Vec::new(),
                waited: Vec::new(),
                next_slot: 0,
                tx: Some(tx),
            }),
            progress: StreamProgress::new(),
        });
        let worker = shared.clone();
        let completion = std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run_completion(rx))
            .map_err(|e| {
                Error::backend_message("vulkan", format!("could not start a stream thread: {e}"))
            })?;
        Ok(VulkanStream {
            shared,
            staging: Arc::new(StagingPool::default()),
            completion: Some(completion),
        })
    }

    fn staging(&self, len: u64) -> Result<Arc<Staging>> {
        self.staging.lease(&self.shared.dev, len)
    }
}

impl Drop for VulkanStream {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.submit);
        if let Err(e) = self.shared.flush(&mut st, Vec::new()) {
            self.shared.set_error(e);
        }
        // Closing the channel lets the completion thread finish and exit.
        st.tx = None;
        drop(st);
        // Wait (bounded) for the thread to finish what was enqueued and exit. It may hold
        // the last reference to the device, and destroying a Vulkan instance unloads the
        // layers: done on a background thread while the process exits, that races the
        // layers' exit handlers and crashes. Work held behind a gate that never opens
        // must not hang the drop, hence the bound.
        if let Some(thread) = self.completion.take() {
            if thread.thread().id() == std::thread::current().id() {
                return;
            }
            let deadline = std::time::Instant::now() + STREAM_DROP_WAIT;
            let mut pause = Duration::from_micros(20);
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

/// How long dropping a stream waits for its completion thread.
const STREAM_DROP_WAIT: Duration = Duration::from_secs(5);

/// The buffer and byte offset of a validated slice.
pub(crate) fn buffer_of(slice: &RawSlice) -> Result<Arc<VulkanBuffer>> {
    downcast_raw::<VulkanBuffer>(&slice.memory, "vulkan")
}

/// Copies `len` bytes between host pointers.
///
/// # Safety
/// Both ranges must be valid for `len` bytes and not overlap.
unsafe fn host_copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

fn mapped(buf: &VulkanBuffer) -> Result<*mut u8> {
    buf.mapped().map(|p| p.as_ptr()).ok_or_else(|| {
        Error::backend_message("vulkan", "internal error: a staging buffer is not mapped")
    })
}

impl VulkanStream {
    /// Records a copy of `len` bytes between two buffers (each with a byte offset),
    /// holding `held` until it completes.
    fn copy_buffers(
        &self,
        (src, src_offset): (vk::Buffer, u64),
        (dst, dst_offset): (vk::Buffer, u64),
        len: u64,
        held: Vec<Held>,
    ) -> Result<()> {
        let region = [vk::BufferCopy {
            src_offset,
            dst_offset,
            size: len,
        }];
        let d = self.shared.dev.device.clone();
        self.shared.record(held, None, |cmd| {
            // SAFETY: both buffers live until the batch completes (held by the caller's
            // `held`), and the region is within them (HAL bounds checks).
            unsafe { d.cmd_copy_buffer(cmd, src, dst, &region) };
            Ok(())
        })
    }
}

/// Whether no other enqueued operation holds this host memory (the user's buffer and
/// the operation being enqueued hold one share each).
fn host_exclusive(src: &HostSlice) -> bool {
    Arc::strong_count(&src.memory) <= 2
}

impl StreamImpl for VulkanStream {
    fn copy_host_to_device(&self, src: HostSlice, dst: RawSlice) -> Result<()> {
        let dst_buf = buffer_of(&dst)?;
        // Unified memory and an idle stream: copy straight into the device memory.
        if let (Some(base), true) = (dst_buf.host_direct(), host_exclusive(&src)) {
            let copied = self.shared.if_idle(|| {
                // SAFETY: the HAL checked both ranges; nothing on this stream can touch
                // `dst` before we return (idle, submission locked); the host buffer is
                // not held by any other operation.
                unsafe {
                    host_copy(
                        src.memory.as_ptr().add(src.offset),
                        base.add(dst.offset as usize),
                        src.len,
                    )
                }
            });
            if copied.is_some() {
                return Ok(());
            }
        }
        if let Some(pin) = crate::pinned::pinned(&src.memory, &self.shared.dev) {
            return self.copy_buffers(
                (pin.buffer, src.offset as u64),
                (dst_buf.buffer, dst.offset),
                dst.len,
                vec![pin, dst_buf, src.memory],
            );
        }
        let staging = self.staging(dst.len)?;
        let stage_ptr = mapped(&staging)?;
        let len = src.len;
        // The host buffer can change before this copy runs only through work that holds
        // it; with no such work, reading it now is the same as reading it in order.
        if Arc::strong_count(&src.memory) <= 2 {
            // SAFETY: the host range is in bounds (checked by the HAL) and the staging
            // buffer is fresh, mapped, and at least `len` bytes.
            unsafe { host_copy(src.memory.as_ptr().add(src.offset), stage_ptr, len) };
            drop(src);
        } else {
            let staging2 = staging.clone();
            self.shared.host_step(Box::new(move || {
                let stage_ptr = mapped(&staging2)?;
                // SAFETY: as above; this runs after all earlier work of the stream.
                unsafe { host_copy(src.memory.as_ptr().add(src.offset), stage_ptr, len) };
                Ok(())
            }))?;
        }
        let (s, t) = (staging.buffer, dst_buf.buffer);
        self.copy_buffers((s, 0), (t, dst.offset), dst.len, vec![staging, dst_buf])
    }

    fn copy_device_to_host(&self, src: RawSlice, dst: HostSlice) -> Result<()> {
        let src_buf = buffer_of(&src)?;
        if let (Some(base), true) = (src_buf.host_direct(), host_exclusive(&dst)) {
            let copied = self.shared.if_idle(|| {
                // SAFETY: as in `copy_host_to_device`, with the roles swapped: every
                // earlier write of this stream to `src` has completed.
                unsafe {
                    host_copy(
                        base.add(src.offset as usize),
                        dst.memory.as_ptr().add(dst.offset),
                        dst.len,
                    )
                }
            });
            if copied.is_some() {
                return Ok(());
            }
        }
        if let Some(pin) = crate::pinned::pinned(&dst.memory, &self.shared.dev) {
            // The batch's closing host-read barrier makes the bytes visible to the host.
            return self.copy_buffers(
                (src_buf.buffer, src.offset),
                (pin.buffer, dst.offset as u64),
                src.len,
                vec![pin, src_buf, dst.memory],
            );
        }
        let staging = self.staging(src.len)?;
        let region = [vk::BufferCopy {
            src_offset: src.offset,
            dst_offset: 0,
            size: src.len,
        }];
        let len = dst.len;
        let staging2 = staging.clone();
        let after: HostAction = Box::new(move || {
            let stage_ptr = mapped(&staging2)?;
            // SAFETY: the device finished writing the staging buffer (the batch
            // completed, with a host-read barrier); the host range is in bounds and the
            // user cannot touch it while this action holds it.
            unsafe { host_copy(stage_ptr, dst.memory.as_ptr().add(dst.offset), len) };
            drop(dst);
            Ok(())
        });
        let d = self.shared.dev.device.clone();
        let (s, t) = (src_buf.buffer, staging.buffer);
        self.shared
            .record(vec![staging, src_buf], Some(after), |cmd| {
                // SAFETY: both buffers live until the batch completes (held).
                unsafe { d.cmd_copy_buffer(cmd, s, t, &region) };
                Ok(())
            })
    }

    fn copy_device_to_device(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        let (sb, db) = (buffer_of(&src)?, buffer_of(&dst)?);
        if let (Some(s), Some(t)) = (sb.host_direct(), db.host_direct()) {
            let copied = self.shared.if_idle(|| {
                // SAFETY: both ranges are in bounds and disjoint (HAL); the stream is idle
                // and locked, so no work of it touches them meanwhile.
                unsafe {
                    host_copy(
                        s.add(src.offset as usize),
                        t.add(dst.offset as usize),
                        dst.len as usize,
                    )
                }
            });
            if copied.is_some() {
                return Ok(());
            }
        }
        let (s, t) = (sb.buffer, db.buffer);
        self.copy_buffers((s, src.offset), (t, dst.offset), dst.len, vec![sb, db])
    }

    fn builtin(&self, op: BuiltinOp) -> Result<()> {
        crate::builtins::dispatch(&self.shared, op)
    }

    fn run_op(&self, op: xpu_hal::ops::Op<xpu_hal::ops::RawTensor>) -> Result<()> {
        crate::ops::run(&self.shared, op)
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
        let (pos, gpu_value) = self.shared.record_mark(&mark)?;
        Ok(Arc::new(VulkanEvent {
            stream: self.shared.clone(),
            gpu_value,
            pos,
            mark,
        }))
    }

    fn wait_event(&self, event: &Arc<dyn EventImpl>) -> Result<()> {
        let Some(e) = event.as_any().downcast_ref::<VulkanEvent>() else {
            return Err(Error::backend_message(
                "vulkan",
                "internal error: an event of another backend reached the Vulkan backend",
            ));
        };
        if Arc::ptr_eq(&e.stream.dev, &self.shared.dev) {
            // Same device: a native semaphore wait in the next submission.
            let mut st = lock(&self.shared.submit);
            self.shared.flush(&mut st, Vec::new())?;
            st.waits.push((e.stream.gpu_sem, e.gpu_value));
            st.waited.push(e.clone());
            // Keep the other stream's semaphore alive until our batch has waited.
            let keep: Held = e.stream.clone();
            drop(st);
            self.shared.record(vec![keep], None, |_| Ok(()))
        } else {
            let e = e.clone();
            self.shared
                .host_step(Box::new(move || EventImpl::wait(&e, None)))
        }
    }

    fn wait_foreign_event(&self, event: xpu_hal::ForeignEvent) -> Result<()> {
        self.shared.host_step(Box::new(move || event.wait()))
    }

    fn synchronize(&self) -> Result<()> {
        let pos = {
            let mut st = lock(&self.shared.submit);
            self.shared.flush(&mut st, Vec::new())?
        };
        self.shared.wait_pos(pos, None);
        self.shared.take_error()
    }

    fn query(&self) -> Result<bool> {
        let pos = {
            let mut st = lock(&self.shared.submit);
            self.shared.flush(&mut st, Vec::new())?
        };
        let done = self.shared.completed() >= pos;
        self.shared.take_error()?;
        Ok(done)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
