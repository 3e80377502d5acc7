//! Matrix multiply through the `gemm` crate: packed, vectorised kernels, multi-threaded
//! on the device's share of the cores; `f16`/`bf16` widened to `f32` and rounded once.

use xpu_hal::ops::{HasLayout, Layout, RawTensor};
use xpu_hal::reference::ops::TensorIo;
use xpu_hal::reference::{bf16, f16};
use xpu_hal::{DType, Error, Result};

use super::{HostIo, OpThreads};
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
            threads.run(|par| {
                // SAFETY: the HAL checked every span in bounds and `c` disjoint from `a` and
                // `b`; the regions hold the memory; strides describe exactly those spans.
                unsafe { shape.gemm::<f32>(pa.get(), pb.get(), pc.get(), m.alpha, m.beta, par) }
            })
        }
        DType::F64 => {
            let (pa, pb, pc) = (
                SendPtr(a.ptr().cast::<f64>()),
                SendPtr(b.ptr().cast::<f64>()),
                SendPtr(c.ptr().cast::<f64>()),
            );
            threads.run(|par| {
                // SAFETY: as above.
                unsafe {
                    shape.gemm::<f64>(
                        pa.get(),
                        pb.get(),
                        pc.get(),
                        f64::from(m.alpha),
                        f64::from(m.beta),
                        par,
                    )
                }
            })
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
            let c_ptr = SendPtr(wc.as_mut_ptr());
            threads.run(|par| {
                // SAFETY: the three vectors hold the packed matrices the strides
                // describe; `wc` is distinct from `wa` and `wb`.
                unsafe {
                    packed_shape.gemm::<f32>(
                        wa.as_ptr(),
                        wb.as_ptr(),
                        c_ptr.get(),
                        m.alpha,
                        m.beta,
                        par,
                    )
                }
            })?;
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

impl Shape {
    /// `c = alpha·a·b + beta·c` for each batch.
    ///
    /// # Safety
    /// The pointers address matrices with this shape and these strides, valid for the
    /// call; `c` overlaps neither `a` nor `b` and addresses each element once.
    unsafe fn gemm<T: Copy + 'static>(
        &self,
        a: *const T,
        b: *const T,
        c: *mut T,
        alpha: T,
        beta: T,
        par: gemm::Parallelism,
    ) {
        for p in 0..self.batches as isize {
            // SAFETY: offsets within the spans the caller vouches for.
            unsafe {
                gemm::gemm(
                    self.rows,
                    self.cols,
                    self.k,
                    c.offset(p * self.sc.0),
                    self.sc.2,
                    self.sc.1,
                    self.read_c,
                    a.offset(p * self.sa.0),
                    self.sa.2,
                    self.sa.1,
                    b.offset(p * self.sb.0),
                    self.sb.2,
                    self.sb.1,
                    // gemm computes dst = alpha·dst + beta·lhs·rhs (alpha unused when
                    // dst is not read).
                    beta,
                    alpha,
                    false,
                    false,
                    false,
                    par,
                );
            }
        }
    }
}

/// A pointer handed to the operation's threads (the memory outlives the call).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);

// SAFETY: only dereferenced by `gemm` during the call that borrows the memory, which
// partitions the destination between its threads.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}
