//! Optimizer updates (SGD with momentum, AdamW) elementwise over pieces of the
//! parameters, in the computing precision with the constants prepared in `f64`.

use xpu_hal::DType;

use super::access::Plan;
use super::elementwise::MIN_PIECE;
use super::math::{Elem, Float};
use super::{with_float, Par};

/// The parameters of [`xpu_hal::ops::Op::SgdMomentum`].
pub(super) struct Sgd {
    pub(super) lr: f32,
    pub(super) momentum: f32,
    pub(super) weight_decay: f32,
    pub(super) nesterov: bool,
}

/// The parameters of [`xpu_hal::ops::Op::AdamW`].
pub(super) struct Adam {
    pub(super) lr: f32,
    pub(super) beta1: f32,
    pub(super) beta2: f32,
    pub(super) eps: f32,
    pub(super) weight_decay: f32,
    pub(super) step: u32,
}

/// A piece: its first element, and the same range of three written tensors.
type Piece<'a, E> = (usize, &'a mut [E], &'a mut [E], &'a mut [E]);

/// Pieces of `param` and the same pieces of two more tensors, with the matching piece
/// of `grad`.
fn pieces<'a, E: Send>(
    par: &Par<'_>,
    param: &'a mut [E],
    a: &'a mut [E],
    b: &'a mut [E],
) -> Vec<Piece<'a, E>> {
    let piece = par.piece(param.len(), MIN_PIECE);
    param
        .chunks_mut(piece)
        .zip(a.chunks_mut(piece))
        .zip(b.chunks_mut(piece))
        .enumerate()
        .map(|(i, ((p, a), b))| (i * piece, p, a, b))
        .collect()
}

/// `g = grad + wd·param; v = momentum·v + g; param −= lr·(nesterov ? g + momentum·v : v)`.
pub(super) fn sgd_momentum(plan: &Plan<'_>, par: &Par<'_>, dtype: DType, s: Sgd) -> bool {
    with_float!(dtype, E => sgd_typed::<E>(plan, par, &s))
}

fn sgd_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>, s: &Sgd) -> bool {
    let (Some(param), Some(grad), Some(vel)) =
        (plan.output::<E>(0), plan.input::<E>(1), plan.output::<E>(2))
    else {
        return false;
    };
    let lr = E::F::of(f64::from(s.lr));
    let mom = E::F::of(f64::from(s.momentum));
    let wd = E::F::of(f64::from(s.weight_decay));
    let nesterov = s.nesterov;
    let items: Vec<_> = {
        let piece = par.piece(param.len(), MIN_PIECE);
        param
            .chunks_mut(piece)
            .zip(vel.chunks_mut(piece))
            .enumerate()
            .map(|(i, (p, v))| (i * piece, p, v))
            .collect()
    };
    par.map(items, |(start, p, v)| {
        for ((p, v), &g) in p.iter_mut().zip(v.iter_mut()).zip(&grad[start..]) {
            let pv = p.get();
            let gi = g.get() + wd * pv;
            let vn = mom * v.get() + gi;
            let step = if nesterov { gi + mom * vn } else { vn };
            *v = E::put(vn);
            *p = E::put(pv - lr * step);
        }
    });
    true
}

/// AdamW with bias correction and decoupled weight decay.
pub(super) fn adamw(plan: &Plan<'_>, par: &Par<'_>, dtype: DType, a: Adam) -> bool {
    with_float!(dtype, E => adamw_typed::<E>(plan, par, &a))
}

fn adamw_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>, a: &Adam) -> bool {
    let (Some(param), Some(grad), Some(m), Some(v)) = (
        plan.output::<E>(0),
        plan.input::<E>(1),
        plan.output::<E>(2),
        plan.output::<E>(3),
    ) else {
        return false;
    };
    let (b1, b2) = (f64::from(a.beta1), f64::from(a.beta2));
    let step = a.step.min(i32::MAX as u32) as i32;
    let c1 = 1.0 - b1.powi(step);
    let c2 = 1.0 - b2.powi(step);
    let f = <E::F as Float>::of;
    let (fb1, fb2, one_b1, one_b2) = (f(b1), f(b2), f(1.0 - b1), f(1.0 - b2));
    let (inv_c1, inv_c2) = (f(1.0 / c1), f(1.0 / c2));
    let (lr, eps, wd) = (
        f(f64::from(a.lr)),
        f(f64::from(a.eps)),
        f(f64::from(a.weight_decay)),
    );
    par.map(pieces(par, param, m, v), |(start, p, m, v)| {
        for (((p, m), v), &g) in p
            .iter_mut()
            .zip(m.iter_mut())
            .zip(v.iter_mut())
            .zip(&grad[start..])
        {
            let g = g.get();
            let mn = fb1 * m.get() + one_b1 * g;
            let vn = fb2 * v.get() + one_b2 * g * g;
            let pv = p.get();
            let update = (mn * inv_c1) / ((vn * inv_c2).sqrt() + eps) + wd * pv;
            *m = E::put(mn);
            *v = E::put(vn);
            *p = E::put(pv - lr * update);
        }
    });
    true
}
