//! [`Layout`]: the dtype, shape and strides of a tensor view on a buffer.

use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The largest rank a standard operation's tensor may have.
pub const MAX_RANK: usize = 4;

/// A tensor's element type, shape and strides. Strides count elements (not bytes) and
/// may be 0 on an input to broadcast it along that dimension; element `[i0, i1, …]`
/// lies `Σ ik·stride[k]` elements after element `[0, 0, …]`. Rank 0 (a scalar) is not
/// used: a single value is shape `[1]`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The element type.
    pub dtype: DType,
    rank: u8,
    dims: [u64; MAX_RANK],
    strides: [u64; MAX_RANK],
}

impl Layout {
    /// A row-major (C order), densely packed layout of `dims`.
    pub fn contiguous(dtype: DType, dims: &[u64]) -> Result<Layout> {
        let mut strides = [0u64; MAX_RANK];
        let mut step = 1u64;
        check_rank(dims)?;
        for k in (0..dims.len()).rev() {
            strides[k] = step;
            step = step
                .checked_mul(dims[k].max(1))
                .ok_or_else(|| too_large(dims))?;
        }
        Layout::strided(dtype, dims, &strides[..dims.len()])
    }

    /// A layout with explicit strides (in elements), one per dimension.
    pub fn strided(dtype: DType, dims: &[u64], strides: &[u64]) -> Result<Layout> {
        check_rank(dims)?;
        if strides.len() != dims.len() {
            return Err(Error::invalid(format!(
                "a tensor of shape {dims:?} needs {} strides, not {}; give one stride per dimension",
                dims.len(),
                strides.len()
            )));
        }
        let mut layout = Layout {
            dtype,
            rank: dims.len() as u8,
            dims: [0; MAX_RANK],
            strides: [0; MAX_RANK],
        };
        layout.dims[..dims.len()].copy_from_slice(dims);
        layout.strides[..dims.len()].copy_from_slice(strides);
        // Every size the operations compute must fit: the element count and the span.
        layout.checked_elements().ok_or_else(|| too_large(dims))?;
        layout
            .checked_span_bytes()
            .ok_or_else(|| Error::invalid(format!("{layout} spans more than 2^64 bytes")))?;
        Ok(layout)
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// The shape.
    pub fn dims(&self) -> &[u64] {
        &self.dims[..self.rank()]
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[u64] {
        &self.strides[..self.rank()]
    }

    /// The number of elements (the product of the dims; 0 when one is 0).
    pub fn elements(&self) -> u64 {
        self.dims().iter().product()
    }

    fn checked_elements(&self) -> Option<u64> {
        self.dims().iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }

    /// Elements from the first to one past the last one addressed (0 when empty).
    pub fn span_elements(&self) -> u64 {
        self.checked_span_elements().unwrap_or(u64::MAX)
    }

    fn checked_span_elements(&self) -> Option<u64> {
        if self.elements() == 0 {
            return Some(0);
        }
        self.dims()
            .iter()
            .zip(self.strides())
            .try_fold(1u64, |acc, (&d, &s)| {
                acc.checked_add((d - 1).checked_mul(s)?)
            })
    }

    fn checked_span_bytes(&self) -> Option<u64> {
        self.checked_span_elements()?
            .checked_mul(self.dtype.size() as u64)
    }

    /// Bytes from the first to one past the last element addressed (0 when empty).
    pub fn span_bytes(&self) -> u64 {
        self.checked_span_bytes().unwrap_or(u64::MAX)
    }

    /// Whether the elements are packed in row-major order with no gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut step = 1u64;
        for k in (0..self.rank()).rev() {
            if self.dims[k] != 1 && self.strides[k] != step {
                return false;
            }
            step = step.saturating_mul(self.dims[k]);
        }
        true
    }

    /// Whether no two indices address the same element (needed of every tensor an
    /// operation writes): true when, ordered by stride, each dimension's stride steps
    /// over everything the smaller ones address.
    pub fn is_one_to_one(&self) -> bool {
        let mut order: Vec<usize> = (0..self.rank()).filter(|&k| self.dims[k] > 1).collect();
        order.sort_by_key(|&k| self.strides[k]);
        let mut reach = 1u64; // elements covered by the dimensions so far
        for k in order {
            if self.strides[k] < reach {
                return false;
            }
            reach = self.strides[k]
                .saturating_mul(self.dims[k] - 1)
                .saturating_add(reach);
        }
        true
    }

    /// The same elements with dimensions `i` and `j` swapped (a transposed view).
    pub fn transposed(mut self, i: usize, j: usize) -> Result<Layout> {
        if i >= self.rank() || j >= self.rank() {
            return Err(Error::invalid(format!(
                "cannot swap dimensions {i} and {j} of {self}: it has {} dimensions",
                self.rank()
            )));
        }
        self.dims.swap(i, j);
        self.strides.swap(i, j);
        Ok(self)
    }

    /// The element offset (from element 0) of the `n`-th element in row-major order.
    pub fn offset_of_nth(&self, mut n: u64) -> u64 {
        let mut offset = 0u64;
        for k in (0..self.rank()).rev() {
            let d = self.dims[k].max(1);
            offset += (n % d) * self.strides[k];
            n /= d;
        }
        offset
    }

    /// The element offsets of every element, in row-major order.
    pub fn offsets(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.elements()).map(move |n| self.offset_of_nth(n))
    }
}

fn check_rank(dims: &[u64]) -> Result<()> {
    if dims.is_empty() || dims.len() > MAX_RANK {
        return Err(Error::invalid(format!(
            "a tensor has 1 to {MAX_RANK} dimensions, not {} ({dims:?}); use shape [1] for a single value",
            dims.len()
        )));
    }
    Ok(())
}

fn too_large(dims: &[u64]) -> Error {
    Error::invalid(format!(
        "a tensor of shape {dims:?} has more than 2^64 elements"
    ))
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.dims())?;
        if !self.is_contiguous() {
            write!(f, " strides {:?}", self.strides())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Layout({} {:?} strides {:?})",
            self.dtype,
            self.dims(),
            self.strides()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_and_spans() {
        let l = Layout::contiguous(DType::F32, &[2, 3, 4]).unwrap();
        assert_eq!(l.strides(), &[12, 4, 1]);
        assert_eq!(l.elements(), 24);
        assert_eq!(l.span_bytes(), 96);
        assert!(l.is_contiguous() && l.is_one_to_one());
        let t = l.transposed(1, 2).unwrap();
        assert_eq!(t.dims(), &[2, 4, 3]);
        assert!(!t.is_contiguous() && t.is_one_to_one());
        assert_eq!(t.offset_of_nth(1), 4);
    }

    #[test]
    fn broadcast_is_not_one_to_one() {
        let l = Layout::strided(DType::F32, &[3, 4], &[0, 1]).unwrap();
        assert!(!l.is_one_to_one());
        assert_eq!(l.span_elements(), 4);
        let overlapping = Layout::strided(DType::F32, &[3, 4], &[2, 1]).unwrap();
        assert!(!overlapping.is_one_to_one());
        let gapped = Layout::strided(DType::F32, &[3, 4], &[5, 1]).unwrap();
        assert!(gapped.is_one_to_one() && !gapped.is_contiguous());
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert!(Layout::contiguous(DType::F32, &[]).is_err());
        assert!(Layout::contiguous(DType::F32, &[1, 1, 1, 1, 1]).is_err());
        assert!(Layout::contiguous(DType::F32, &[u64::MAX, 2]).is_err());
        assert!(Layout::strided(DType::F32, &[2], &[1, 1]).is_err());
        assert!(Layout::strided(DType::F64, &[3], &[u64::MAX / 4]).is_err());
        let empty = Layout::contiguous(DType::F32, &[0, 5]).unwrap();
        assert_eq!((empty.elements(), empty.span_bytes()), (0, 0));
    }
}
