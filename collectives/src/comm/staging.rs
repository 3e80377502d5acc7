//! Host staging for shared-memory execution: ranks whose memory the CPU cannot address.
//!
//! A rank whose device is not host addressable, but whose every link to the other ranks
//! goes through host memory anyway (different backends, or no peer access), can still
//! take part in shared-memory execution when its stream is idle: it downloads its input
//! into a host buffer and waits for that (the stream was idle, so this waits for the copy
//! alone), the shares read and write the host copy, and after the operation the rank
//! uploads its result and waits for it, so the operation is complete on return like
//! every shared-memory operation.
//! Its data then crosses the slow link once each way, the least possible, and the
//! reduction runs on the CPU instead of an emulated or distant device.
//!
//! The buffers are the rank's own, reused across operations.

use xpu_hal::{HostBuffer, Result, Stream};

use super::algorithms::RankBuffers;
use super::shared_memory::{HostBuffers, HostRange};
use super::transport::Slice;

/// The most bytes a rank stages for one operation; larger operations are enqueued.
pub(crate) const STAGE_LIMIT: u64 = 1 << 30;

/// A rank's staging buffers during one operation.
pub(crate) struct Staged {
    buffers: Vec<HostBuffer>,
    /// Where the result is uploaded from: (buffer, offset in it, destination).
    upload: Option<(usize, u64, Slice)>,
}

/// Takes a buffer of at least `len` bytes from `pool`, or makes one.
fn buffer(pool: &mut Vec<HostBuffer>, len: u64) -> Option<HostBuffer> {
    let len = usize::try_from(len).ok()?;
    match pool.iter().position(|b| b.len() >= len) {
        Some(i) => Some(pool.swap_remove(i)),
        None => HostBuffer::new(len.max(1)).ok(),
    }
}

/// The address of a staging buffer's first byte, if no operation uses it.
fn address(b: &mut HostBuffer) -> Option<*mut u8> {
    b.as_mut_slice().ok().map(<[u8]>::as_mut_ptr)
}

/// Downloads the rank's input into host buffers taken from `pool` and returns the host
/// ranges for the shares; `None` (and the buffers back in `pool`) when it cannot.
/// `recv_is_input` says that the receive buffer holds input too (the root of an
/// in-place broadcast), so it is downloaded as well.
pub(crate) fn stage(
    stream: &Stream,
    buffers: &RankBuffers,
    recv_is_input: bool,
    pool: &mut Vec<HostBuffer>,
) -> Option<(HostBuffers, Staged)> {
    let mut staged = Staged {
        buffers: Vec::with_capacity(2),
        upload: None,
    };
    let result = fill(stream, buffers, recv_is_input, pool, &mut staged);
    if result.is_none() {
        pool.append(&mut staged.buffers);
    }
    result.map(|h| (h, staged))
}

fn fill(
    stream: &Stream,
    buffers: &RankBuffers,
    recv_is_input: bool,
    pool: &mut Vec<HostBuffer>,
    staged: &mut Staged,
) -> Option<HostBuffers> {
    let total =
        buffers.send.as_ref().map_or(0, |s| s.len) + buffers.recv.as_ref().map_or(0, |r| r.len);
    if total > STAGE_LIMIT {
        return None;
    }
    let host = match (&buffers.send, &buffers.recv) {
        // In place, or the send buffer inside the receive buffer: one copy of the span.
        (Some(s), Some(r)) if s.overlaps(r) => {
            let lo = s.offset.min(r.offset);
            let hi = (s.offset + s.len).max(r.offset + r.len);
            let mut b = buffer(pool, hi - lo)?;
            let base = address(&mut b)?;
            stream
                .copy_to_host(s.alloc.slice(lo, hi - lo), &b, 0)
                .ok()?;
            staged.buffers.push(b);
            staged.upload = Some((0, r.offset - lo, r.clone()));
            HostBuffers {
                send: Some(HostRange::staged(
                    base.wrapping_add((s.offset - lo) as usize),
                    s.len,
                )),
                recv: Some(HostRange::staged(
                    base.wrapping_add((r.offset - lo) as usize),
                    r.len,
                )),
            }
        }
        (send, recv) => {
            let mut host = HostBuffers::default();
            if let Some(s) = send {
                let mut b = buffer(pool, s.len)?;
                let base = address(&mut b)?;
                stream.copy_to_host(s.buf(), &b, 0).ok()?;
                staged.buffers.push(b);
                host.send = Some(HostRange::staged(base, s.len));
            }
            if let Some(r) = recv {
                // Every byte of a separate receive buffer is written: nothing to download,
                // unless it is also the input.
                let mut b = buffer(pool, r.len)?;
                let base = address(&mut b)?;
                if recv_is_input {
                    stream.copy_to_host(r.buf(), &b, 0).ok()?;
                }
                staged.upload = Some((staged.buffers.len(), 0, r.clone()));
                staged.buffers.push(b);
                host.recv = Some(HostRange::staged(base, r.len));
            }
            host
        }
    };
    stream.synchronize().ok()?;
    Some(host)
}

impl Staged {
    /// After the shares ran: uploads the result and waits for it, so that the operation
    /// is complete when the call returns, as shared-memory operations are (and the
    /// stream is idle for the next one).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        if let Some((i, offset, dst)) = &self.upload {
            if let Some(b) = self.buffers.get(*i) {
                stream.copy_from_host(b, *offset, dst.buf())?;
                stream.synchronize()?;
            }
        }
        Ok(())
    }

    /// The buffers, for reuse by the rank's next operation.
    pub fn into_buffers(self) -> Vec<HostBuffer> {
        self.buffers
    }
}
