//! Elementwise operations: relu, gelu and their gradients, bias add. Inputs are read
//! and outputs written in pieces over the device's threads; an in-place operation
//! works on its output slice alone.

use xpu_hal::DType;

use super::access::Plan;
use super::math::{gelu as gelu_f, gelu_grad as gelu_grad_f, Elem, Float};
use super::{with_float, Par};

/// Elements per piece at least (64 KiB of `f32`).
pub(super) const MIN_PIECE: usize = 16 << 10;

/// `y = f(x)` elementwise for operands `x` and `y` (`y` may be `x`).
fn unary<E: Elem>(
    plan: &Plan<'_>,
    par: &Par<'_>,
    (x, y): (usize, usize),
    f: impl Fn(E) -> E + Sync + Send,
) -> bool {
    let src = if plan.same(x, y) {
        None
    } else {
        match plan.input::<E>(x) {
            Some(s) => Some(s),
            None => return false,
        }
    };
    let Some(dst) = plan.output::<E>(y) else {
        return false;
    };
    let piece = par.piece(dst.len(), MIN_PIECE);
    par.chunks(dst, piece, |start, out| match src {
        Some(src) => {
            for (o, &s) in out.iter_mut().zip(&src[start..]) {
                *o = f(s);
            }
        }
        None => {
            for o in out.iter_mut() {
                *o = f(*o);
            }
        }
    });
    true
}

/// `dx = f(x, dy)` elementwise for operands `x`, `dy`, `dx` (`dx` may be `dy`).
fn binary<E: Elem>(
    plan: &Plan<'_>,
    par: &Par<'_>,
    (x, dy, dx): (usize, usize, usize),
    f: impl Fn(E, E) -> E + Sync + Send,
) -> bool {
    let Some(xs) = plan.input::<E>(x) else {
        return false;
    };
    let gs = if plan.same(dy, dx) {
        None
    } else {
        match plan.input::<E>(dy) {
            Some(s) => Some(s),
            None => return false,
        }
    };
    let Some(dst) = plan.output::<E>(dx) else {
        return false;
    };
    let piece = par.piece(dst.len(), MIN_PIECE);
    par.chunks(dst, piece, |start, out| {
        let xs = &xs[start..];
        match gs {
            Some(gs) => {
                for ((o, &x), &g) in out.iter_mut().zip(xs).zip(&gs[start..]) {
                    *o = f(x, g);
                }
            }
            None => {
                for (o, &x) in out.iter_mut().zip(xs) {
                    *o = f(x, *o);
                }
            }
        }
    });
    true
}

/// `y = max(x, 0)`, NaN kept; the kept values are the input's bits.
pub(super) fn relu(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => unary::<E>(plan, par, (0, 1), |e| {
        let v = e.get();
        if v > <E as Elem>::F::ZERO || v.is_nan() {
            e
        } else {
            E::put(<E as Elem>::F::ZERO)
        }
    }))
}

/// `dx = dy` where `x > 0`, else 0.
pub(super) fn relu_backward(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => binary::<E>(plan, par, (0, 1, 2), |x, g| {
        if x.get() > <E as Elem>::F::ZERO {
            g
        } else {
            E::put(<E as Elem>::F::ZERO)
        }
    }))
}

/// GELU (tanh approximation).
pub(super) fn gelu(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => unary::<E>(plan, par, (0, 1), |e| E::put(gelu_f(e.get()))))
}

/// `dx = dy·gelu'(x)`.
pub(super) fn gelu_backward(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => binary::<E>(plan, par, (0, 1, 2), |x, g| {
        E::put(g.get() * gelu_grad_f(x.get()))
    }))
}

/// The least rows per piece so that a piece has about [`MIN_PIECE`] elements.
pub(super) fn min_rows(n: usize) -> usize {
    MIN_PIECE.div_ceil(n.max(1))
}

/// `y[r, j] = x[r, j] + bias[j]` (`y` may be `x`).
pub(super) fn bias_add(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> bool {
    with_float!(dtype, E => bias_add_typed::<E>(plan, par))
}

fn bias_add_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>) -> bool {
    let Some(bias) = plan.input::<E>(1) else {
        return false;
    };
    let n = bias.len();
    let src = if plan.same(0, 2) {
        None
    } else {
        match plan.input::<E>(0) {
            Some(s) => Some(s),
            None => return false,
        }
    };
    let Some(dst) = plan.output::<E>(2) else {
        return false;
    };
    if n == 0 || dst.len() % n != 0 {
        return false;
    }
    let rows = dst.len() / n;
    let piece = par.piece(rows, min_rows(n)) * n;
    par.chunks(dst, piece, |start, out| {
        for (r, row) in out.chunks_exact_mut(n).enumerate() {
            match src {
                Some(src) => {
                    let x = &src[start + r * n..start + (r + 1) * n];
                    for ((o, &x), &b) in row.iter_mut().zip(x).zip(bias) {
                        *o = E::put(x.get() + b.get());
                    }
                }
                None => {
                    for (o, &b) in row.iter_mut().zip(bias) {
                        *o = E::put(o.get() + b.get());
                    }
                }
            }
        }
    });
    true
}
