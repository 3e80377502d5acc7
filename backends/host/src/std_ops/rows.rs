//! Operations on the rows of `[rows, n]` tensors (softmax, cross-entropy, layer norm
//! and their gradients) and reductions along an axis. Rows are shared between the
//! device's threads; sums within a row use eight partial sums in the computing
//! precision, sums across rows (layer norm's `dgamma`/`dbeta`, reductions) `f64`.

use xpu_hal::ops::ReduceOp;
use xpu_hal::{DType, Error, Result};

use super::access::Plan;
use super::elementwise::{min_rows, MIN_PIECE};
use super::math::{self, nan_max, nan_min, Elem, Float};
use super::{with_float, Par};

/// The rows of `out` (`n` elements each) in pieces: `f(first row, piece)`.
fn row_pieces<T: Send, R: Send>(
    par: &Par<'_>,
    out: &mut [T],
    n: usize,
    f: impl Fn(usize, &mut [T]) -> R + Sync + Send,
) -> Vec<R> {
    let rows = out.len() / n.max(1);
    let piece = par.piece(rows, min_rows(n)) * n.max(1);
    par.chunks(out, piece, |start, chunk| f(start / n.max(1), chunk))
}

/// `e[j] = exp(x[j] − max)` for a row (the reference's stable softmax; NaN anywhere
/// gives NaN everywhere), returning `(max, Σ e)`.
#[inline(always)]
fn exps<E: Elem>(row: &[E], e: &mut [E::F]) -> (E::F, E::F) {
    let max = math::max(row, |v| v.get());
    for (o, &v) in e.iter_mut().zip(row) {
        *o = (v.get() - max).exp();
    }
    (max, math::sum(e, |v| v))
}

/// `1 / Σ e` with `e` as [`exps`] leaves it.
#[inline(always)]
fn softmax_exps<E: Elem>(row: &[E], e: &mut [E::F]) -> E::F {
    E::F::ONE / exps(row, e).1
}

/// Softmax of each row.
pub(super) fn softmax(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => softmax_typed::<E>(plan, par))
}

fn row_len(plan: &Plan<'_>, operand: usize) -> Option<usize> {
    plan.dims(operand)
        .and_then(|d| d.get(1).copied())
        .map(|n| n as usize)
}

fn softmax_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>) -> bool {
    let Some(n) = row_len(plan, 0) else {
        return false;
    };
    let (Some(x), Some(y)) = (plan.input::<E>(0), plan.output::<E>(1)) else {
        return false;
    };
    row_pieces(par, y, n, |r0, out| {
        let mut e = vec![E::F::ZERO; n];
        for (r, o) in out.chunks_exact_mut(n).enumerate() {
            let inv = softmax_exps(&x[(r0 + r) * n..(r0 + r + 1) * n], &mut e);
            for (o, &v) in o.iter_mut().zip(&e) {
                *o = E::put(v * inv);
            }
        }
    });
    true
}

/// `dx = y·(dy − Σ dy·y)` per row.
pub(super) fn softmax_backward(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => softmax_backward_typed::<E>(plan, par))
}

fn softmax_backward_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>) -> bool {
    let Some(n) = row_len(plan, 0) else {
        return false;
    };
    let (Some(y), Some(dy), Some(dx)) =
        (plan.input::<E>(0), plan.input::<E>(1), plan.output::<E>(2))
    else {
        return false;
    };
    row_pieces(par, dx, n, |r0, out| {
        for (r, o) in out.chunks_exact_mut(n).enumerate() {
            let at = (r0 + r) * n;
            let (yr, gr) = (&y[at..at + n], &dy[at..at + n]);
            let dot = math::sum2(yr, gr, |a, b| a.get() * b.get());
            for ((o, &y), &g) in o.iter_mut().zip(yr).zip(gr) {
                *o = E::put(y.get() * (g.get() - dot));
            }
        }
    });
    true
}

/// Each row's class (`None` for −1), or the reference's error naming the first bad row
/// (before anything is written).
fn labels(raw: &[i32], classes: usize) -> Result<Vec<Option<usize>>> {
    raw.iter()
        .enumerate()
        .map(|(r, &l)| {
            if l == -1 {
                Ok(None)
            } else if l >= 0 && (l as usize) < classes {
                Ok(Some(l as usize))
            } else {
                Err(Error::invalid(format!(
                    "label of row {r} is {l}, outside [0, {classes}) and not -1 (ignored); the operation was not carried out"
                )))
            }
        })
        .collect()
}

/// `loss[r] = logsumexp(logits[r]) − logits[r, label]` (0 for ignored rows).
pub(super) fn cross_entropy(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> Result<bool> {
    Ok(with_float!(dtype, E => cross_entropy_typed::<E>(plan, par)?))
}

fn cross_entropy_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>) -> Result<bool> {
    let Some(n) = row_len(plan, 0) else {
        return Ok(false);
    };
    let (Some(logits), Some(raw)) = (plan.input::<E>(0), plan.input::<i32>(1)) else {
        return Ok(false);
    };
    let lab = labels(raw, n)?;
    let Some(loss) = plan.output::<E>(2) else {
        return Ok(false);
    };
    let piece = par.piece(loss.len(), min_rows(n));
    par.chunks(loss, piece, |r0, out| {
        let mut e = vec![E::F::ZERO; n];
        for (r, o) in out.iter_mut().enumerate() {
            let row = &logits[(r0 + r) * n..(r0 + r + 1) * n];
            *o = match lab[r0 + r] {
                None => E::put(E::F::ZERO),
                Some(class) => {
                    let (max, sum) = exps(row, &mut e);
                    let lse = if max == E::F::INFINITY {
                        E::F::INFINITY
                    } else {
                        max + sum.ln()
                    };
                    E::put(lse - row[class].get())
                }
            };
        }
    });
    Ok(true)
}

/// `dlogits[r] = (softmax(logits[r]) − onehot(label))·dloss[r]` (0 for ignored rows).
pub(super) fn cross_entropy_backward(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> Result<bool> {
    Ok(with_float!(dtype, E => cross_entropy_backward_typed::<E>(plan, par)?))
}

fn cross_entropy_backward_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>) -> Result<bool> {
    let Some(n) = row_len(plan, 0) else {
        return Ok(false);
    };
    let (Some(logits), Some(raw), Some(dloss)) =
        (plan.input::<E>(0), plan.input::<i32>(1), plan.input::<E>(2))
    else {
        return Ok(false);
    };
    let lab = labels(raw, n)?;
    let Some(dlogits) = plan.output::<E>(3) else {
        return Ok(false);
    };
    row_pieces(par, dlogits, n, |r0, out| {
        let mut e = vec![E::F::ZERO; n];
        for (r, o) in out.chunks_exact_mut(n).enumerate() {
            let row = r0 + r;
            let Some(class) = lab[row] else {
                o.fill(E::put(E::F::ZERO));
                continue;
            };
            let inv = softmax_exps(&logits[row * n..(row + 1) * n], &mut e);
            let dl = dloss[row].get();
            for (j, (o, &v)) in o.iter_mut().zip(&e).enumerate() {
                let p = v * inv;
                let p = if j == class { p - E::F::ONE } else { p };
                *o = E::put(p * dl);
            }
        }
    });
    Ok(true)
}

/// Layer norm of each row, with its mean and reciprocal standard deviation.
pub(super) fn layer_norm(plan: &Plan<'_>, par: &Par<'_>, dtype: DType, eps: f32) -> bool {
    with_float!(dtype, E => layer_norm_typed::<E>(plan, par, eps))
}

fn layer_norm_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>, eps: f32) -> bool {
    let Some(n) = row_len(plan, 0) else {
        return false;
    };
    let (Some(x), Some(gamma), Some(beta)) =
        (plan.input::<E>(0), plan.input::<E>(1), plan.input::<E>(2))
    else {
        return false;
    };
    // Statistics are f32 (f64 for f64): the computing type.
    let (Some(y), Some(mean), Some(rstd)) = (
        plan.output::<E>(3),
        plan.output::<E::F>(4),
        plan.output::<E::F>(5),
    ) else {
        return false;
    };
    let (inv_n, eps) = (E::F::of(1.0 / n as f64), E::F::of(f64::from(eps)));
    let stats = row_pieces(par, y, n, |r0, out| {
        let mut stats = Vec::with_capacity(out.len() / n);
        for (r, o) in out.chunks_exact_mut(n).enumerate() {
            let row = &x[(r0 + r) * n..(r0 + r + 1) * n];
            let mu = math::sum(row, |v| v.get()) * inv_n;
            let var = math::sum(row, |v| {
                let d = v.get() - mu;
                d * d
            }) * inv_n;
            let rs = E::F::ONE / (var + eps).sqrt();
            for (((o, &v), &g), &b) in o.iter_mut().zip(row).zip(gamma).zip(beta) {
                *o = E::put((v.get() - mu) * rs * g.get() + b.get());
            }
            stats.push((mu, rs));
        }
        stats
    });
    for ((m, s), (mu, rs)) in mean
        .iter_mut()
        .zip(rstd.iter_mut())
        .zip(stats.into_iter().flatten())
    {
        *m = mu;
        *s = rs;
    }
    true
}

/// Gradients of layer norm: `dx` per row, `dgamma` and `dbeta` summed over the rows
/// (per piece in `f64`, then the pieces in order).
pub(super) fn layer_norm_backward(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => layer_norm_backward_typed::<E>(plan, par))
}

fn layer_norm_backward_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>) -> bool {
    let Some(n) = row_len(plan, 0) else {
        return false;
    };
    let (Some(x), Some(gamma), Some(mean), Some(rstd), Some(dy)) = (
        plan.input::<E>(0),
        plan.input::<E>(1),
        plan.input::<E::F>(2),
        plan.input::<E::F>(3),
        plan.input::<E>(4),
    ) else {
        return false;
    };
    let (Some(dx), Some(dgamma), Some(dbeta)) = (
        plan.output::<E>(5),
        plan.output::<E>(6),
        plan.output::<E>(7),
    ) else {
        return false;
    };
    let inv_n = E::F::of(1.0 / n as f64);
    let partials = row_pieces(par, dx, n, |r0, out| {
        let mut dg = vec![0.0f64; n];
        let mut db = vec![0.0f64; n];
        let mut xhat = vec![E::F::ZERO; n];
        let mut dxhat = vec![E::F::ZERO; n];
        for (r, o) in out.chunks_exact_mut(n).enumerate() {
            let row = r0 + r;
            let (xr, gr) = (&x[row * n..(row + 1) * n], &dy[row * n..(row + 1) * n]);
            let (mu, rs) = (mean[row], rstd[row]);
            for (((h, d), &v), (&g, &w)) in xhat
                .iter_mut()
                .zip(dxhat.iter_mut())
                .zip(xr)
                .zip(gr.iter().zip(gamma))
            {
                *h = (v.get() - mu) * rs;
                *d = g.get() * w.get();
            }
            let m1 = math::sum(&dxhat, |v| v) * inv_n;
            let m2 = math::sum2(&dxhat, &xhat, |a, b| a * b) * inv_n;
            for (((o, &d), &h), ((g, b), &w)) in o
                .iter_mut()
                .zip(&dxhat)
                .zip(&xhat)
                .zip(dg.iter_mut().zip(db.iter_mut()).zip(gr))
            {
                *o = E::put(rs * (d - m1 - h * m2));
                let w = w.get().wide();
                *g += w * h.wide();
                *b += w;
            }
        }
        (dg, db)
    });
    let mut dg = vec![0.0f64; n];
    let mut db = vec![0.0f64; n];
    for (pg, pb) in partials {
        for ((g, b), (pg, pb)) in dg.iter_mut().zip(db.iter_mut()).zip(pg.iter().zip(&pb)) {
            *g += pg;
            *b += pb;
        }
    }
    for (o, &v) in dgamma.iter_mut().zip(&dg) {
        *o = E::from_wide(v);
    }
    for (o, &v) in dbeta.iter_mut().zip(&db) {
        *o = E::from_wide(v);
    }
    true
}

/// A reduction along `axis`: along the last axis row by row, along any other with the
/// output's elements shared between the threads and the rows walked in order.
pub(super) fn reduce(
    plan: &Plan<'_>,
    par: &Par<'_>,
    dtype: DType,
    op: ReduceOp,
    axis: usize,
) -> bool {
    with_float!(dtype, E => reduce_typed::<E>(plan, par, op, axis))
}

/// The running value of a reduction: a sum in `f64`, or an extreme in `F`.
#[inline(always)]
fn fold<F: Float>(op: ReduceOp, acc: f64, v: F) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => acc + v.wide(),
        ReduceOp::Max => nan_max(acc, v.wide()),
        ReduceOp::Min => nan_min(acc, v.wide()),
    }
}

fn start(op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    }
}

fn reduce_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>, op: ReduceOp, axis: usize) -> bool {
    let Some(dims) = plan.dims(0) else {
        return false;
    };
    let Some(&len) = dims.get(axis) else {
        return false;
    };
    let len = len as usize;
    let inner = dims[axis + 1..].iter().product::<u64>() as usize;
    let (Some(x), Some(y)) = (plan.input::<E>(0), plan.output::<E>(1)) else {
        return false;
    };
    let finish = |acc: f64| match op {
        ReduceOp::Mean => E::from_wide(acc / len as f64),
        _ => E::from_wide(acc),
    };
    if inner == 1 {
        // Along the last axis: each output is one contiguous row.
        let piece = par.piece(y.len(), min_rows(len));
        par.chunks(y, piece, |o0, out| {
            for (o, v) in out.iter_mut().enumerate() {
                let row = &x[(o0 + o) * len..(o0 + o + 1) * len];
                let acc = match op {
                    ReduceOp::Sum | ReduceOp::Mean => math::sum(row, |v| v.get().wide()),
                    ReduceOp::Max => math::max(row, |v| v.get().wide()),
                    ReduceOp::Min => -math::max(row, |v| -v.get().wide()),
                };
                *v = finish(acc);
            }
        });
        return true;
    }
    // Output element (o, i) reduces x[o, k, i] over k: walk the k rows over a run of
    // i, accumulating a run of outputs at once.
    let piece = par.piece(y.len(), MIN_PIECE.div_ceil(len.max(1)).max(64));
    par.chunks(y, piece, |s, out| {
        let mut acc = vec![0.0f64; out.len().min(inner)];
        let mut done = 0;
        while done < out.len() {
            let at = s + done;
            let (o, i) = (at / inner, at % inner);
            let run = (inner - i).min(out.len() - done);
            let acc = &mut acc[..run];
            acc.fill(start(op));
            for k in 0..len {
                let base = (o * len + k) * inner + i;
                for (a, &v) in acc.iter_mut().zip(&x[base..base + run]) {
                    *a = fold(op, *a, v.get());
                }
            }
            for (v, &a) in out[done..done + run].iter_mut().zip(acc.iter()) {
                *v = finish(a);
            }
            done += run;
        }
    });
    true
}
