//! Matrix multiply through the `matrixmultiply` crate: packed, vectorised kernels
//! (AVX2/FMA, AVX-512 or NEON, chosen at run time), each call on one thread.
//!
//! The device's threads share a product by cutting `c` into blocks: whole batches when
//! there are enough of them, else bands of rows or columns (the longer side, in
//! multiples of the kernels' register tile). Every block is an independent
//! `c_block = alpha·a_rows·b_cols + beta·c_block`, so the split changes which thread
//! computes an element but never how: results do not depend on the thread count.
//! `f16`/`bf16` are widened to `f32`, multiplied with `f32` accumulation and rounded
//! once.

use xpu_hal::ops::{HasLayout, Layout, RawTensor};
use xpu_hal::reference::ops::TensorIo;
use xpu_hal::reference::{bf16, f16};
use xpu_hal::{DType, Error, Result};

use super::{HostIo, OpThreads, Par};
use crate::memory::Region;

/// The operands and parameters of one [`xpu_hal::ops::Op::Matmul`].
pub(super) struct Matmul<'a> {
    pub(super) a: &'a RawTensor,
    pub(super) b: &'a RawTensor,
    pub(super) c: &'a RawTensor,
    pub(super) trans_a: bool,
    pub(super) trans_b: bool,
    pub(super) alpha: f32,
    pub(super) beta: f32,
}

/// Strides (in elements) of one matrix of a rank-2 or rank-3 operand: (batch, row, col)
/// of its logical (untransposed) view.
fn matrix_strides(l: &Layout, transposed: bool) -> (isize, isize, isize) {
    let s = l.strides();
    let (batch, r, c) = match *s {
        [r, c] => (0, r, c),
        [b, r, c] => (b, r, c),
        _ => (0, 1, 1),
    };
    let (r, c) = if transposed { (c, r) } else { (r, c) };
    (batch as isize, r as isize, c as isize)
}

/// `c = alpha·op(a)·op(b) + beta·c`, batched when the operands have rank 3.
pub(super) fn matmul(m: Matmul<'_>, threads: &OpThreads) -> Result<()> {
    let lc = m.c.layout();
    let rank = lc.rank();
    let (rows, cols) = (lc.dims()[rank - 2] as usize, lc.dims()[rank - 1] as usize);
    let la = m.a.layout();
    let k = if m.trans_a {
        la.dims()[rank - 2]
    } else {
        la.dims()[rank - 1]
    } as usize;
    let batches = if rank == 3 { lc.dims()[0] as usize } else { 1 };
    let (a, b, c) = (
        Region::from_raw(&m.a.memory)?,
        Region::from_raw(&m.b.memory)?,
        Region::from_raw(&m.c.memory)?,
    );
    let sa = matrix_strides(la, m.trans_a);
    let sb = matrix_strides(m.b.layout(), m.trans_b);
    let sc = matrix_strides(lc, false);
    let shape = Shape {
        rows,
        cols,
        k,
        batches,
        sa,
        sb,
        sc,
        read_c: m.beta != 0.0,
    };
    match lc.dtype {
        DType::F32 => {
            let (pa, pb, pc) = (
                SendPtr(a.ptr().cast::<f32>()),
                SendPtr(b.ptr().cast::<f32>()),
                SendPtr(c.ptr().cast::<f32>()),
            );
            let par = shape.par(threads)?;
            // SAFETY: the HAL checked every span in bounds and `c` disjoint from `a` and
            // `b`; the regions hold the memory; strides describe exactly those spans.
            unsafe { shape.run::<f32>(pa, pb, pc, m.alpha, m.beta, &par) };
            Ok(())
        }
        DType::F64 => {
            let (pa, pb, pc) = (
                SendPtr(a.ptr().cast::<f64>()),
                SendPtr(b.ptr().cast::<f64>()),
                SendPtr(c.ptr().cast::<f64>()),
            );
            let par = shape.par(threads)?;
            // SAFETY: as above.
            unsafe { shape.run::<f64>(pa, pb, pc, f64::from(m.alpha), f64::from(m.beta), &par) };
            Ok(())
        }
        // Half types: widened to packed f32, multiplied with f32 accumulation, and
        // rounded once into `c`.
        DType::F16 | DType::BF16 => {
            let widen = |t: &RawTensor| -> Result<Vec<f32>> {
                let packed = HostIo.read(t)?;
                Ok(match t.layout().dtype {
                    DType::F16 => bytemuck::cast_slice::<u8, u16>(&packed)
                        .iter()
                        .map(|&b| f16::from_bits(b).to_f32())
                        .collect(),
                    _ => bytemuck::cast_slice::<u8, u16>(&packed)
                        .iter()
                        .map(|&b| bf16::from_bits(b).to_f32())
                        .collect(),
                })
            };
            let (wa, wb) = (widen(m.a)?, widen(m.b)?);
            let mut wc = if shape.read_c {
                widen(m.c)?
            } else {
                vec![0.0; batches * rows * cols]
            };
            // Packed row-major copies of the operands as stored (a broadcast batch
            // repeated), so their strides are those of contiguous layouts.
            let dense = |l: &Layout, t: bool| -> Result<(isize, isize, isize)> {
                Ok(matrix_strides(
                    &Layout::contiguous(DType::F32, l.dims())?,
                    t,
                ))
            };
            let packed_shape = Shape {
                sa: dense(la, m.trans_a)?,
                sb: dense(m.b.layout(), m.trans_b)?,
                sc: dense(lc, false)?,
                ..shape
            };
            let par = packed_shape.par(threads)?;
            // SAFETY: the three vectors hold the packed matrices the strides describe;
            // `wc` is distinct from `wa` and `wb`.
            unsafe {
                packed_shape.run::<f32>(
                    SendPtr(wa.as_ptr().cast_mut()),
                    SendPtr(wb.as_ptr().cast_mut()),
                    SendPtr(wc.as_mut_ptr()),
                    m.alpha,
                    m.beta,
                    &par,
                )
            };
            let out: Vec<u16> = if lc.dtype == DType::F16 {
                wc.iter().map(|&v| f16::from_f32(v).to_bits()).collect()
            } else {
                wc.iter().map(|&v| bf16::from_f32(v).to_bits()).collect()
            };
            HostIo.write(m.c, bytemuck::cast_slice(&out))?;
            Ok(())
        }
        other => Err(Error::backend_message(
            "host",
            format!("internal error: matmul on {other} passed the HAL's checks"),
        )),
    }
}

/// One batched product's sizes and element strides: (batch, row, col) per operand.
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    k: usize,
    batches: usize,
    sa: (isize, isize, isize),
    sb: (isize, isize, isize),
    sc: (isize, isize, isize),
    read_c: bool,
}

/// Products with fewer multiply-adds than this run on the calling thread: waking the
/// pool would cost more than it saves.
const PARALLEL_FLOPS: usize = 1 << 18;

/// Bands of rows or columns are multiples of this (the kernels' register tiles are at
/// most 16 wide), so no thread computes a ragged edge in the middle of `c`.
const BAND: usize = 16;

/// Bands of columns are at least this wide, else `c` is cut into bands of rows.
const MIN_COLUMN_BAND: usize = 64;

/// One block of `c` a thread computes: a batch, and a range of its rows and columns.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Block {
    batch: usize,
    rows: (usize, usize),
    cols: (usize, usize),
}

impl Shape {
    /// The device's threads when the product is worth splitting, else the caller.
    fn par<'t>(&self, threads: &'t OpThreads) -> Result<Par<'t>> {
        let work = self
            .rows
            .saturating_mul(self.cols)
            .saturating_mul(self.k)
            .saturating_mul(self.batches);
        if work < PARALLEL_FLOPS {
            return Ok(Par::SEQUENTIAL);
        }
        threads.par(u64::MAX)
    }

    /// The blocks `c` is cut into for `threads` threads: whole batches when there are at
    /// least as many as threads, else about `threads` bands per batch along the longer
    /// side of `c`.
    fn blocks(&self, threads: usize) -> Vec<Block> {
        let whole = |batch| Block {
            batch,
            rows: (0, self.rows),
            cols: (0, self.cols),
        };
        if threads <= 1 || self.batches >= threads {
            return (0..self.batches).map(whole).collect();
        }
        let per_batch = threads.div_ceil(self.batches);
        // Columns when the bands stay wide enough for the kernels: each thread then packs
        // a narrower panel of `b`, which stays in its core's cache (measured faster
        // than bands of rows at 1024³ on two threads).
        let along_rows = self.cols < per_batch * MIN_COLUMN_BAND && self.rows > self.cols;
        let side = if along_rows { self.rows } else { self.cols };
        let band = side.div_ceil(per_batch).next_multiple_of(BAND).max(1);
        let mut blocks = Vec::with_capacity(self.batches * per_batch);
        for batch in 0..self.batches {
            let mut start = 0;
            while start < side {
                let end = (start + band).min(side);
                let mut b = whole(batch);
                if along_rows {
                    b.rows = (start, end);
                } else {
                    b.cols = (start, end);
                }
                blocks.push(b);
                start = end;
            }
        }
        blocks
    }

    /// `c = alpha·a·b + beta·c` for each batch, the blocks of `c` shared by `par`'s
    /// threads.
    ///
    /// # Safety
    /// The pointers address matrices with this shape and these strides, valid for the
    /// call; `c` overlaps neither `a` nor `b` and addresses each element once.
    unsafe fn run<T: Gemm>(
        &self,
        a: SendPtr<T>,
        b: SendPtr<T>,
        c: SendPtr<T>,
        alpha: T,
        beta: T,
        par: &Par<'_>,
    ) {
        let blocks = self.blocks(par.threads());
        par.map(blocks, |blk| {
            let (r0, c0) = (blk.rows.0 as isize, blk.cols.0 as isize);
            let p = blk.batch as isize;
            // SAFETY: the block lies inside batch `p` of each operand (rows of `a`,
            // columns of `b`, both of `c`), which the caller vouches for; blocks are
            // disjoint, so no two threads write the same element of `c`.
            unsafe {
                T::gemm(
                    blk.rows.1 - blk.rows.0,
                    self.k,
                    blk.cols.1 - blk.cols.0,
                    alpha,
                    a.get().offset(p * self.sa.0 + r0 * self.sa.1),
                    self.sa.1,
                    self.sa.2,
                    b.get().offset(p * self.sb.0 + c0 * self.sb.2),
                    self.sb.1,
                    self.sb.2,
                    // `matrixmultiply` does not read `c` when beta is 0.
                    if self.read_c { beta } else { T::ZERO },
                    c.get()
                        .offset(p * self.sc.0 + r0 * self.sc.1 + c0 * self.sc.2),
                    self.sc.1,
                    self.sc.2,
                )
            }
        });
    }
}

/// The element types `matrixmultiply` multiplies.
trait Gemm: Copy + Send + Sync + 'static {
    const ZERO: Self;

    /// `c = alpha·a·b + beta·c` with `matrixmultiply`'s argument order (m, k, n; row
    /// and column strides).
    ///
    /// # Safety
    /// As `matrixmultiply::sgemm`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

impl Gemm for f32 {
    const ZERO: f32 = 0.0;

    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        rsa: isize,
        csa: isize,
        b: *const f32,
        rsb: isize,
        csb: isize,
        beta: f32,
        c: *mut f32,
        rsc: isize,
        csc: isize,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            matrixmultiply::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
        }
    }
}

impl Gemm for f64 {
    const ZERO: f64 = 0.0;

    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: f64,
        a: *const f64,
        rsa: isize,
        csa: isize,
        b: *const f64,
        rsb: isize,
        csb: isize,
        beta: f64,
        c: *mut f64,
        rsc: isize,
        csc: isize,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            matrixmultiply::dgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
        }
    }
}

/// A pointer handed to the operation's threads (the memory outlives the call).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);

// SAFETY: only dereferenced during the call that borrows the memory, whose blocks
// partition the destination between the threads.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batches: usize, rows: usize, cols: usize) -> Shape {
        Shape {
            rows,
            cols,
            k: 8,
            batches,
            sa: (0, 0, 0),
            sb: (0, 0, 0),
            sc: (0, 0, 0),
            read_c: false,
        }
    }

    /// Every element of `c` in exactly one block.
    fn covers(s: &Shape, blocks: &[Block]) {
        let mut seen = vec![0u8; s.batches * s.rows * s.cols];
        for b in blocks {
            for r in b.rows.0..b.rows.1 {
                for c in b.cols.0..b.cols.1 {
                    seen[(b.batch * s.rows + r) * s.cols + c] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{blocks:?}");
    }

    #[test]
    fn blocks_partition_c_for_any_thread_count() {
        for (batches, rows, cols) in [
            (1, 1, 1),
            (1, 1000, 3),
            (1, 3, 1000),
            (3, 17, 33),
            (8, 5, 5),
        ] {
            for threads in 1..=9 {
                let s = shape(batches, rows, cols);
                let blocks = s.blocks(threads);
                covers(&s, &blocks);
                assert!(blocks
                    .iter()
                    .all(|b| b.rows.0 < b.rows.1 && b.cols.0 < b.cols.1));
            }
        }
    }

    #[test]
    fn bands_are_columns_when_wide_else_the_longer_side_in_whole_tiles() {
        let blocks = shape(1, 1024, 64).blocks(2);
        assert_eq!(blocks.len(), 2);
        assert_eq!((blocks[0].rows, blocks[0].cols), ((0, 512), (0, 64)));
        let blocks = shape(1, 1024, 1024).blocks(2);
        assert_eq!((blocks[1].rows, blocks[1].cols), ((0, 1024), (512, 1024)));
        let blocks = shape(1, 10, 100).blocks(3);
        assert_eq!(
            blocks.iter().map(|b| b.cols).collect::<Vec<_>>(),
            [(0, 48), (48, 96), (96, 100)]
        );
        assert_eq!(shape(4, 64, 64).blocks(2).len(), 4);
    }
}
