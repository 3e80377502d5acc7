//! [`Stream`]: the validated handle to an in-order queue of device work.

use std::fmt;
use std::sync::Arc;

use crate::backend::{BatchOp, BuiltinOp, StreamImpl};
use crate::device::{Device, Kernel};
use crate::dtype::{BinaryOp, DType, Scalar};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::kept::KeptBatch;
use crate::kernel::{KernelArg, KernelParam, LaunchDims, RawKernelArg};
use crate::memory::{Allocation, BufferSlice, HostBuffer, HostSlice, RawAllocation};
use crate::validate::{self, Overlap};

struct StreamInner {
    device: Device,
    imp: Box<dyn StreamImpl>,
}

/// An in-order queue of work on one device.
///
/// Every method only *enqueues* (except [`Stream::synchronize`], [`Stream::query`],
/// [`Stream::write`] and [`Stream::read`]) and validates its arguments first: a call
/// that returns an error enqueued nothing. Errors of the work itself surface later, at
/// `synchronize`, `query`, or an event recorded after it.
///
/// Cheap to clone; thread-safe: several threads may enqueue to one stream, and the
/// order between them is the order in which their calls take effect.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

fn check_host_range(host: &HostBuffer, offset: u64, len: u64, what: &str) -> Result<usize> {
    let end = offset.checked_add(len);
    match end {
        Some(end) if end <= host.len() as u64 => Ok(offset as usize),
        _ => Err(Error::invalid(format!(
            "{what} [{offset}..{}) is out of bounds of the host buffer, which has {} bytes",
            offset as u128 + len as u128,
            host.len()
        ))),
    }
}

impl Stream {
    pub(crate) fn new(device: Device, imp: Box<dyn StreamImpl>) -> Self {
        Stream {
            inner: Arc::new(StreamInner { device, imp }),
        }
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The backend implementation, for code that knows the backend (benchmarks, tests).
    pub fn implementation(&self) -> &dyn StreamImpl {
        &*self.inner.imp
    }

    fn imp(&self) -> &dyn StreamImpl {
        &*self.inner.imp
    }

    /// Copies `dst.len` bytes from `src[src_offset..]` to the device.
    pub fn copy_from_host<'a>(
        &self,
        src: &HostBuffer,
        src_offset: u64,
        dst: impl Into<BufferSlice<'a>>,
    ) -> Result<()> {
        let dst = dst.into();
        let off = check_host_range(src, src_offset, dst.len, "the copy's host source")?;
        let Some(dst) = validate::resolve(self.device(), &dst, "the copy's destination")? else {
            return Ok(());
        };
        let src = HostSlice {
            memory: src.share(),
            offset: off,
            len: dst.len as usize,
        };
        self.imp().copy_host_to_device(src, dst)
    }

    /// Copies `src.len` bytes from the device to `dst[dst_offset..]`.
    pub fn copy_to_host<'a>(
        &self,
        src: impl Into<BufferSlice<'a>>,
        dst: &HostBuffer,
        dst_offset: u64,
    ) -> Result<()> {
        let src = src.into();
        let off = check_host_range(dst, dst_offset, src.len, "the copy's host destination")?;
        let Some(src) = validate::resolve(self.device(), &src, "the copy's source")? else {
            return Ok(());
        };
        let dst = HostSlice {
            memory: dst.share(),
            offset: off,
            len: src.len as usize,
        };
        self.imp().copy_device_to_host(src, dst)
    }

    /// Copies between two disjoint ranges of this device of equal length.
    pub fn copy<'a, 'b>(
        &self,
        src: impl Into<BufferSlice<'a>>,
        dst: impl Into<BufferSlice<'b>>,
    ) -> Result<()> {
        let (src, dst) = (src.into(), dst.into());
        if src.len != dst.len {
            return Err(Error::invalid(format!(
                "the copy's source is {} bytes but its destination is {}; give both the same length",
                src.len, dst.len
            )));
        }
        validate::disjoint(&src, &dst, "the copy's source", "its destination")?;
        let s = validate::resolve(self.device(), &src, "the copy's source")?;
        let d = validate::resolve(self.device(), &dst, "the copy's destination")?;
        match (s, d) {
            (Some(s), Some(d)) => self.imp().copy_device_to_device(s, d),
            _ => Ok(()),
        }
    }

    /// Copies `src`, memory of any device of this stream's backend, into `dst` on this
    /// stream's device, without staging through the host. Another device's memory needs
    /// the `peer_access` capability; memory of this device makes it a plain
    /// [`Stream::copy`].
    ///
    /// The copy reads `src` when it runs on this stream: make this stream wait for an event
    /// recorded after the work that writes `src`, and make the source device's streams wait
    /// for an event recorded after the copy before they overwrite `src`.
    pub fn copy_peer<'a, 'b>(
        &self,
        src: impl Into<BufferSlice<'a>>,
        dst: impl Into<BufferSlice<'b>>,
    ) -> Result<()> {
        let (src, dst) = (src.into(), dst.into());
        if src.allocation.device_uid() == self.device().uid() {
            return self.copy(src, dst);
        }
        if src.len != dst.len {
            return Err(Error::invalid(format!(
                "the peer copy's source is {} bytes but its destination is {}; give both the same length",
                src.len, dst.len
            )));
        }
        let here = self.device();
        if src.allocation.device().backend != here.backend() {
            return Err(Error::invalid(format!(
                "the peer copy's source is on {}, another backend than this stream's {}; copy through a host buffer instead",
                src.allocation.device(),
                here.id()
            )));
        }
        if !here.capabilities().peer_access {
            return Err(Error::unsupported(format!(
                "{} cannot copy from other devices directly (its peer_access capability is false); copy through a host buffer instead",
                here.id()
            )));
        }
        let s = validate::resolve_range(&src, "the peer copy's source")?;
        let d = validate::resolve(here, &dst, "the peer copy's destination")?;
        match (s, d) {
            (Some(s), Some(d)) => self.imp().copy_peer(s, d),
            _ => Ok(()),
        }
    }

    /// Sets every element of `dst` to `value` (the dtype is the value's).
    pub fn fill<'a>(&self, dst: impl Into<BufferSlice<'a>>, value: Scalar) -> Result<()> {
        self.enqueue_builtin(self.fill_op(dst.into(), value)?)
    }

    fn fill_op(&self, dst: BufferSlice<'_>, value: Scalar) -> Result<Option<BuiltinOp>> {
        let dtype = value.dtype();
        validate::dtype_supported(self.device(), dtype)?;
        validate::elements(&dst, dtype, "the fill's destination")?;
        let dst = validate::resolve(self.device(), &dst, "the fill's destination")?;
        Ok(dst.map(|dst| BuiltinOp::Fill { dst, value }))
    }

    /// Enqueues a validated builtin (`None`: an empty operation, nothing to do).
    fn enqueue_builtin(&self, op: Option<BuiltinOp>) -> Result<()> {
        match op {
            Some(op) => self.imp().builtin(op),
            None => Ok(()),
        }
    }

    /// Enqueues a standard operation ([`crate::ops`]) on tensors of this stream's
    /// device: `Unsupported` when the device does not list it for the dtype of its main
    /// operand, `InvalidArgument` naming the operand for wrong shapes, dtypes, strides,
    /// parameters, bounds or overlaps. An operation with an empty tensor does nothing.
    /// Errors found while it runs (an index out of range) are the stream's, reported by
    /// the next synchronize.
    pub fn run_op(&self, op: &crate::ops::Op<crate::ops::Tensor<'_>>) -> Result<()> {
        match crate::ops::resolve::resolve(self.device(), op)? {
            Some(raw) => self.imp().run_op(raw),
            None => Ok(()),
        }
    }

    /// `dst[i] = a[i] op b[i]`. `dst` may be the very range of `a` or `b` (in place);
    /// partial overlaps are refused.
    pub fn binary<'a, 'b, 'c>(
        &self,
        op: BinaryOp,
        dtype: DType,
        a: impl Into<BufferSlice<'a>>,
        b: impl Into<BufferSlice<'b>>,
        dst: impl Into<BufferSlice<'c>>,
    ) -> Result<()> {
        self.enqueue_builtin(self.binary_op(op, dtype, a.into(), b.into(), dst.into())?)
    }

    fn binary_op(
        &self,
        op: BinaryOp,
        dtype: DType,
        a: BufferSlice<'_>,
        b: BufferSlice<'_>,
        dst: BufferSlice<'_>,
    ) -> Result<Option<BuiltinOp>> {
        validate::dtype_supported(self.device(), dtype)?;
        let na = validate::elements(&a, dtype, "operand a")?;
        let nb = validate::elements(&b, dtype, "operand b")?;
        let nd = validate::elements(&dst, dtype, "the destination")?;
        validate::same_count(na, nb, "operand a", "operand b")?;
        validate::same_count(na, nd, "operand a", "the destination")?;
        validate::identical_or_disjoint(&a, &dst, "operand a", "the destination")?;
        validate::identical_or_disjoint(&b, &dst, "operand b", "the destination")?;
        validate::identical_or_disjoint(&a, &b, "operand a", "operand b")?;
        let ra = validate::resolve(self.device(), &a, "operand a")?;
        let rb = validate::resolve(self.device(), &b, "operand b")?;
        let rd = validate::resolve(self.device(), &dst, "the destination")?;
        Ok(match (ra, rb, rd) {
            (Some(a), Some(b), Some(dst)) => Some(BuiltinOp::Binary {
                op,
                dtype,
                a,
                b,
                dst,
            }),
            _ => None,
        })
    }

    /// `dst[i] = dst[i] op src[i]`. `src` may be the very range of `dst`.
    pub fn accumulate<'a, 'b>(
        &self,
        op: BinaryOp,
        dtype: DType,
        dst: impl Into<BufferSlice<'a>>,
        src: impl Into<BufferSlice<'b>>,
    ) -> Result<()> {
        self.enqueue_builtin(self.accumulate_op(op, dtype, dst.into(), src.into())?)
    }

    fn accumulate_op(
        &self,
        op: BinaryOp,
        dtype: DType,
        dst: BufferSlice<'_>,
        src: BufferSlice<'_>,
    ) -> Result<Option<BuiltinOp>> {
        validate::dtype_supported(self.device(), dtype)?;
        let nd = validate::elements(&dst, dtype, "the accumulator")?;
        let ns = validate::elements(&src, dtype, "the source")?;
        validate::same_count(nd, ns, "the accumulator", "the source")?;
        validate::identical_or_disjoint(&dst, &src, "the accumulator", "the source")?;
        let rd = validate::resolve(self.device(), &dst, "the accumulator")?;
        let rs = validate::resolve(self.device(), &src, "the source")?;
        Ok(match (rd, rs) {
            (Some(dst), Some(src)) => Some(BuiltinOp::Accumulate {
                op,
                dtype,
                dst,
                src,
            }),
            _ => None,
        })
    }

    /// `dst[i] = src[i] * alpha`, in the dtype of `alpha`. `dst` may be `src` itself.
    pub fn scale<'a, 'b>(
        &self,
        src: impl Into<BufferSlice<'a>>,
        dst: impl Into<BufferSlice<'b>>,
        alpha: Scalar,
    ) -> Result<()> {
        self.enqueue_builtin(self.scale_op(src.into(), dst.into(), alpha)?)
    }

    fn scale_op(
        &self,
        src: BufferSlice<'_>,
        dst: BufferSlice<'_>,
        alpha: Scalar,
    ) -> Result<Option<BuiltinOp>> {
        let dtype = alpha.dtype();
        validate::dtype_supported(self.device(), dtype)?;
        let ns = validate::elements(&src, dtype, "the source")?;
        let nd = validate::elements(&dst, dtype, "the destination")?;
        validate::same_count(ns, nd, "the source", "the destination")?;
        validate::identical_or_disjoint(&src, &dst, "the source", "the destination")?;
        let rs = validate::resolve(self.device(), &src, "the source")?;
        let rd = validate::resolve(self.device(), &dst, "the destination")?;
        Ok(match (rs, rd) {
            (Some(src), Some(dst)) => Some(BuiltinOp::Scale { alpha, src, dst }),
            _ => None,
        })
    }

    /// `dst[i] = src[i] as dst_dtype` with the cast rules of [`crate::dtype`]. The ranges
    /// must be disjoint, or identical when both dtypes have the same size.
    pub fn cast<'a, 'b>(
        &self,
        src: impl Into<BufferSlice<'a>>,
        src_dtype: DType,
        dst: impl Into<BufferSlice<'b>>,
        dst_dtype: DType,
    ) -> Result<()> {
        self.enqueue_builtin(self.cast_op(src.into(), src_dtype, dst.into(), dst_dtype)?)
    }

    fn cast_op(
        &self,
        src: BufferSlice<'_>,
        src_dtype: DType,
        dst: BufferSlice<'_>,
        dst_dtype: DType,
    ) -> Result<Option<BuiltinOp>> {
        validate::dtype_supported(self.device(), src_dtype)?;
        validate::dtype_supported(self.device(), dst_dtype)?;
        let ns = validate::elements(&src, src_dtype, "the cast's source")?;
        let nd = validate::elements(&dst, dst_dtype, "the cast's destination")?;
        validate::same_count(ns, nd, "the cast's source", "its destination")?;
        validate::identical_or_disjoint(&src, &dst, "the cast's source", "its destination")?;
        let rs = validate::resolve(self.device(), &src, "the cast's source")?;
        let rd = validate::resolve(self.device(), &dst, "the cast's destination")?;
        Ok(match (rs, rd) {
            (Some(src), Some(dst)) => Some(BuiltinOp::Cast {
                src,
                src_dtype,
                dst,
                dst_dtype,
            }),
            _ => None,
        })
    }

    /// Launches `kernel` with `args`, which must match its declared parameters.
    pub fn launch(&self, kernel: &Kernel, dims: LaunchDims, args: &[KernelArg<'_>]) -> Result<()> {
        let raw = self.launch_args(kernel, dims, args)?;
        self.imp()
            .launch(kernel.backend_kernel(), kernel.desc(), dims, raw)
    }

    /// Validates a launch; its arguments as the backend receives them.
    fn launch_args(
        &self,
        kernel: &Kernel,
        dims: LaunchDims,
        args: &[KernelArg<'_>],
    ) -> Result<Vec<RawKernelArg>> {
        let desc = kernel.desc();
        if kernel.device() != self.device() {
            return Err(Error::invalid(format!(
                "kernel `{}` was loaded on {}, but this stream is on {}; load it on {} too",
                desc.name,
                kernel.device().id(),
                self.device().id(),
                self.device().id()
            )));
        }
        if dims.grid.contains(&0) || dims.block.contains(&0) {
            return Err(Error::invalid(format!(
                "launch of `{}` has a zero dimension (grid {:?}, block {:?}); every dimension must be at least 1",
                desc.name, dims.grid, dims.block
            )));
        }
        if args.len() != desc.params.len() {
            return Err(Error::invalid(format!(
                "kernel `{}` takes {} arguments but the launch gave {}",
                desc.name,
                desc.params.len(),
                args.len()
            )));
        }
        let mut raw = Vec::with_capacity(args.len());
        for (i, (arg, param)) in args.iter().zip(&desc.params).enumerate() {
            match (arg, param) {
                (KernelArg::Buffer(slice), KernelParam::Buffer(access)) => {
                    // Formatted only for a message.
                    let what = format_args!("argument {i} of `{}`", desc.name);
                    let align = self.device().capabilities().kernel_arg_alignment.max(1);
                    if !slice.offset.is_multiple_of(align) {
                        return Err(Error::invalid(format!(
                            "{what} starts at byte {}, but {} binds kernel buffers only at multiples of {align} bytes (capabilities.kernel_arg_alignment)",
                            slice.offset,
                            self.device().id()
                        )));
                    }
                    raw.push(RawKernelArg::Buffer(
                        validate::resolve(self.device(), slice, what)?,
                        *access,
                    ));
                }
                (KernelArg::Scalar(s), KernelParam::Scalar(dt)) if s.dtype() == *dt => {
                    raw.push(RawKernelArg::Scalar(*s));
                }
                (KernelArg::Scalar(s), KernelParam::Scalar(dt)) => {
                    return Err(Error::invalid(format!(
                        "argument {i} of `{}` must be a {dt} scalar, got {} ({s})",
                        desc.name,
                        s.dtype()
                    )))
                }
                (KernelArg::Scalar(_), KernelParam::Buffer(_)) => {
                    return Err(Error::invalid(format!(
                        "argument {i} of `{}` must be a buffer, got a scalar",
                        desc.name
                    )))
                }
                (KernelArg::Buffer(_), KernelParam::Scalar(dt)) => {
                    return Err(Error::invalid(format!(
                        "argument {i} of `{}` must be a {dt} scalar, got a buffer",
                        desc.name
                    )))
                }
            }
        }
        // A writable buffer may not overlap any other buffer argument.
        for (i, (ai, pi)) in args.iter().zip(&desc.params).enumerate() {
            let (KernelArg::Buffer(si), KernelParam::Buffer(acc_i)) = (ai, pi) else {
                continue;
            };
            for (j, (aj, pj)) in args.iter().zip(&desc.params).enumerate().skip(i + 1) {
                let (KernelArg::Buffer(sj), KernelParam::Buffer(acc_j)) = (aj, pj) else {
                    continue;
                };
                if (acc_i.writes() || acc_j.writes())
                    && validate::overlap(si, sj) != Overlap::Disjoint
                {
                    return Err(Error::invalid(format!(
                        "arguments {i} and {j} of `{}` overlap and at least one is written; pass disjoint ranges",
                        desc.name
                    )));
                }
            }
        }
        Ok(raw)
    }

    /// A batch of operations on this stream (see [`Batch`]).
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            stream: self,
            first: None,
            rest: Vec::new(),
        }
    }

    /// Enqueues `kept` (see [`KeptBatch`]) with its slots bound to `memory`, one
    /// allocation per slot, in order: each on this stream's device, of the size the
    /// slot had when it was kept, none twice. The batch must have been kept on a stream
    /// of this device. The cost on this thread does not grow with the batch's
    /// operations.
    pub fn submit_kept(&self, kept: &KeptBatch, memory: &[&Allocation]) -> Result<()> {
        if kept.device() != self.device() {
            return Err(Error::invalid(format!(
                "the kept batch was validated for {}, but this stream is on {}; keep it on a stream of {}",
                kept.device().id(),
                self.device().id(),
                self.device().id()
            )));
        }
        let raws = self.slot_memory(memory, Some(kept.slot_sizes()))?;
        self.imp().batch_kept(kept, raws)
    }

    /// The backend memory of `memory`, checked to be this device's, distinct, and —
    /// when `sizes` is given — one per slot of those sizes.
    fn slot_memory(
        &self,
        memory: &[&Allocation],
        sizes: Option<&[u64]>,
    ) -> Result<Vec<Option<Arc<dyn RawAllocation>>>> {
        if let Some(sizes) = sizes {
            if sizes.len() != memory.len() {
                return Err(Error::invalid(format!(
                    "the kept batch has {} slots but {} allocations were given; give one per slot, in order",
                    sizes.len(),
                    memory.len()
                )));
            }
        }
        let mut raws = Vec::with_capacity(memory.len());
        let mut ids = Vec::with_capacity(memory.len());
        for (i, a) in memory.iter().enumerate() {
            if a.device_uid() != self.device().uid() {
                return Err(Error::invalid(format!(
                    "slot {i}: allocation #{} is on {}, but this stream is on {}; use memory of {}",
                    a.id(),
                    a.device(),
                    self.device().id(),
                    self.device().id()
                )));
            }
            if let Some(size) = sizes.and_then(|s| s.get(i)) {
                if a.size() != *size {
                    return Err(Error::invalid(format!(
                        "slot {i}: allocation #{} has {} bytes, but the slot was kept over {size}; bind memory of the same size",
                        a.id(),
                        a.size()
                    )));
                }
            }
            ids.push((a.id(), i));
            raws.push(a.raw()?);
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::invalid(format!(
                "allocation #{} is given for slots {} and {}; every slot needs its own memory",
                w[0].0, w[0].1, w[1].1
            )));
        }
        Ok(raws)
    }

    /// Records an event at the current end of the stream.
    pub fn record_event(&self) -> Result<Event> {
        let imp = self.imp().record_event()?;
        Ok(Event::new(self.device().clone(), imp))
    }

    /// Makes work enqueued after this call wait until `event` completes. The event may
    /// come from any stream of any device of any backend; waits the backend cannot do
    /// natively are bridged on the host.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        if event.device().backend() == self.device().backend() {
            self.imp().wait_event(event.implementation())
        } else {
            self.imp().wait_foreign_event(event.clone().into())
        }
    }

    /// Makes work enqueued after this call wait until `event` is completed; if it is
    /// failed, that work fails with [`crate::Error::Aborted`] carrying its message
    /// (reported by the next [`Stream::synchronize`] or [`Stream::query`], and by
    /// events recorded after it). Works on every device; bridged on the host.
    pub fn wait_user_event(&self, event: &crate::UserEvent) -> Result<()> {
        self.imp().wait_foreign_event(event.foreign())
    }

    /// Blocks until all enqueued work is done; returns the first error of that work
    /// since the last report.
    pub fn synchronize(&self) -> Result<()> {
        self.imp().synchronize()
    }

    /// Whether all enqueued work is done (never blocks).
    pub fn query(&self) -> Result<bool> {
        self.imp().query()
    }

    /// Writes `data` to `dst` and waits for it: a blocking convenience over
    /// [`Stream::copy_from_host`] through a temporary host buffer.
    pub fn write<'a>(&self, dst: impl Into<BufferSlice<'a>>, data: &[u8]) -> Result<()> {
        let dst = dst.into();
        if data.len() as u64 != dst.len {
            return Err(Error::invalid(format!(
                "write of {} bytes into a {}-byte range; give data exactly as long as the range",
                data.len(),
                dst.len
            )));
        }
        let host = HostBuffer::from_bytes(data)?;
        self.copy_from_host(&host, 0, dst)?;
        self.synchronize()
    }

    /// Reads `src` into a new vector and waits for it: a blocking convenience over
    /// [`Stream::copy_to_host`] through a temporary host buffer.
    pub fn read<'a>(&self, src: impl Into<BufferSlice<'a>>) -> Result<Vec<u8>> {
        let src = src.into();
        let len = usize::try_from(src.len).map_err(|_| {
            Error::invalid(format!(
                "cannot read {} bytes into host memory on this platform",
                src.len
            ))
        })?;
        let mut host = HostBuffer::new(len)?;
        self.copy_to_host(src, &host, 0)?;
        self.synchronize()?;
        Ok(host.as_slice()?.to_vec())
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.device().id().to_string())
            .finish()
    }
}

/// Operations gathered to be enqueued on a stream together: [`Batch::submit`] hands
/// them to the backend as one submission (one job on a host stream) instead of one per
/// operation, which is what enqueuing many small operations costs. Each operation is
/// validated as it is added, exactly as the [`Stream`] method of the same name
/// validates it (an operation that is refused is not added); nothing is enqueued
/// before `submit`, and dropping the batch enqueues nothing. Once submitted, the
/// operations behave as if enqueued one after another by those methods.
pub struct Batch<'s> {
    stream: &'s Stream,
    /// The first operation, kept inline: a batch of one allocates nothing.
    first: Option<BatchOp>,
    /// The operations after the first.
    rest: Vec<BatchOp>,
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("device", &self.stream.device().id().to_string())
            .field("operations", &self.len())
            .finish()
    }
}

impl Batch<'_> {
    /// Operations added so far.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Whether none was added.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn add(&mut self, op: BatchOp) {
        if self.first.is_none() {
            self.first = Some(op);
        } else {
            self.rest.push(op);
        }
    }

    fn push(&mut self, op: Option<BuiltinOp>) {
        if let Some(op) = op {
            self.add(BatchOp::Builtin(op));
        }
    }

    /// All the operations, in order.
    fn into_ops(self) -> Vec<BatchOp> {
        match self.first {
            None => Vec::new(),
            Some(first) => {
                let mut ops = Vec::with_capacity(1 + self.rest.len());
                ops.push(first);
                ops.extend(self.rest);
                ops
            }
        }
    }

    /// Adds [`Stream::fill`].
    pub fn fill<'a>(&mut self, dst: impl Into<BufferSlice<'a>>, value: Scalar) -> Result<()> {
        let op = self.stream.fill_op(dst.into(), value)?;
        self.push(op);
        Ok(())
    }

    /// Adds [`Stream::binary`].
    pub fn binary<'a, 'b, 'c>(
        &mut self,
        op: BinaryOp,
        dtype: DType,
        a: impl Into<BufferSlice<'a>>,
        b: impl Into<BufferSlice<'b>>,
        dst: impl Into<BufferSlice<'c>>,
    ) -> Result<()> {
        let op = self
            .stream
            .binary_op(op, dtype, a.into(), b.into(), dst.into())?;
        self.push(op);
        Ok(())
    }

    /// Adds [`Stream::accumulate`].
    pub fn accumulate<'a, 'b>(
        &mut self,
        op: BinaryOp,
        dtype: DType,
        dst: impl Into<BufferSlice<'a>>,
        src: impl Into<BufferSlice<'b>>,
    ) -> Result<()> {
        let op = self
            .stream
            .accumulate_op(op, dtype, dst.into(), src.into())?;
        self.push(op);
        Ok(())
    }

    /// Adds [`Stream::scale`].
    pub fn scale<'a, 'b>(
        &mut self,
        src: impl Into<BufferSlice<'a>>,
        dst: impl Into<BufferSlice<'b>>,
        alpha: Scalar,
    ) -> Result<()> {
        let op = self.stream.scale_op(src.into(), dst.into(), alpha)?;
        self.push(op);
        Ok(())
    }

    /// Adds [`Stream::cast`].
    pub fn cast<'a, 'b>(
        &mut self,
        src: impl Into<BufferSlice<'a>>,
        src_dtype: DType,
        dst: impl Into<BufferSlice<'b>>,
        dst_dtype: DType,
    ) -> Result<()> {
        let op = self
            .stream
            .cast_op(src.into(), src_dtype, dst.into(), dst_dtype)?;
        self.push(op);
        Ok(())
    }

    /// Adds [`Stream::run_op`] (an operation with an empty tensor adds nothing).
    pub fn run_op(&mut self, op: &crate::ops::Op<crate::ops::Tensor<'_>>) -> Result<()> {
        if let Some(raw) = crate::ops::resolve::resolve(self.stream.device(), op)? {
            self.add(BatchOp::Op(Box::new(raw)));
        }
        Ok(())
    }

    /// Adds [`Stream::launch`].
    pub fn launch(
        &mut self,
        kernel: &Kernel,
        dims: LaunchDims,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        let args = self.stream.launch_args(kernel, dims, args)?;
        self.add(BatchOp::Launch {
            kernel: kernel.clone(),
            dims,
            args,
        });
        Ok(())
    }

    /// Keeps the operations to enqueue many times (see [`KeptBatch`]) over `memory`:
    /// the allocations they use, each becoming a slot, by position. Fails if an
    /// operation uses an allocation that is not listed, or one is listed twice. Nothing
    /// is enqueued.
    pub fn keep(self, memory: &[&Allocation]) -> Result<KeptBatch> {
        let raws = self.stream.slot_memory(memory, None)?;
        let memory: Vec<_> = raws
            .into_iter()
            .zip(memory)
            .map(|(raw, a)| (raw, a.size()))
            .collect();
        let device = self.stream.device().clone();
        KeptBatch::new(device, self.into_ops(), &memory)
    }

    /// Enqueues the operations, in the order they were added.
    pub fn submit(self) -> Result<()> {
        let stream = self.stream;
        if !self.rest.is_empty() {
            return stream.imp().batch(self.into_ops());
        }
        match self.first {
            None => Ok(()),
            Some(op) => op.enqueue_alone(stream.imp()),
        }
    }
}
