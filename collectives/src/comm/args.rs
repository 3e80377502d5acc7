//! Validation of an operation's arguments on one rank, before it arrives anywhere: each
//! check returns an [`Error::InvalidArgument`] (or, for a dtype the device lacks,
//! [`Error::Unsupported`]) that says what was wrong and what to pass instead. Buffers stay
//! borrowed from the caller ([`Args`]) until a path needs them owned.

use xpu_hal::{BufferSlice, DType, Device, Error, Result};

use super::algorithms::RankBuffers;
use super::transport::Slice;

/// An operation's validated buffers, borrowed from the caller: the small path reads
/// them during the call, and every other path takes owned [`RankBuffers`] from them.
#[derive(Clone, Copy)]
pub(super) struct Args<'a> {
    pub send: Option<BufferSlice<'a>>,
    pub recv: Option<BufferSlice<'a>>,
}

impl<'a> Args<'a> {
    pub const NONE: Args<'static> = Args {
        send: None,
        recv: None,
    };

    pub fn both(send: BufferSlice<'a>, recv: BufferSlice<'a>) -> Self {
        Args {
            send: Some(send),
            recv: Some(recv),
        }
    }

    pub fn owned(&self) -> RankBuffers {
        RankBuffers {
            send: self.send.as_ref().map(Slice::from_buffer),
            recv: self.recv.as_ref().map(Slice::from_buffer),
        }
    }
}

/// Byte-range arithmetic on slices: the argument checks, and the transport's owned
/// slices through [`Slice::buf`]. Whether two ranges overlap is the HAL's rule
/// ([`BufferSlice::overlaps`]: an empty range overlaps nothing).
pub(super) trait Range<'a> {
    /// `[offset, offset + len)` of this range.
    fn sub(&self, offset: u64, len: u64) -> BufferSlice<'a>;
    /// Whether both are the same bytes.
    fn same_as(&self, other: &BufferSlice<'_>) -> bool;
}

impl<'a> Range<'a> for BufferSlice<'a> {
    fn sub(&self, offset: u64, len: u64) -> BufferSlice<'a> {
        self.allocation.slice(self.offset + offset, len)
    }

    fn same_as(&self, other: &BufferSlice<'_>) -> bool {
        self.allocation.id() == other.allocation.id()
            && self.offset == other.offset
            && self.len == other.len
    }
}

/// Checks that a slice is usable by this rank: on its device, in bounds, not freed.
pub(super) fn check_slice<'a>(
    device: &Device,
    b: &BufferSlice<'a>,
    what: &str,
) -> Result<BufferSlice<'a>> {
    if !b.allocation.belongs_to(device) {
        return Err(Error::invalid(format!(
            "the {what} is on {}, but this rank's device is {}; pass memory of the rank's own device",
            b.allocation.device(),
            device.id()
        )));
    }
    if b.allocation.is_freed() {
        return Err(Error::invalid(format!(
            "the {what} was freed; keep it alive until the operation is enqueued"
        )));
    }
    match b.offset.checked_add(b.len) {
        Some(end) if end <= b.allocation.size() => Ok(*b),
        _ => Err(Error::invalid(format!(
            "the {what} [{}..+{}) is out of bounds of its {}-byte allocation",
            b.offset,
            b.len,
            b.allocation.size()
        ))),
    }
}

pub(super) fn check_len(len: u64, expected: u64, what: &str) -> Result<()> {
    if len != expected {
        return Err(Error::invalid(format!(
            "the {what} is {len} bytes but must be {expected}"
        )));
    }
    Ok(())
}

pub(super) fn check_dtype(device: &Device, bytes: u64, dtype: DType, what: &str) -> Result<()> {
    if !bytes.is_multiple_of(dtype.size() as u64) {
        return Err(Error::invalid(format!(
            "the {what} is {bytes} bytes, not a whole number of {} elements ({} bytes each)",
            dtype.name(),
            dtype.size()
        )));
    }
    if !device.capabilities().supports_dtype(dtype) {
        return Err(Error::unsupported(format!(
            "{} cannot reduce {} (not in its builtin dtypes); use a dtype every rank supports",
            device.id(),
            dtype.name()
        )));
    }
    Ok(())
}

/// Send and receive must be identical (in place) or disjoint.
pub(super) fn check_aliasing(send: &BufferSlice<'_>, recv: &BufferSlice<'_>) -> Result<()> {
    if send.overlaps(recv) && !send.same_as(recv) {
        return Err(Error::invalid(
            "the send and receive buffers partly overlap; pass the same range (in place) or disjoint ranges",
        ));
    }
    Ok(())
}

/// Checks an all-reduce's buffers on this rank: both usable, equally long, a whole
/// number of `dtype` elements, identical or disjoint.
pub(super) fn check_all_reduce<'a, 'b>(
    device: &Device,
    send: &BufferSlice<'a>,
    recv: &BufferSlice<'b>,
    dtype: DType,
) -> Result<(BufferSlice<'a>, BufferSlice<'b>)> {
    let s = check_slice(device, send, "send buffer")?;
    let r = check_slice(device, recv, "receive buffer")?;
    check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
    check_dtype(device, s.len, dtype, "send buffer")?;
    check_aliasing(&s, &r)?;
    Ok((s, r))
}
