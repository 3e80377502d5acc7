//! The standard operations ([`crate::ops`]) computed in `f64`: the reference every
//! device is compared with, and what the host backend runs for all but matmul.
//!
//! The caller supplies the memory through [`TensorIo`]: it hands over each input's
//! elements packed in row-major order and takes each output the same way. Every input
//! is read before any output is written, so in-place operations need no care.

use super::Element;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{
    check, uniform_from_bits, Distribution, HasLayout, Layout, Op, PhiloxStream, ReduceOp,
};

/// Access to the tensors of an operation: their elements packed in row-major order
/// (`elements × dtype size` bytes).
pub trait TensorIo<T> {
    /// The elements of `t`.
    fn read(&mut self, t: &T) -> Result<Vec<u8>>;
    /// Stores `packed` (the elements of `t` in row-major order) into `t`.
    fn write(&mut self, t: &T, packed: &[u8]) -> Result<()>;
}

/// The elements `layout` addresses in `bytes` (which starts at element 0), packed in
/// row-major order. `bytes` must hold [`Layout::span_bytes`] bytes.
pub fn pack(bytes: &[u8], layout: &Layout) -> Vec<u8> {
    let size = layout.dtype.size();
    if layout.is_contiguous() {
        return bytes[..layout.elements() as usize * size].to_vec();
    }
    let mut out = Vec::with_capacity(layout.elements() as usize * size);
    for off in layout.offsets() {
        let at = off as usize * size;
        out.extend_from_slice(&bytes[at..at + size]);
    }
    out
}

/// Stores `packed` (row-major elements) where `layout` addresses them in `bytes`
/// (which starts at element 0).
pub fn unpack(bytes: &mut [u8], layout: &Layout, packed: &[u8]) {
    let size = layout.dtype.size();
    if layout.is_contiguous() {
        bytes[..packed.len()].copy_from_slice(packed);
        return;
    }
    for (n, off) in layout.offsets().enumerate() {
        let at = off as usize * size;
        bytes[at..at + size].copy_from_slice(&packed[n * size..(n + 1) * size]);
    }
}

/// Packed elements of `dtype` widened to `f64`.
pub fn to_f64(packed: &[u8], dtype: DType) -> Vec<f64> {
    crate::with_dtype!(DType, dtype, T => {
        bytemuck::pod_collect_to_vec::<u8, T>(packed)
            .into_iter()
            .map(|v| match v.widen() {
                super::Wide::Float(f) => f,
                super::Wide::Int(i) => i as f64,
            })
            .collect()
    })
}

/// `values` rounded once to `dtype` (as casts round), packed.
pub fn from_f64(values: &[f64], dtype: DType) -> Vec<u8> {
    crate::with_dtype!(DType, dtype, T => {
        let v: Vec<T> = values
            .iter()
            .map(|&f| T::narrow(super::Wide::Float(f)))
            .collect();
        bytemuck::cast_slice(&v).to_vec()
    })
}

struct Values<'a, T, I> {
    io: &'a mut I,
    _t: std::marker::PhantomData<T>,
}

impl<T: HasLayout, I: TensorIo<T>> Values<'_, T, I> {
    fn get(&mut self, t: &T) -> Result<Vec<f64>> {
        Ok(to_f64(&self.io.read(t)?, t.layout().dtype))
    }

    fn put(&mut self, t: &T, values: &[f64]) -> Result<()> {
        self.io.write(t, &from_f64(values, t.layout().dtype))
    }

    fn indices(&mut self, t: &T, bound: u64, what: &str) -> Result<Vec<usize>> {
        let raw = self.get(t)?;
        raw.iter()
            .enumerate()
            .map(|(i, &v)| {
                if v >= 0.0 && (v as u64) < bound {
                    Ok(v as usize)
                } else {
                    Err(Error::invalid(format!(
                        "{what} {i} is {v}, outside [0, {bound}); the operation was not carried out"
                    )))
                }
            })
            .collect()
    }
}

/// `√(2/π)`, GELU's constant.
const GELU_C: f64 = 0.797_884_560_802_865_4;

/// GELU (tanh approximation) of `x`.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_C * (x + 0.044_715 * x * x * x)).tanh())
}

/// The derivative of [`gelu`] at `x`.
pub fn gelu_grad(x: f64) -> f64 {
    let t = (GELU_C * (x + 0.044_715 * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044_715 * x * x)
}

fn rows_of(l: &Layout) -> (usize, usize) {
    (l.dims()[0] as usize, l.dims()[1] as usize)
}

/// Runs `op` on the tensors `io` gives access to. Checks the operation first
/// ([`crate::ops::check`]); an index or label out of range fails it before anything is
/// written. An operation with an empty tensor does nothing.
pub fn run<T: HasLayout, I: TensorIo<T>>(op: &Op<T>, io: &mut I) -> Result<()> {
    check(op)?;
    if op
        .operands()
        .iter()
        .any(|o| o.tensor.layout().elements() == 0)
    {
        return Ok(());
    }
    let mut v = Values {
        io,
        _t: std::marker::PhantomData,
    };
    match op {
        Op::Matmul {
            a,
            b,
            c,
            trans_a,
            trans_b,
            alpha,
            beta,
        } => {
            let (la, lc) = (a.layout(), c.layout());
            let rank = lc.rank();
            let batch = if rank == 3 { lc.dims()[0] as usize } else { 1 };
            let (m, n) = (lc.dims()[rank - 2] as usize, lc.dims()[rank - 1] as usize);
            let k = if *trans_a {
                la.dims()[rank - 2]
            } else {
                la.dims()[rank - 1]
            } as usize;
            let av = v.get(a)?;
            let bv = v.get(b)?;
            let mut cv = if *beta != 0.0 {
                v.get(c)?
            } else {
                vec![0.0; batch * m * n]
            };
            let (alpha, beta) = (f64::from(*alpha), f64::from(*beta));
            for p in 0..batch {
                let (ab, bb, cb) = (p * m * k, p * k * n, p * m * n);
                for i in 0..m {
                    for j in 0..n {
                        let mut sum = 0.0;
                        for q in 0..k {
                            let x = if *trans_a {
                                av[ab + q * m + i]
                            } else {
                                av[ab + i * k + q]
                            };
                            let y = if *trans_b {
                                bv[bb + j * k + q]
                            } else {
                                bv[bb + q * n + j]
                            };
                            sum += x * y;
                        }
                        let old = cv[cb + i * n + j];
                        cv[cb + i * n + j] = if beta != 0.0 {
                            alpha * sum + beta * old
                        } else {
                            alpha * sum
                        };
                    }
                }
            }
            v.put(c, &cv)
        }
        Op::BiasAdd { x, bias, y } => {
            let (_, n) = rows_of(x.layout());
            let bv = v.get(bias)?;
            let mut xv = v.get(x)?;
            for (i, e) in xv.iter_mut().enumerate() {
                *e += bv[i % n];
            }
            v.put(y, &xv)
        }
        Op::Relu { x, y } => {
            let xv = v.get(x)?;
            let out: Vec<f64> = xv
                .iter()
                .map(|&e| if e > 0.0 || e.is_nan() { e } else { 0.0 })
                .collect();
            v.put(y, &out)
        }
        Op::ReluBackward { x, dy, dx } => {
            let xv = v.get(x)?;
            let dyv = v.get(dy)?;
            let out: Vec<f64> = xv
                .iter()
                .zip(&dyv)
                .map(|(&x, &g)| if x > 0.0 { g } else { 0.0 })
                .collect();
            v.put(dx, &out)
        }
        Op::Gelu { x, y } => {
            let out: Vec<f64> = v.get(x)?.into_iter().map(gelu).collect();
            v.put(y, &out)
        }
        Op::GeluBackward { x, dy, dx } => {
            let xv = v.get(x)?;
            let dyv = v.get(dy)?;
            let out: Vec<f64> = xv
                .iter()
                .zip(&dyv)
                .map(|(&x, &g)| g * gelu_grad(x))
                .collect();
            v.put(dx, &out)
        }
        Op::Softmax { x, y } => {
            let (_, n) = rows_of(x.layout());
            let mut xv = v.get(x)?;
            for row in xv.chunks_mut(n) {
                softmax_row(row);
            }
            v.put(y, &xv)
        }
        Op::SoftmaxBackward { y, dy, dx } => {
            let (_, n) = rows_of(y.layout());
            let yv = v.get(y)?;
            let dyv = v.get(dy)?;
            let mut out = vec![0.0; yv.len()];
            for ((o, yr), gr) in out.chunks_mut(n).zip(yv.chunks(n)).zip(dyv.chunks(n)) {
                let dot: f64 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
                for ((o, &y), &g) in o.iter_mut().zip(yr).zip(gr) {
                    *o = y * (g - dot);
                }
            }
            v.put(dx, &out)
        }
        Op::CrossEntropy {
            logits,
            labels,
            loss,
        } => {
            let (rows, n) = rows_of(logits.layout());
            let lab = labels_of(&mut v, labels, n)?;
            let lv = v.get(logits)?;
            let out: Vec<f64> = (0..rows)
                .map(|r| match lab[r] {
                    None => 0.0,
                    Some(class) => {
                        let row = &lv[r * n..(r + 1) * n];
                        log_sum_exp(row) - row[class]
                    }
                })
                .collect();
            v.put(loss, &out)
        }
        Op::CrossEntropyBackward {
            logits,
            labels,
            dloss,
            dlogits,
        } => {
            let (_, n) = rows_of(logits.layout());
            let lab = labels_of(&mut v, labels, n)?;
            let mut lv = v.get(logits)?;
            let dl = v.get(dloss)?;
            for (r, row) in lv.chunks_mut(n).enumerate() {
                match lab[r] {
                    None => row.fill(0.0),
                    Some(class) => {
                        softmax_row(row);
                        row[class] -= 1.0;
                        for e in row.iter_mut() {
                            *e *= dl[r];
                        }
                    }
                }
            }
            v.put(dlogits, &lv)
        }
        Op::LayerNorm {
            x,
            gamma,
            beta,
            y,
            mean,
            rstd,
            eps,
        } => {
            let (rows, n) = rows_of(x.layout());
            let xv = v.get(x)?;
            let g = v.get(gamma)?;
            let b = v.get(beta)?;
            let mut out = vec![0.0; xv.len()];
            let mut means = vec![0.0; rows];
            let mut rstds = vec![0.0; rows];
            for r in 0..rows {
                let row = &xv[r * n..(r + 1) * n];
                let mu = row.iter().sum::<f64>() / n as f64;
                let var = row.iter().map(|e| (e - mu) * (e - mu)).sum::<f64>() / n as f64;
                let rs = 1.0 / (var + f64::from(*eps)).sqrt();
                for j in 0..n {
                    out[r * n + j] = (row[j] - mu) * rs * g[j] + b[j];
                }
                means[r] = mu;
                rstds[r] = rs;
            }
            v.put(y, &out)?;
            v.put(mean, &means)?;
            v.put(rstd, &rstds)
        }
        Op::LayerNormBackward {
            x,
            gamma,
            mean,
            rstd,
            dy,
            dx,
            dgamma,
            dbeta,
        } => {
            let (rows, n) = rows_of(x.layout());
            let xv = v.get(x)?;
            let g = v.get(gamma)?;
            let mu = v.get(mean)?;
            let rs = v.get(rstd)?;
            let dyv = v.get(dy)?;
            let mut dxv = vec![0.0; xv.len()];
            let mut dg = vec![0.0; n];
            let mut db = vec![0.0; n];
            for r in 0..rows {
                let xhat: Vec<f64> = (0..n).map(|j| (xv[r * n + j] - mu[r]) * rs[r]).collect();
                let dxhat: Vec<f64> = (0..n).map(|j| dyv[r * n + j] * g[j]).collect();
                let m1 = dxhat.iter().sum::<f64>() / n as f64;
                let m2 = dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n as f64;
                for j in 0..n {
                    dxv[r * n + j] = rs[r] * (dxhat[j] - m1 - xhat[j] * m2);
                    dg[j] += dyv[r * n + j] * xhat[j];
                    db[j] += dyv[r * n + j];
                }
            }
            v.put(dx, &dxv)?;
            v.put(dgamma, &dg)?;
            v.put(dbeta, &db)
        }
        Op::Gather {
            table,
            indices,
            out,
        } => {
            let (rows, dim) = rows_of(table.layout());
            let idx = v.indices(indices, rows as u64, "index at position")?;
            let size = table.layout().dtype.size();
            let tb = v.io.read(table)?;
            let row_bytes = dim * size;
            let mut packed = Vec::with_capacity(idx.len() * row_bytes);
            for i in idx {
                packed.extend_from_slice(&tb[i * row_bytes..(i + 1) * row_bytes]);
            }
            v.io.write(out, &packed)
        }
        Op::ScatterAdd {
            src,
            indices,
            table,
        } => {
            let (rows, dim) = rows_of(table.layout());
            let idx = v.indices(indices, rows as u64, "index at position")?;
            let s = v.get(src)?;
            let mut t = v.get(table)?;
            for (i, &row) in idx.iter().enumerate() {
                for j in 0..dim {
                    t[row * dim + j] += s[i * dim + j];
                }
            }
            v.put(table, &t)
        }
        Op::Reduce { x, y, op, axis } => {
            let l = x.layout();
            let axis = *axis as usize;
            let d = l.dims();
            let len = d[axis] as usize;
            let inner: usize = d[axis + 1..].iter().product::<u64>() as usize;
            let outer: usize = d[..axis].iter().product::<u64>() as usize;
            let xv = v.get(x)?;
            let mut out = vec![0.0; outer * inner];
            for o in 0..outer {
                for i in 0..inner {
                    let vals = (0..len).map(|k| xv[(o * len + k) * inner + i]);
                    out[o * inner + i] = match op {
                        ReduceOp::Sum => vals.sum(),
                        ReduceOp::Mean => vals.sum::<f64>() / len as f64,
                        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, nan_max),
                        ReduceOp::Min => vals.fold(f64::INFINITY, nan_min),
                    };
                }
            }
            v.put(y, &out)
        }
        Op::SgdMomentum {
            param,
            grad,
            velocity,
            lr,
            momentum,
            weight_decay,
            nesterov,
        } => {
            let mut p = v.get(param)?;
            let g = v.get(grad)?;
            let mut vel = v.get(velocity)?;
            let (lr, mom, wd) = (
                f64::from(*lr),
                f64::from(*momentum),
                f64::from(*weight_decay),
            );
            for i in 0..p.len() {
                let gi = g[i] + wd * p[i];
                vel[i] = mom * vel[i] + gi;
                let step = if *nesterov { gi + mom * vel[i] } else { vel[i] };
                p[i] -= lr * step;
            }
            v.put(param, &p)?;
            v.put(velocity, &vel)
        }
        Op::AdamW {
            param,
            grad,
            m,
            v: second,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step,
        } => {
            let mut p = v.get(param)?;
            let g = v.get(grad)?;
            let mut mv = v.get(m)?;
            let mut vv = v.get(second)?;
            let (b1, b2) = (f64::from(*beta1), f64::from(*beta2));
            let c1 = 1.0 - b1.powi(*step as i32);
            let c2 = 1.0 - b2.powi(*step as i32);
            let (lr, eps, wd) = (f64::from(*lr), f64::from(*eps), f64::from(*weight_decay));
            for i in 0..p.len() {
                mv[i] = b1 * mv[i] + (1.0 - b1) * g[i];
                vv[i] = b2 * vv[i] + (1.0 - b2) * g[i] * g[i];
                let update = (mv[i] / c1) / ((vv[i] / c2).sqrt() + eps) + wd * p[i];
                p[i] -= lr * update;
            }
            v.put(param, &p)?;
            v.put(m, &mv)?;
            v.put(second, &vv)
        }
        Op::Random {
            y,
            dist,
            seed,
            offset,
        } => {
            let count = y.layout().elements();
            let s = PhiloxStream {
                seed: *seed,
                offset: *offset,
            };
            match dist {
                Distribution::Bits => {
                    let bits: Vec<u32> = (0..count).map(|n| s.value(n)).collect();
                    v.io.write(y, bytemuck::cast_slice(&bits))
                }
                Distribution::Uniform { low, high } => {
                    let (low, high) = (f64::from(*low), f64::from(*high));
                    let out: Vec<f64> = (0..count)
                        .map(|n| low + (high - low) * f64::from(uniform_from_bits(s.value(n))))
                        .collect();
                    v.put(y, &out)
                }
                Distribution::Normal { mean, std } => {
                    let out: Vec<f64> = (0..count)
                        .map(|n| f64::from(*mean) + f64::from(*std) * s.normal(n))
                        .collect();
                    v.put(y, &out)
                }
            }
        }
        Op::Dropout {
            x,
            y,
            p,
            seed,
            offset,
        } => {
            let s = PhiloxStream {
                seed: *seed,
                offset: *offset,
            };
            let scale = 1.0 / (1.0 - f64::from(*p));
            let xv = v.get(x)?;
            let out: Vec<f64> = xv
                .iter()
                .enumerate()
                .map(|(n, &e)| {
                    if dropout_keeps(&s, n as u64, *p) {
                        e * scale
                    } else {
                        0.0
                    }
                })
                .collect();
            v.put(y, &out)
        }
    }
}

/// Whether dropout with probability `p` keeps element `n` of the stream `s`.
pub fn dropout_keeps(s: &PhiloxStream, n: u64, p: f32) -> bool {
    uniform_from_bits(s.value(n)) >= p
}

fn labels_of<T: HasLayout, I: TensorIo<T>>(
    v: &mut Values<'_, T, I>,
    labels: &T,
    classes: usize,
) -> Result<Vec<Option<usize>>> {
    let raw = v.get(labels)?;
    raw.iter()
        .enumerate()
        .map(|(r, &l)| {
            if l == -1.0 {
                Ok(None)
            } else if l >= 0.0 && (l as usize) < classes {
                Ok(Some(l as usize))
            } else {
                Err(Error::invalid(format!(
                    "label of row {r} is {l}, outside [0, {classes}) and not -1 (ignored); the operation was not carried out"
                )))
            }
        })
        .collect()
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

fn log_sum_exp(row: &[f64]) -> f64 {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, nan_max);
    if max == f64::INFINITY {
        return f64::INFINITY;
    }
    max + row.iter().map(|e| (e - max).exp()).sum::<f64>().ln()
}

fn softmax_row(row: &mut [f64]) {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, nan_max);
    let mut sum = 0.0;
    for e in row.iter_mut() {
        *e = (*e - max).exp();
        sum += *e;
    }
    for e in row.iter_mut() {
        *e /= sum;
    }
}

/// [`TensorIo`] over host byte buffers, for tests and tools: tensor `i` is a layout on
/// buffer `buffers[i]` (element 0 at its start).
pub struct Buffers<'a> {
    /// The memory of each tensor.
    pub buffers: &'a mut [Vec<u8>],
}

impl TensorIo<(usize, Layout)> for Buffers<'_> {
    fn read(&mut self, t: &(usize, Layout)) -> Result<Vec<u8>> {
        let buf = self.buffers.get(t.0).ok_or_else(|| no_buffer(t.0))?;
        span_ok(buf, &t.1)?;
        Ok(pack(buf, &t.1))
    }

    fn write(&mut self, t: &(usize, Layout), packed: &[u8]) -> Result<()> {
        let buf = self.buffers.get_mut(t.0).ok_or_else(|| no_buffer(t.0))?;
        span_ok(buf, &t.1)?;
        unpack(buf, &t.1, packed);
        Ok(())
    }
}

impl HasLayout for (usize, Layout) {
    fn layout(&self) -> &Layout {
        &self.1
    }
}

fn no_buffer(i: usize) -> Error {
    Error::invalid(format!("tensor {i} names no buffer"))
}

fn span_ok(buf: &[u8], l: &Layout) -> Result<()> {
    if (buf.len() as u64) < l.span_bytes() {
        return Err(Error::invalid(format!(
            "a buffer of {} bytes is too small for {l}, which spans {} bytes",
            buf.len(),
            l.span_bytes()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    fn out(b: &[u8]) -> Vec<f32> {
        bytemuck::pod_collect_to_vec(b)
    }

    fn l(dims: &[u64]) -> Layout {
        Layout::contiguous(DType::F32, dims).unwrap()
    }

    #[test]
    fn matmul_with_transposes_and_strides() {
        // a = [[1, 2, 3], [4, 5, 6]], b = aᵀ given as a with trans_b.
        let mut bufs = vec![
            f32s(&[1., 2., 3., 4., 5., 6.]),
            f32s(&[1., 2., 3., 4., 5., 6.]),
            f32s(&[1.0; 4]),
        ];
        let op = Op::Matmul {
            a: (0, l(&[2, 3])),
            b: (1, l(&[2, 3])),
            c: (2, l(&[2, 2])),
            trans_a: false,
            trans_b: true,
            alpha: 1.0,
            beta: 1.0,
        };
        run(&op, &mut Buffers { buffers: &mut bufs }).unwrap();
        assert_eq!(out(&bufs[2]), vec![15., 33., 33., 78.]);
        // The same with b as a strided (transposed) view instead of the flag.
        let bt = Layout::strided(DType::F32, &[3, 2], &[1, 3]).unwrap();
        bufs[2] = f32s(&[f32::NAN; 4]);
        let op = Op::Matmul {
            a: (0, l(&[2, 3])),
            b: (1, bt),
            c: (2, l(&[2, 2])),
            trans_a: false,
            trans_b: false,
            alpha: 2.0,
            beta: 0.0,
        };
        run(&op, &mut Buffers { buffers: &mut bufs }).unwrap();
        assert_eq!(out(&bufs[2]), vec![28., 64., 64., 154.]);
    }

    #[test]
    fn cross_entropy_and_its_gradient() {
        let labels: Vec<u8> = bytemuck::cast_slice(&[2i32, -1]).to_vec();
        let mut bufs = vec![
            f32s(&[0., 0., 0., 1., 2., 3.]),
            labels,
            f32s(&[9.; 2]),
            f32s(&[1.; 2]),
            f32s(&[9.; 6]),
        ];
        let il = Layout::contiguous(DType::I32, &[2]).unwrap();
        run(
            &Op::CrossEntropy {
                logits: (0, l(&[2, 3])),
                labels: (1, il),
                loss: (2, l(&[2])),
            },
            &mut Buffers { buffers: &mut bufs },
        )
        .unwrap();
        let loss = out(&bufs[2]);
        assert!(
            (loss[0] - 3f32.ln()).abs() < 1e-6 && loss[1] == 0.0,
            "{loss:?}"
        );
        run(
            &Op::CrossEntropyBackward {
                logits: (0, l(&[2, 3])),
                labels: (1, il),
                dloss: (3, l(&[2])),
                dlogits: (4, l(&[2, 3])),
            },
            &mut Buffers { buffers: &mut bufs },
        )
        .unwrap();
        let g = out(&bufs[4]);
        assert!((g[0] - 1. / 3.).abs() < 1e-6 && (g[2] + 2. / 3.).abs() < 1e-6);
        assert_eq!(&g[3..], &[0., 0., 0.]);
        // A label out of range fails and writes nothing.
        bufs[1] = bytemuck::cast_slice(&[3i32, 0]).to_vec();
        bufs[2] = f32s(&[9.; 2]);
        let e = run(
            &Op::CrossEntropy {
                logits: (0, l(&[2, 3])),
                labels: (1, il),
                loss: (2, l(&[2])),
            },
            &mut Buffers { buffers: &mut bufs },
        )
        .unwrap_err();
        assert!(e.to_string().contains("row 0 is 3"), "{e}");
        assert_eq!(out(&bufs[2]), vec![9., 9.]);
    }

    #[test]
    fn layer_norm_gradient_matches_finite_differences() {
        let x = [0.3f32, -1.2, 2.0, 0.7, 0.1, -0.4];
        let gamma = [1.5f32, -0.5, 2.0];
        let dy = [0.2f32, -0.3, 0.9, 1.0, 0.5, -0.7];
        // Layer norm of `x`: the buffers (x, gamma, beta, y, mean, rstd) after it.
        let forward = |x: &[f32]| -> Vec<Vec<u8>> {
            let mut b = vec![
                f32s(x),
                f32s(&gamma),
                f32s(&[0.1, 0.2, 0.3]),
                vec![0; 24],
                vec![0; 8],
                vec![0; 8],
            ];
            run(
                &Op::LayerNorm {
                    x: (0, l(&[2, 3])),
                    gamma: (1, l(&[3])),
                    beta: (2, l(&[3])),
                    y: (3, l(&[2, 3])),
                    mean: (4, l(&[2])),
                    rstd: (5, l(&[2])),
                    eps: 1e-5,
                },
                &mut Buffers { buffers: &mut b },
            )
            .unwrap();
            b
        };
        // The loss Σ y·dy whose gradient the backward pass computes.
        let loss = |x: &[f32]| -> f64 {
            out(&forward(x)[3])
                .iter()
                .zip(&dy)
                .map(|(y, g)| f64::from(y * g))
                .sum()
        };
        let mut b = forward(&x);
        b.push(f32s(&dy));
        b.push(vec![0; 24]);
        b.push(vec![0; 12]);
        b.push(vec![0; 12]);
        run(
            &Op::LayerNormBackward {
                x: (0, l(&[2, 3])),
                gamma: (1, l(&[3])),
                mean: (4, l(&[2])),
                rstd: (5, l(&[2])),
                dy: (6, l(&[2, 3])),
                dx: (7, l(&[2, 3])),
                dgamma: (8, l(&[3])),
                dbeta: (9, l(&[3])),
            },
            &mut Buffers { buffers: &mut b },
        )
        .unwrap();
        let dx = out(&b[7]);
        for i in 0..6 {
            let h = 1e-2f32;
            let (mut up, mut down) = (x, x);
            up[i] += h;
            down[i] -= h;
            let numeric = (loss(&up) - loss(&down)) / (2.0 * f64::from(h));
            assert!(
                (numeric - f64::from(dx[i])).abs() < 2e-3,
                "{i}: {numeric} vs {}",
                dx[i]
            );
        }
        let dbeta = out(&b[9]);
        for (got, want) in dbeta.iter().zip([1.2f32, 0.2, 0.2]) {
            assert!((got - want).abs() < 1e-6, "{dbeta:?}");
        }
    }

    #[test]
    fn gelu_gradient_matches_finite_differences() {
        for x in [-3.0, -0.5, 0.0, 0.3, 2.5] {
            let h = 1e-6;
            let numeric = (gelu(x + h) - gelu(x - h)) / (2.0 * h);
            assert!((numeric - gelu_grad(x)).abs() < 1e-7, "{x}");
        }
    }

    #[test]
    fn dropout_backward_is_dropout_of_the_gradient() {
        let mut bufs = vec![f32s(&[1.0; 64]), f32s(&[0.0; 64])];
        let op = Op::Dropout {
            x: (0, l(&[64])),
            y: (1, l(&[64])),
            p: 0.25,
            seed: 5,
            offset: 3,
        };
        run(&op, &mut Buffers { buffers: &mut bufs }).unwrap();
        let y = out(&bufs[1]);
        let kept = y.iter().filter(|&&e| e != 0.0).count();
        assert!((32..64).contains(&kept), "{kept}");
        assert!(y.iter().all(|&e| e == 0.0 || e == 1.0 / 0.75));
        let s = PhiloxStream { seed: 5, offset: 3 };
        for (n, &e) in y.iter().enumerate() {
            assert_eq!(e != 0.0, dropout_keeps(&s, n as u64, 0.25));
        }
    }

    #[test]
    fn reduce_and_gather_scatter() {
        let mut bufs = vec![f32s(&[1., 2., 3., 4., 5., 6.]), f32s(&[0.; 3])];
        run(
            &Op::Reduce {
                x: (0, l(&[2, 3])),
                y: (1, l(&[1, 3])),
                op: ReduceOp::Sum,
                axis: 0,
            },
            &mut Buffers { buffers: &mut bufs },
        )
        .unwrap();
        assert_eq!(out(&bufs[1]), vec![5., 7., 9.]);
        let il = Layout::contiguous(DType::I32, &[3]).unwrap();
        let mut bufs = vec![
            f32s(&[1., 2., 3., 4.]),
            bytemuck::cast_slice(&[1i32, 0, 1]).to_vec(),
            f32s(&[0.; 6]),
        ];
        run(
            &Op::Gather {
                table: (0, l(&[2, 2])),
                indices: (1, il),
                out: (2, l(&[3, 2])),
            },
            &mut Buffers { buffers: &mut bufs },
        )
        .unwrap();
        assert_eq!(out(&bufs[2]), vec![3., 4., 1., 2., 3., 4.]);
        run(
            &Op::ScatterAdd {
                src: (2, l(&[3, 2])),
                indices: (1, il),
                table: (0, l(&[2, 2])),
            },
            &mut Buffers { buffers: &mut bufs },
        )
        .unwrap();
        assert_eq!(out(&bufs[0]), vec![2., 4., 9., 12.]);
    }
}
