//! [`PluginStream`]: a plugin stream as a HAL stream, holding what its work uses, and
//! the bridge that lets it wait on events of other backends.

use std::any::Any;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};

use xpu_hal::backend::{BuiltinOp, EventImpl, StreamImpl};
use xpu_hal::ops::{Op, RawTensor};
use xpu_hal::{
    downcast_raw, Access, BinaryOp, Error, ForeignEvent, HostSlice, KernelDesc, KernelImpl,
    LaunchDims, RawAllocation, RawKernelArg, RawSlice, Result, Scalar,
};
use xpu_plugin_sdk::abi::*;

use crate::device::{abi_dtype, DeviceShared};
use crate::event::PluginEvent;
use crate::kernel::PluginKernel;
use crate::load::{Args, Func, Handle};
use crate::memory::PluginAllocation;
use crate::std_ops;

/// Something enqueued work uses, kept only to be dropped once the work is done.
pub(crate) type Held = Box<dyn Any + Send + Sync>;

/// The error of a failed wait on another backend's event, kept for the stream's next
/// report of an aborted error (the ABI's `wait` returns only a number).
pub(crate) type ForeignFailure = Arc<Mutex<Option<Error>>>;

pub(crate) use xpu_hal::backend::lock;

/// Adds the error of a failed foreign wait to an aborted error (`take`: and forgets it,
/// for reports that consume the stream's error).
pub(crate) fn explain(e: Error, foreign: &ForeignFailure, take: bool) -> Error {
    let failure = if take {
        lock(foreign).take()
    } else {
        lock(foreign).clone()
    };
    match (e, failure) {
        (Error::Aborted { message }, Some(f)) => Error::aborted(format!(
            "{message}; the event of another backend that the stream waited on had failed: {f}"
        )),
        (e, _) => e,
    }
}

/// The state of a stream shared with its events.
pub(crate) struct StreamShared {
    pub(crate) device: Arc<DeviceShared>,
    handle: Handle<xpu_stream>,
    /// The number of the last operation enqueued. Held across each enqueue so that the
    /// numbers follow the plugin's order.
    submitted: Mutex<u64>,
    /// What enqueued work uses, by operation number, in order.
    held: Mutex<VecDeque<(u64, Held)>>,
    pub(crate) foreign: ForeignFailure,
}

impl StreamShared {
    /// Drops what operations up to number `seq` held: they are complete.
    pub(crate) fn release_through(&self, seq: u64) {
        let done: Vec<Held> = {
            let mut held = lock(&self.held);
            let mut done = Vec::new();
            while held.front().is_some_and(|(s, _)| *s <= seq) {
                if let Some((_, h)) = held.pop_front() {
                    done.push(h);
                }
            }
            done
        };
        // Dropped outside the lock: a last buffer reference frees it in the plugin.
        drop(done);
    }

    /// Makes one plugin call that enqueues work on every stream of `streams` at once
    /// (a native collective), numbering the work on each stream as its next operation
    /// and holding `holds[i]` for `streams[i]` until that work is complete. The streams'
    /// numbering locks are taken in address order, so that concurrent calls over the
    /// same streams cannot deadlock, and held across the call, so that each stream's
    /// numbers follow the plugin's order.
    pub(crate) fn enqueue_on_all(
        streams: &[&StreamShared],
        holds: Vec<Vec<Held>>,
        call: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut order: Vec<usize> = (0..streams.len()).collect();
        order.sort_by_key(|&i| streams[i] as *const StreamShared as usize);
        let mut guards: Vec<(usize, MutexGuard<'_, u64>)> = order
            .into_iter()
            .map(|i| (i, lock(&streams[i].submitted)))
            .collect();
        call()?;
        guards.sort_by_key(|(i, _)| *i);
        for ((i, last), held) in guards.iter_mut().zip(holds) {
            **last += 1;
            if !held.is_empty() {
                let seq = **last;
                lock(&streams[*i].held).extend(held.into_iter().map(|h| (seq, h)));
            }
        }
        Ok(())
    }

    /// The plugin's handle of the stream.
    pub(crate) fn raw(&self) -> *mut xpu_stream {
        self.handle.0
    }

    fn synchronize_raw(&self) -> Result<()> {
        let target = *lock(&self.submitted);
        let plugin = &self.device.plugin;
        let mut args = xpu_stream_args::new();
        args.stream = self.handle.0;
        // SAFETY: the stream is live (destroyed only in `Drop`).
        let result = unsafe {
            plugin.call(
                plugin.table.stream_synchronize,
                &mut args,
                "stream_synchronize",
                &self.device.id,
            )
        };
        // After synchronize returns, the work before it has run (or failed); only a lost
        // device leaves its fate unknown, and then its resources stay held until the
        // stream is destroyed — unless the loss was injected, after which the ABI
        // promises that synchronize returns only once the work has stopped.
        if !matches!(result, Err(Error::DeviceLost { .. })) || self.device.work_stops_when_lost() {
            self.release_through(target);
        }
        result
    }
}

impl Drop for StreamShared {
    fn drop(&mut self) {
        // The ABI lets a destroyed stream finish its work in the background, but the
        // memory that work uses is released right after: so finish it first.
        let synchronized = self.synchronize_raw();
        let plugin = &self.device.plugin;
        let mut args = xpu_stream_args::new();
        args.stream = self.handle.0;
        // SAFETY: the last owner is going away, so no other call on the stream is in
        // progress; it is destroyed exactly once, here, before its device is closed.
        unsafe {
            plugin.release(
                plugin.table.stream_destroy,
                args,
                "stream_destroy",
                &self.device.id,
            )
        };
        if matches!(synchronized, Err(Error::DeviceLost { .. }))
            && !self.device.work_stops_when_lost()
        {
            // The device may still be using the memory: leak it rather than free it.
            std::mem::forget(std::mem::take(&mut *lock(&self.held)));
        }
    }
}

/// A stream of a plugin device.
///
/// Every operation's host memory, device buffers, kernel and awaited events are held
/// until the stream is synchronized or an event recorded after the operation is seen
/// complete, as the HAL's contract on held resources requires.
pub struct PluginStream {
    shared: Arc<StreamShared>,
}

/// Maps a HAL binary operator onto `xpu_binary_op`.
fn abi_op(op: BinaryOp) -> u32 {
    match op {
        BinaryOp::Sum => binary_op::SUM,
        BinaryOp::Prod => binary_op::PROD,
        BinaryOp::Min => binary_op::MIN,
        BinaryOp::Max => binary_op::MAX,
    }
}

/// A scalar's little-endian bytes in the ABI's 8-byte field.
fn scalar_bytes(s: &Scalar) -> [u8; 8] {
    let mut out = [0u8; 8];
    let bytes = s.to_le_bytes();
    let n = bytes.len().min(8);
    out[..n].copy_from_slice(&bytes[..n]);
    out
}

impl PluginStream {
    pub(crate) fn new(device: Arc<DeviceShared>, handle: Handle<xpu_stream>) -> Self {
        PluginStream {
            shared: Arc::new(StreamShared {
                device,
                handle,
                submitted: Mutex::new(0),
                held: Mutex::new(VecDeque::new()),
                foreign: Arc::new(Mutex::new(None)),
            }),
        }
    }

    fn device(&self) -> &DeviceShared {
        &self.shared.device
    }

    /// The plugin buffer behind a validated slice.
    fn buffer(&self, memory: &Arc<dyn RawAllocation>) -> Result<Arc<PluginAllocation>> {
        let backend = &self.device().plugin.backend;
        let buffer = downcast_raw::<PluginAllocation>(memory, backend)?;
        if !buffer.is_on(&self.shared.device) {
            return Err(Error::backend_message(
                backend.clone(),
                format!(
                    "internal error: memory of another device reached a stream of {}",
                    self.device().id
                ),
            ));
        }
        Ok(buffer)
    }

    /// The state the stream shares with its events.
    pub(crate) fn shared(&self) -> &Arc<StreamShared> {
        &self.shared
    }

    /// The plugin range of a validated slice of this stream's device, holding its buffer.
    pub(crate) fn range(
        &self,
        slice: &RawSlice,
        holds: &mut Vec<Held>,
    ) -> Result<xpu_buffer_range> {
        let buffer = self.buffer(&slice.memory)?;
        let range = buffer.range(slice.offset, slice.len);
        holds.push(Box::new(buffer));
        Ok(range)
    }

    /// Calls an enqueueing function and, if it succeeds, holds `holds` until the work
    /// is known to be complete.
    ///
    /// # Safety
    /// `f` is the table's function for `A`, and `args` is filled for this stream with
    /// live handles and pointers that `holds` keeps valid.
    unsafe fn enqueue<A>(
        &self,
        f: Func<A>,
        args: &mut A,
        function: &'static str,
        holds: Vec<Held>,
    ) -> Result<()> {
        let plugin = &self.device().plugin;
        let mut last = lock(&self.shared.submitted);
        // SAFETY: the caller's contract; the lock keeps the numbering in call order.
        unsafe { plugin.call(f, args, function, &self.device().id) }?;
        *last += 1;
        if !holds.is_empty() {
            let seq = *last;
            lock(&self.shared.held).extend(holds.into_iter().map(|h| (seq, h)));
        }
        Ok(())
    }

    fn copy(
        &self,
        f: Func<xpu_copy_args>,
        function: &'static str,
        fill: impl FnOnce(&mut xpu_copy_args, &mut Vec<Held>) -> Result<()>,
    ) -> Result<()> {
        let mut args = xpu_copy_args::new();
        args.stream = self.shared.handle.0;
        let mut holds = Vec::new();
        fill(&mut args, &mut holds)?;
        // SAFETY: the ranges are validated by the HAL and their buffers and host memory
        // are in `holds`.
        unsafe { self.enqueue(f, &mut args, function, holds) }
    }
}

impl StreamImpl for PluginStream {
    fn copy_host_to_device(&self, src: HostSlice, dst: RawSlice) -> Result<()> {
        let table = &self.device().plugin.table;
        self.copy(
            table.copy_host_to_device,
            "copy_host_to_device",
            |a, holds| {
                a.dst = self.range(&dst, holds)?;
                a.host = src
                    .memory
                    .as_ptr()
                    .wrapping_add(src.offset)
                    .cast::<c_void>();
                a.length = dst.len;
                holds.push(Box::new(src));
                Ok(())
            },
        )
    }

    fn copy_device_to_host(&self, src: RawSlice, dst: HostSlice) -> Result<()> {
        let table = &self.device().plugin.table;
        self.copy(
            table.copy_device_to_host,
            "copy_device_to_host",
            |a, holds| {
                a.src = self.range(&src, holds)?;
                a.host = dst
                    .memory
                    .as_ptr()
                    .wrapping_add(dst.offset)
                    .cast::<c_void>();
                a.length = src.len;
                holds.push(Box::new(dst));
                Ok(())
            },
        )
    }

    fn copy_device_to_device(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        let table = &self.device().plugin.table;
        self.copy(
            table.copy_device_to_device,
            "copy_device_to_device",
            |a, holds| {
                a.src = self.range(&src, holds)?;
                a.dst = self.range(&dst, holds)?;
                a.length = src.len;
                Ok(())
            },
        )
    }

    fn builtin(&self, op: BuiltinOp) -> Result<()> {
        let mut a = xpu_builtin_args::new();
        a.stream = self.shared.handle.0;
        let mut holds = Vec::new();
        match &op {
            BuiltinOp::Fill { dst, value } => {
                a.kind = builtin_kind::FILL;
                a.dtype = abi_dtype(value.dtype());
                a.dst = self.range(dst, &mut holds)?;
                a.scalar = scalar_bytes(value);
            }
            BuiltinOp::Binary {
                op,
                dtype,
                a: lhs,
                b: rhs,
                dst,
            } => {
                a.kind = builtin_kind::BINARY;
                a.op = abi_op(*op);
                a.dtype = abi_dtype(*dtype);
                a.dst = self.range(dst, &mut holds)?;
                a.a = self.range(lhs, &mut holds)?;
                a.b = self.range(rhs, &mut holds)?;
            }
            BuiltinOp::Accumulate {
                op,
                dtype,
                dst,
                src,
            } => {
                a.kind = builtin_kind::ACCUMULATE;
                a.op = abi_op(*op);
                a.dtype = abi_dtype(*dtype);
                a.dst = self.range(dst, &mut holds)?;
                a.a = self.range(src, &mut holds)?;
            }
            BuiltinOp::Scale { alpha, src, dst } => {
                a.kind = builtin_kind::SCALE;
                a.dtype = abi_dtype(alpha.dtype());
                a.dst = self.range(dst, &mut holds)?;
                a.a = self.range(src, &mut holds)?;
                a.scalar = scalar_bytes(alpha);
            }
            BuiltinOp::Cast {
                src,
                src_dtype,
                dst,
                dst_dtype,
            } => {
                a.kind = builtin_kind::CAST;
                a.dtype = abi_dtype(*src_dtype);
                a.dst_dtype = abi_dtype(*dst_dtype);
                a.dst = self.range(dst, &mut holds)?;
                a.a = self.range(src, &mut holds)?;
            }
        }
        let f = self.device().plugin.table.builtin;
        // SAFETY: ranges validated by the HAL, their buffers in `holds`.
        unsafe { self.enqueue(f, &mut a, "builtin", holds) }
    }

    fn run_op(&self, op: Op<RawTensor>) -> Result<()> {
        let plugin = &self.device().plugin;
        let Some(fns) = plugin.table.ops else {
            return Err(Error::unsupported(format!(
                "{} does not provide the standard operation {} (its plugin does not have both device_ops and op_enqueue)",
                self.device().id,
                op.kind()
            )));
        };
        let mut holds = Vec::new();
        let mut tensors = Vec::with_capacity(XPU_OP_MAX_TENSORS);
        for operand in op.operands() {
            let range = self.range(&operand.tensor.memory, &mut holds)?;
            tensors.push(std_ops::tensor(operand.tensor, range));
        }
        let pointers: Vec<*const xpu_tensor> =
            tensors.iter().map(|t| t as *const xpu_tensor).collect();
        let mut a = xpu_op_args::new();
        a.stream = self.shared.handle.0;
        a.op = op.kind().id();
        a.tensor_count = pointers.len() as u32;
        a.tensors = pointers.as_ptr();
        a.params = std_ops::params(&op);
        // SAFETY: the HAL checked the operation and its tensors (on this device, in
        // bounds, each range exactly its layout's span); their buffers are in `holds`;
        // the descriptors and the pointer array outlive the call, which is all the ABI
        // asks of them.
        unsafe { self.enqueue(fns.enqueue, &mut a, "op_enqueue", holds) }.map_err(|e| match e {
            Error::InvalidArgument { message } => {
                Error::invalid(format!("{}: {message}", op.kind()))
            }
            other => other,
        })
    }

    fn launch(
        &self,
        kernel: &Arc<dyn KernelImpl>,
        desc: &KernelDesc,
        dims: LaunchDims,
        args: Vec<RawKernelArg>,
    ) -> Result<()> {
        let plugin = &self.device().plugin;
        let internal = |what: &str| {
            Error::backend_message(
                plugin.backend.clone(),
                format!(
                    "internal error: {what} reached a stream of {}",
                    self.device().id
                ),
            )
        };
        let Some(fns) = plugin.table.kernels else {
            return Err(internal("a kernel launch on a plugin without kernels"));
        };
        let Some(k) = kernel.as_any().downcast_ref::<PluginKernel>() else {
            return Err(internal("a kernel of another backend"));
        };
        if !Arc::ptr_eq(&k.device, &self.shared.device) {
            return Err(internal("a kernel of another device"));
        }
        let mut holds: Vec<Held> = vec![Box::new(kernel.clone())];
        let mut raw = Vec::with_capacity(args.len());
        for arg in &args {
            let mut r = <xpu_kernel_arg as crate::load::Zeroed>::zeroed();
            match arg {
                RawKernelArg::Buffer(slice, access) => {
                    r.kind = kernel_arg_kind::BUFFER;
                    r.access = match access {
                        Access::Read => access::READ,
                        Access::Write => access::WRITE,
                        Access::ReadWrite => access::READ_WRITE,
                    };
                    if let Some(slice) = slice {
                        r.range = self.range(slice, &mut holds)?;
                    }
                }
                RawKernelArg::Scalar(s) => {
                    r.kind = kernel_arg_kind::SCALAR;
                    r.dtype = abi_dtype(s.dtype());
                    r.scalar = scalar_bytes(s);
                }
            }
            raw.push(r);
        }
        let mut a = xpu_kernel_launch_args::new();
        a.stream = self.shared.handle.0;
        a.kernel = k.handle.0;
        a.grid = dims.grid;
        a.block = dims.block;
        a.args = raw.as_ptr();
        a.arg_count = raw.len() as u64;
        // SAFETY: the kernel is this device's and held; buffer ranges are validated
        // and held; `raw` outlives the call, which is all the ABI asks of it.
        unsafe { self.enqueue(fns.launch, &mut a, "kernel_launch", holds) }.map_err(|e| match e {
            Error::InvalidArgument { message } => {
                Error::invalid(format!("launch of `{}`: {message}", desc.name))
            }
            other => other,
        })
    }

    fn record_event(&self) -> Result<Arc<dyn EventImpl>> {
        let plugin = &self.device().plugin;
        let mut a = xpu_event_record_args::new();
        a.stream = self.shared.handle.0;
        let last = lock(&self.shared.submitted);
        // SAFETY: the stream is live; the lock orders the event after every operation
        // numbered so far.
        unsafe {
            plugin.call(
                plugin.table.event_record,
                &mut a,
                "event_record",
                &self.device().id,
            )
        }?;
        let seq = *last;
        drop(last);
        if a.event.is_null() {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                format!(
                    "{}: event_record succeeded but returned no event (a plugin bug)",
                    self.device().id
                ),
            ));
        }
        Ok(Arc::new(PluginEvent::new(
            &self.shared,
            Handle(a.event),
            seq,
        )))
    }

    fn wait_event(&self, event: &Arc<dyn EventImpl>) -> Result<()> {
        let plugin = &self.device().plugin;
        let Some(e) = event.as_any().downcast_ref::<PluginEvent>() else {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                "internal error: an event of another backend reached wait_event of a plugin stream",
            ));
        };
        if !plugin.same_library(&e.device.plugin) {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                "internal error: an event of another plugin library reached wait_event",
            ));
        }
        let mut a = xpu_stream_wait_event_args::new();
        a.stream = self.shared.handle.0;
        a.event = e.handle.0;
        let f = plugin.table.stream_wait_event;
        // SAFETY: both handles are live and of this plugin; the event is held until the
        // wait is done, so it is never destroyed while the stream waits on it.
        unsafe {
            self.enqueue(
                f,
                &mut a,
                "stream_wait_event",
                vec![Box::new(event.clone())],
            )
        }
    }

    fn wait_foreign_event(&self, event: ForeignEvent) -> Result<()> {
        let context = Box::new(External {
            event,
            failure: self.shared.foreign.clone(),
        });
        let mut a = xpu_stream_wait_external_args::new();
        a.stream = self.shared.handle.0;
        a.external = xpu_external_event {
            context: Box::into_raw(context).cast::<c_void>(),
            wait: Some(external_wait),
            release: Some(external_release),
        };
        let f = self.device().plugin.table.stream_wait_external;
        // SAFETY: the stream is live; the context is a leaked box that the plugin owns
        // from now on and gives back through `release` (even if this call fails: the
        // header passes ownership with the call, so it is not reclaimed here).
        unsafe { self.enqueue(f, &mut a, "stream_wait_external", Vec::new()) }
    }

    fn synchronize(&self) -> Result<()> {
        let result = self.shared.synchronize_raw();
        // Whatever failure a foreign wait had is reported now or never.
        match result {
            Ok(()) => {
                lock(&self.shared.foreign).take();
                Ok(())
            }
            Err(e) => Err(explain(e, &self.shared.foreign, true)),
        }
    }

    fn query(&self) -> Result<bool> {
        let target = *lock(&self.shared.submitted);
        let plugin = &self.device().plugin;
        let mut a = xpu_stream_query_args::new();
        a.stream = self.shared.handle.0;
        // SAFETY: the stream is live.
        let result = unsafe {
            plugin.call(
                plugin.table.stream_query,
                &mut a,
                "stream_query",
                &self.device().id,
            )
        };
        match result {
            Ok(()) if a.done != 0 => {
                self.shared.release_through(target);
                Ok(true)
            }
            Ok(()) => Ok(false),
            Err(e) => Err(explain(e, &self.shared.foreign, true)),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The context of an [`xpu_external_event`]: the foreign event and where to put its
/// error.
struct External {
    event: ForeignEvent,
    failure: ForeignFailure,
}

impl External {
    fn fail(&self, e: Error) {
        let mut slot = lock(&self.failure);
        if slot.is_none() {
            *slot = Some(e);
        }
    }
}

/// `xpu_external_event.wait`: blocks in [`Event::wait`]; 0 on success, 1 if the work
/// before the event failed (its error is kept for the stream's report).
///
/// # Safety
/// `context` is the pointer [`PluginStream::wait_foreign_event`] passed, not yet
/// released.
unsafe extern "C" fn external_wait(context: *mut c_void) -> i32 {
    if context.is_null() {
        return 1;
    }
    // SAFETY: a live `External` (the caller's contract), only read through `&`.
    let external = unsafe { &*context.cast::<External>() };
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| external.event.wait()));
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            external.fail(e);
            1
        }
        Err(payload) => {
            external.fail(Error::from_panic(
                "waiting on an event of another backend",
                &*payload,
            ));
            1
        }
    }
}

/// `xpu_external_event.release`: drops the context (and with it the foreign event).
///
/// # Safety
/// `context` is the pointer [`PluginStream::wait_foreign_event`] passed; called once.
unsafe extern "C" fn external_release(context: *mut c_void) {
    if context.is_null() {
        return;
    }
    // SAFETY: the box leaked in `wait_foreign_event`, released exactly once.
    let external = unsafe { Box::from_raw(context.cast::<External>()) };
    // A panic must not cross the C boundary; there is nobody to report it to.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(external)));
}

impl std::fmt::Debug for PluginStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginStream")
            .field("device", &self.device().id)
            .finish()
    }
}
