//! The tensor types of [`super::Op`]: [`Tensor`] above the HAL, [`RawTensor`] below it.

use std::fmt;

use super::layout::Layout;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::{Allocation, BufferSlice, RawSlice};

/// Anything with a [`Layout`]: what [`super::check`] and the reference need of a tensor.
pub trait HasLayout {
    /// The tensor's layout.
    fn layout(&self) -> &Layout;
}

impl HasLayout for Layout {
    fn layout(&self) -> &Layout {
        self
    }
}

impl<T: HasLayout> HasLayout for &T {
    fn layout(&self) -> &Layout {
        (**self).layout()
    }
}

/// A tensor in device memory: a [`Layout`] whose element 0 lies `offset` bytes into
/// `allocation`. [`crate::Stream::run_op`] checks that everything it addresses lies
/// within the allocation.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    /// The memory.
    pub allocation: &'a Allocation,
    /// Byte offset of element 0 (a multiple of the dtype's size).
    pub offset: u64,
    /// Shape, strides and dtype.
    pub layout: Layout,
}

impl<'a> Tensor<'a> {
    /// A row-major tensor of `dims` at the start of `allocation`.
    pub fn new(allocation: &'a Allocation, dtype: DType, dims: &[u64]) -> Result<Self> {
        Ok(Tensor {
            allocation,
            offset: 0,
            layout: Layout::contiguous(dtype, dims)?,
        })
    }

    /// A tensor with the given layout at the start of `allocation`.
    pub fn with_layout(allocation: &'a Allocation, layout: Layout) -> Self {
        Tensor {
            allocation,
            offset: 0,
            layout,
        }
    }

    /// The same tensor starting `offset` bytes into the allocation.
    pub fn at(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// The same elements with dimensions `i` and `j` swapped.
    pub fn transposed(mut self, i: usize, j: usize) -> Result<Self> {
        self.layout = self.layout.transposed(i, j)?;
        Ok(self)
    }

    /// The bytes the tensor spans, as a slice of its allocation.
    pub fn span(&self) -> BufferSlice<'a> {
        self.allocation.slice(self.offset, self.layout.span_bytes())
    }
}

impl HasLayout for Tensor<'_> {
    fn layout(&self) -> &Layout {
        &self.layout
    }
}

impl fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({:?} at allocation #{} + {})",
            self.layout,
            self.allocation.id(),
            self.offset
        )
    }
}

/// A checked tensor as a backend receives it: `memory` spans exactly the bytes the
/// layout addresses (`memory.offset` is element 0, `memory.len` is
/// [`Layout::span_bytes`], at least one element).
#[derive(Debug, Clone)]
pub struct RawTensor {
    /// The bytes spanned.
    pub memory: RawSlice,
    /// Shape, strides and dtype.
    pub layout: Layout,
}

impl HasLayout for RawTensor {
    fn layout(&self) -> &Layout {
        &self.layout
    }
}
