//! Typed access to an operation's tensors for the fast paths, with the aliasing rules
//! enforced here so that the kernels only see safe slices.
//!
//! A [`Plan`] exists only when every tensor is contiguous and every written tensor is
//! disjoint from every other operand, except an allowed in-place pair that is the very
//! same tensor (same bytes, same layout). It then hands out each written tensor as one
//! `&mut` slice at most once, and refuses a shared slice of anything handed out
//! mutably (the in-place input included): the kernel of an in-place pair works on the
//! output slice alone.

use std::cell::Cell;

use bytemuck::Pod;
use xpu_hal::ops::{Op, RawTensor};
use xpu_hal::Result;

use crate::memory::Region;

/// The tensors of one operation, checked for the fast paths.
pub(super) struct Plan<'op> {
    tensors: Vec<(&'op RawTensor, Region, bool)>,
    /// `(input, output)`: the same tensor, in place.
    same: Vec<(usize, usize)>,
    /// Bit `i`: operand `i` was handed out shared.
    shared: Cell<u64>,
    /// Bit `i`: operand `i` was handed out mutably.
    exclusive: Cell<u64>,
}

fn overlap(a: &Region, b: &Region) -> bool {
    let (a0, b0) = (a.ptr() as usize, b.ptr() as usize);
    a0 < b0.saturating_add(b.len()) && b0 < a0.saturating_add(a.len())
}

impl<'op> Plan<'op> {
    /// The plan for `op`'s tensors (in [`Op::operands`] order), or `None` when one is
    /// not contiguous or the aliasing is not the simple kind described above.
    pub(super) fn new(op: &'op Op<RawTensor>) -> Result<Option<Plan<'op>>> {
        let operands = op.operands();
        if operands.len() > 64 {
            return Ok(None);
        }
        let mut tensors = Vec::with_capacity(operands.len());
        for o in &operands {
            if !o.tensor.layout.is_contiguous() {
                return Ok(None);
            }
            let region = Region::from_raw(&o.tensor.memory)?;
            tensors.push((o.tensor, region, o.access.writes()));
        }
        let pairs = op.kind().in_place_pairs();
        let mut same = Vec::new();
        for (w, ow) in operands.iter().enumerate() {
            if !ow.access.writes() {
                continue;
            }
            for (i, oi) in operands.iter().enumerate() {
                if i == w || !overlap(&tensors[w].1, &tensors[i].1) {
                    continue;
                }
                let allowed = !oi.access.writes()
                    && pairs.iter().any(|&(a, b)| a == oi.name && b == ow.name)
                    && tensors[w].1.same_as(&tensors[i].1)
                    && ow.tensor.layout == oi.tensor.layout;
                if !allowed {
                    return Ok(None);
                }
                same.push((i, w));
            }
        }
        Ok(Some(Plan {
            tensors,
            same,
            shared: Cell::new(0),
            exclusive: Cell::new(0),
        }))
    }

    /// The bytes the operation touches (each operand's span).
    pub(super) fn bytes(&self) -> u64 {
        self.tensors.iter().map(|(_, r, _)| r.len() as u64).sum()
    }

    /// Whether input `input` is the very tensor `output` (the operation runs in place).
    pub(super) fn same(&self, input: usize, output: usize) -> bool {
        self.same.contains(&(input, output))
    }

    /// The dimensions of operand `i`.
    pub(super) fn dims(&self, i: usize) -> Option<&[u64]> {
        self.tensors.get(i).map(|(t, _, _)| t.layout.dims())
    }

    /// The element count of operand `i`, if `T` has its element size.
    fn elements<T: Pod>(&self, i: usize) -> Option<(&Region, usize)> {
        let (t, region, _) = self.tensors.get(i)?;
        let size = t.layout.dtype.size();
        if std::mem::size_of::<T>() != size {
            return None;
        }
        let n = t.layout.elements() as usize;
        if region.len() < n.checked_mul(size)? {
            return None;
        }
        Some((region, n))
    }

    /// Operand `i` (read-only) as elements of `T` (which must have its dtype's size);
    /// `None` if it is written, in place with a written tensor handed out, or not
    /// aligned for `T`.
    pub(super) fn input<T: Pod>(&self, i: usize) -> Option<&[T]> {
        let (region, n) = self.elements::<T>(i)?;
        let taken = self.exclusive.get();
        if self.tensors[i].2
            || self
                .same
                .iter()
                .any(|&(a, w)| a == i && taken & (1 << w) != 0)
        {
            return None;
        }
        self.shared.set(self.shared.get() | 1 << i);
        // SAFETY: the region is in bounds of a live allocation, held by the plan for the
        // slice's lifetime. Nothing writes these bytes while it lives: operand `i` is
        // read-only, every written operand is disjoint from it (checked in `new`) except
        // an in-place output, which `output` refuses to hand out once this slice exists
        // (and this call refused if it already was); stream order keeps other work off
        // the operands during the operation.
        let bytes = unsafe { region.bytes() };
        let typed = bytemuck::try_cast_slice::<u8, T>(bytes).ok()?;
        typed.get(..n)
    }

    /// Operand `i` (written) as elements of `T`, once; `None` if it is read-only, was
    /// already handed out, is in place with an input handed out, or is not aligned.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn output<T: Pod>(&self, i: usize) -> Option<&mut [T]> {
        let (region, n) = self.elements::<T>(i)?;
        let bit = 1u64 << i;
        let shared = self.shared.get();
        if !self.tensors[i].2
            || (shared | self.exclusive.get()) & bit != 0
            || self
                .same
                .iter()
                .any(|&(a, w)| w == i && shared & (1 << a) != 0)
        {
            return None;
        }
        // Check alignment before claiming, so a refusal leaves the plan as it was.
        if !(region.ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return None;
        }
        self.exclusive.set(self.exclusive.get() | bit);
        // SAFETY: in bounds of a live allocation held by the plan. This is the only
        // reference to these bytes while it lives: written operands are disjoint from
        // all others (checked in `new`) except an identical in-place input, which
        // `input` refuses from now on and which was not handed out before (checked
        // above); each output is handed out once; stream order keeps other work off.
        let bytes = unsafe { region.bytes_mut() };
        let typed = bytemuck::try_cast_slice_mut::<u8, T>(bytes).ok()?;
        typed.get_mut(..n)
    }
}
