//! The one place where arguments are checked before they reach a backend.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{BufferSlice, RawSlice};

/// Checks that `slice` is usable on `device` and resolves it. `Ok(None)` for an empty
/// slice, which needs no backend work.
pub(crate) fn resolve(
    device: &Device,
    slice: &BufferSlice<'_>,
    what: impl std::fmt::Display,
) -> Result<Option<RawSlice>> {
    let alloc = slice.allocation;
    if alloc.device_uid() != device.uid() {
        return Err(Error::invalid(format!(
            "{what} is allocation #{} on {}, but this stream is on {}; use memory of {} or copy the data there first",
            alloc.id(),
            alloc.device(),
            device.id(),
            device.id()
        )));
    }
    resolve_range(slice, what)
}

/// Checks that `slice` is live and in bounds (not which device owns it) and resolves it.
/// `Ok(None)` for an empty slice.
pub(crate) fn resolve_range(
    slice: &BufferSlice<'_>,
    what: impl std::fmt::Display,
) -> Result<Option<RawSlice>> {
    let alloc = slice.allocation;
    let raw = alloc.raw()?;
    let end = slice.offset.checked_add(slice.len);
    match end {
        Some(end) if end <= alloc.size() => {}
        _ => {
            return Err(Error::invalid(format!(
                "{what} [{}..{}) is out of bounds of allocation #{} on {}, which has {} bytes; keep offset + length within the allocation",
                slice.offset,
                slice.offset as u128 + slice.len as u128,
                alloc.id(),
                alloc.device(),
                alloc.size()
            )))
        }
    }
    if slice.len == 0 {
        return Ok(None);
    }
    match raw {
        Some(memory) => Ok(Some(RawSlice {
            memory,
            offset: slice.offset,
            len: slice.len,
        })),
        // A zero-size allocation has no memory, and the bounds check above only lets
        // empty slices of it through.
        None => Ok(None),
    }
}

/// Checks that the device supports `dtype` for builtin operations.
pub(crate) fn dtype_supported(device: &Device, dtype: DType) -> Result<()> {
    if device.capabilities().supports_dtype(dtype) {
        Ok(())
    } else {
        Err(Error::unsupported(format!(
            "{} has no builtin operations on {dtype}; it supports {}",
            device.id(),
            device
                .capabilities()
                .dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// Checks that `slice` holds whole, aligned `dtype` elements and returns their count.
pub(crate) fn elements(slice: &BufferSlice<'_>, dtype: DType, what: &str) -> Result<u64> {
    let size = dtype.size() as u64;
    if !slice.offset.is_multiple_of(size) {
        return Err(Error::invalid(format!(
            "{what} starts at byte offset {}, which is not a multiple of the {dtype} element size ({size} bytes); align offsets to elements",
            slice.offset
        )));
    }
    if !slice.len.is_multiple_of(size) {
        return Err(Error::invalid(format!(
            "{what} is {} bytes long, which is not a whole number of {dtype} elements ({size} bytes each)",
            slice.len
        )));
    }
    Ok(slice.len / size)
}

/// Checks that two element counts agree.
pub(crate) fn same_count(a: u64, b: u64, what_a: &str, what_b: &str) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what_a} has {a} elements but {what_b} has {b}; elementwise operations need equal element counts"
        )))
    }
}

/// How two slices relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    Disjoint,
    Identical,
    Partial,
}

pub(crate) fn overlap(a: &BufferSlice<'_>, b: &BufferSlice<'_>) -> Overlap {
    if a.allocation.id() != b.allocation.id() || a.len == 0 || b.len == 0 {
        return Overlap::Disjoint;
    }
    if a.offset == b.offset && a.len == b.len {
        return Overlap::Identical;
    }
    let (a0, a1) = (a.offset, a.offset + a.len);
    let (b0, b1) = (b.offset, b.offset + b.len);
    if a0 < b1 && b0 < a1 {
        Overlap::Partial
    } else {
        Overlap::Disjoint
    }
}

/// Checks that two slices of one operation are identical or disjoint.
pub(crate) fn identical_or_disjoint(
    a: &BufferSlice<'_>,
    b: &BufferSlice<'_>,
    what_a: &str,
    what_b: &str,
) -> Result<()> {
    if overlap(a, b) == Overlap::Partial {
        return Err(Error::invalid(format!(
            "{what_a} ({a}) partly overlaps {what_b} ({b}); use the same range for an in-place operation or disjoint ranges"
        )));
    }
    Ok(())
}

/// Checks that two slices do not overlap at all.
pub(crate) fn disjoint(
    a: &BufferSlice<'_>,
    b: &BufferSlice<'_>,
    what_a: &str,
    what_b: &str,
) -> Result<()> {
    if overlap(a, b) != Overlap::Disjoint {
        return Err(Error::invalid(format!(
            "{what_a} ({a}) overlaps {what_b} ({b}); use disjoint ranges (copy through a temporary for overlapping moves)"
        )));
    }
    Ok(())
}
