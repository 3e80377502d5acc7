//! [`Stream`]: the validated handle to an in-order queue of device work.

use std::fmt;
use std::sync::Arc;

use crate::backend::{BuiltinOp, StreamImpl};
use crate::device::{Device, Kernel};
use crate::dtype::{BinaryOp, DType, Scalar};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::kernel::{KernelArg, KernelParam, LaunchDims, RawKernelArg};
use crate::memory::{BufferSlice, HostBuffer, HostSlice};
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
        let dst = dst.into();
        let dtype = value.dtype();
        validate::dtype_supported(self.device(), dtype)?;
        validate::elements(&dst, dtype, "the fill's destination")?;
        let Some(dst) = validate::resolve(self.device(), &dst, "the fill's destination")? else {
            return Ok(());
        };
        self.imp().builtin(BuiltinOp::Fill { dst, value })
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
        let (a, b, dst) = (a.into(), b.into(), dst.into());
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
        match (ra, rb, rd) {
            (Some(a), Some(b), Some(dst)) => self.imp().builtin(BuiltinOp::Binary {
                op,
                dtype,
                a,
                b,
                dst,
            }),
            _ => Ok(()),
        }
    }

    /// `dst[i] = dst[i] op src[i]`. `src` may be the very range of `dst`.
    pub fn accumulate<'a, 'b>(
        &self,
        op: BinaryOp,
        dtype: DType,
        dst: impl Into<BufferSlice<'a>>,
        src: impl Into<BufferSlice<'b>>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        validate::dtype_supported(self.device(), dtype)?;
        let nd = validate::elements(&dst, dtype, "the accumulator")?;
        let ns = validate::elements(&src, dtype, "the source")?;
        validate::same_count(nd, ns, "the accumulator", "the source")?;
        validate::identical_or_disjoint(&dst, &src, "the accumulator", "the source")?;
        let rd = validate::resolve(self.device(), &dst, "the accumulator")?;
        let rs = validate::resolve(self.device(), &src, "the source")?;
        match (rd, rs) {
            (Some(dst), Some(src)) => self.imp().builtin(BuiltinOp::Accumulate {
                op,
                dtype,
                dst,
                src,
            }),
            _ => Ok(()),
        }
    }

    /// `dst[i] = src[i] * alpha`, in the dtype of `alpha`. `dst` may be `src` itself.
    pub fn scale<'a, 'b>(
        &self,
        src: impl Into<BufferSlice<'a>>,
        dst: impl Into<BufferSlice<'b>>,
        alpha: Scalar,
    ) -> Result<()> {
        let (src, dst) = (src.into(), dst.into());
        let dtype = alpha.dtype();
        validate::dtype_supported(self.device(), dtype)?;
        let ns = validate::elements(&src, dtype, "the source")?;
        let nd = validate::elements(&dst, dtype, "the destination")?;
        validate::same_count(ns, nd, "the source", "the destination")?;
        validate::identical_or_disjoint(&src, &dst, "the source", "the destination")?;
        let rs = validate::resolve(self.device(), &src, "the source")?;
        let rd = validate::resolve(self.device(), &dst, "the destination")?;
        match (rs, rd) {
            (Some(src), Some(dst)) => self.imp().builtin(BuiltinOp::Scale { alpha, src, dst }),
            _ => Ok(()),
        }
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
        let (src, dst) = (src.into(), dst.into());
        validate::dtype_supported(self.device(), src_dtype)?;
        validate::dtype_supported(self.device(), dst_dtype)?;
        let ns = validate::elements(&src, src_dtype, "the cast's source")?;
        let nd = validate::elements(&dst, dst_dtype, "the cast's destination")?;
        validate::same_count(ns, nd, "the cast's source", "its destination")?;
        validate::identical_or_disjoint(&src, &dst, "the cast's source", "its destination")?;
        let rs = validate::resolve(self.device(), &src, "the cast's source")?;
        let rd = validate::resolve(self.device(), &dst, "the cast's destination")?;
        match (rs, rd) {
            (Some(src), Some(dst)) => self.imp().builtin(BuiltinOp::Cast {
                src,
                src_dtype,
                dst,
                dst_dtype,
            }),
            _ => Ok(()),
        }
    }

    /// Launches `kernel` with `args`, which must match its declared parameters.
    pub fn launch(&self, kernel: &Kernel, dims: LaunchDims, args: &[KernelArg<'_>]) -> Result<()> {
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
        self.imp().launch(kernel.implementation(), desc, dims, raw)
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
            self.imp().wait_foreign_event(event.clone())
        }
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
