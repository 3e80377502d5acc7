//! The arithmetic of the fast paths: the element types, a float trait over `f32` and
//! `f64`, vectorisable `exp` and `tanh` for `f32`, and the activation formulas of the
//! reference ([`xpu_hal::reference::ops::gelu`], [`xpu_hal::reference::ops::gelu_grad`])
//! written once for both widths.

use std::ops::{Add, Div, Mul, Neg, Sub};

use bytemuck::Pod;
use xpu_hal::reference::{bf16, f16, Element, Wide};

/// The precision a fast path computes in: `f32` (for `f32`, `f16`, `bf16`) or `f64`.
pub(super) trait Float:
    Pod
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const INFINITY: Self;
    const NAN: Self;
    /// `v` rounded to this type (for constants).
    fn of(v: f64) -> Self;
    /// The value in `f64` (exact).
    fn wide(self) -> f64;
    /// `eˣ` (within a few ulp).
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// The hyperbolic tangent (within a few ulp of ±1, absolute error ~1e-7 near 0).
    fn tanh(self) -> Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
}

impl Float for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const INFINITY: Self = f32::INFINITY;
    const NAN: Self = f32::NAN;
    #[inline(always)]
    fn of(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn wide(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f32::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        tanh_f32(self)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Float for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const INFINITY: Self = f64::INFINITY;
    const NAN: Self = f64::NAN;
    #[inline(always)]
    fn of(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f64::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

/// A float dtype's element: loaded into its [`Float`], stored rounded once.
pub(super) trait Elem: Element {
    /// What it computes in.
    type F: Float;
    /// The value, widened.
    fn get(self) -> Self::F;
    /// `v` rounded to nearest even.
    fn put(v: Self::F) -> Self;
    /// `v` rounded as the reference narrows its `f64` results.
    #[inline(always)]
    fn from_wide(v: f64) -> Self {
        Self::narrow(Wide::Float(v))
    }
    /// The value in `f64` (exact).
    #[inline(always)]
    fn wide(self) -> f64 {
        self.get().wide()
    }
}

impl Elem for f32 {
    type F = f32;
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
    #[inline(always)]
    fn put(v: f32) -> Self {
        v
    }
}

impl Elem for f64 {
    type F = f64;
    #[inline(always)]
    fn get(self) -> f64 {
        self
    }
    #[inline(always)]
    fn put(v: f64) -> Self {
        v
    }
}

impl Elem for f16 {
    type F = f32;
    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn put(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Elem for bf16 {
    type F = f32;
    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn put(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// `eˣ` in `f32` without branches (so loops over it vectorise): Cody–Waite reduction
/// `x = n·ln2 + r` and Cephes' degree-6 polynomial for `eʳ`, within ~2 ulp; 0 below
/// −86 (where eˣ < 5e-38), ∞ above ln(f32::MAX), NaN for NaN.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer.
    const SHIFTER: f32 = 12_582_912.0;
    let xc = x.clamp(-86.0, 88.72);
    let t = xc * LOG2E + SHIFTER;
    let n = t - SHIFTER;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2ⁿ as 2ⁿ⁻¹·2, so that n = 128 (x close to the top) stays representable.
    // n sits in t's low mantissa bits (t is in [2²³, 2²⁴), where the ulp is 1): integer
    // arithmetic on the bits, which vectorises where a float-to-int cast does not.
    let k = (t.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    let scale = f32::from_bits((k.wrapping_add(126) as u32) << 23);
    let out = y * scale * 2.0;
    if x > 88.72 {
        f32::INFINITY
    } else if x < -86.0 {
        0.0
    } else {
        // NaN passes through the arithmetic.
        out
    }
}

/// `tanh` in `f32` from [`exp_f32`]: `sign(z)·(1 − e)/(1 + e)` with `e = e^(−2|z|)`.
#[inline(always)]
pub(super) fn tanh_f32(z: f32) -> f32 {
    let e = exp_f32(-2.0 * z.abs());
    ((1.0 - e) / (1.0 + e)).copysign(z)
}

/// `√(2/π)`, GELU's constant (as in the reference).
const GELU_C: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the GELU tanh approximation.
const GELU_A: f64 = 0.044_715;

/// [`xpu_hal::reference::ops::gelu`] in `F`: `x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
#[inline(always)]
pub(super) fn gelu<F: Float>(x: F) -> F {
    let (c, a, half) = (F::of(GELU_C), F::of(GELU_A), F::of(0.5));
    half * x * (F::ONE + (c * (x + a * x * x * x)).tanh())
}

/// [`xpu_hal::reference::ops::gelu_grad`] in `F`: the derivative of [`gelu`].
#[inline(always)]
pub(super) fn gelu_grad<F: Float>(x: F) -> F {
    let (c, a, half) = (F::of(GELU_C), F::of(GELU_A), F::of(0.5));
    let t = (c * (x + a * x * x * x)).tanh();
    half * (F::ONE + t) + half * x * (F::ONE - t * t) * c * (F::ONE + F::of(3.0) * a * x * x)
}

/// NaN if either is NaN, else the larger (the reference's `max` for softmax and
/// reductions).
#[inline(always)]
pub(super) fn nan_max<F: Float>(a: F, b: F) -> F {
    if a.is_nan() || b.is_nan() {
        F::NAN
    } else if b > a {
        b
    } else {
        a
    }
}

/// NaN if either is NaN, else the smaller.
#[inline(always)]
pub(super) fn nan_min<F: Float>(a: F, b: F) -> F {
    if a.is_nan() || b.is_nan() {
        F::NAN
    } else if b < a {
        b
    } else {
        a
    }
}

/// `Σ f(x)` over `xs` in `F`, eight partial sums (so the loop vectorises).
#[inline(always)]
pub(super) fn sum<T: Copy, F: Float>(xs: &[T], f: impl Fn(T) -> F) -> F {
    let mut acc = [F::ZERO; 8];
    let chunks = xs.chunks_exact(8);
    let mut rest = F::ZERO;
    for &x in chunks.remainder() {
        rest = rest + f(x);
    }
    for c in chunks {
        for k in 0..8 {
            acc[k] = acc[k] + f(c[k]);
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + rest
}

/// `Σ f(a, b)` over two slices of one length, as [`sum`].
#[inline(always)]
pub(super) fn sum2<A: Copy, B: Copy, F: Float>(a: &[A], b: &[B], f: impl Fn(A, B) -> F) -> F {
    let mut acc = [F::ZERO; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let mut rest = F::ZERO;
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        rest = rest + f(x, y);
    }
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] = acc[k] + f(x[k], y[k]);
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + rest
}

/// The largest of `f(x)` over `xs` (NaN if any is NaN; −∞ for none), eight lanes.
#[inline(always)]
pub(super) fn max<T: Copy, F: Float>(xs: &[T], f: impl Fn(T) -> F) -> F {
    let mut acc = [-F::INFINITY; 8];
    let mut nan = false;
    let chunks = xs.chunks_exact(8);
    let mut rest = -F::INFINITY;
    for &x in chunks.remainder() {
        rest = nan_max(rest, f(x));
    }
    for c in chunks {
        for k in 0..8 {
            let v = f(c[k]);
            nan |= v.is_nan();
            acc[k] = if v > acc[k] { v } else { acc[k] };
        }
    }
    if nan {
        return F::NAN;
    }
    acc.iter().fold(rest, |m, &v| nan_max(m, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpu_hal::reference::ops as reference;

    #[test]
    fn exp_is_close_over_the_range() {
        let mut x = -100.0f32;
        while x < 100.0 {
            let (got, want) = (exp_f32(x), f64::from(x).exp());
            if want > f64::from(f32::MAX) {
                assert_eq!(got, f32::INFINITY, "{x}");
            } else if x < -86.0 {
                assert_eq!(got, 0.0, "{x}");
            } else {
                let err = (f64::from(got) - want).abs() / want;
                assert!(err < 4e-7, "exp({x}) = {got}, want {want} ({err})");
            }
            x += 0.013;
        }
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn tanh_and_gelu_match_the_reference() {
        let mut x = -12.0f64;
        while x < 12.0 {
            let t = f64::from(tanh_f32(x as f32));
            assert!((t - x.tanh()).abs() < 3e-7, "tanh({x}) = {t}");
            let xf = f64::from(x as f32);
            let (g, gg) = (gelu(x as f32), gelu_grad(x as f32));
            let (wg, wgg) = (reference::gelu(xf), reference::gelu_grad(xf));
            assert!(
                (f64::from(g) - wg).abs() < 1e-6 * (1.0 + wg.abs()),
                "gelu({x})"
            );
            // A few f32 ulp of 1: 1 − tanh² cancels in f32 for large |x|.
            assert!(
                (f64::from(gg) - wgg).abs() < 3e-6 * (1.0 + wgg.abs()),
                "gelu'({x})"
            );
            assert_eq!(gelu(xf), reference::gelu(xf));
            assert_eq!(gelu_grad(xf), reference::gelu_grad(xf));
            x += 0.0071;
        }
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn lane_reductions() {
        let xs: Vec<f32> = (0..37).map(|i| i as f32 - 10.0).collect();
        assert_eq!(sum(&xs, |x| x), xs.iter().sum::<f32>());
        assert_eq!(
            sum2(&xs, &xs, |a, b| a * b),
            xs.iter().map(|x| x * x).sum::<f32>()
        );
        assert_eq!(max(&xs, |x| x), 26.0);
        let mut with_nan = xs.clone();
        with_nan[3] = f32::NAN;
        assert!(max(&with_nan, |x| x).is_nan());
        with_nan[3] = 0.0;
        with_nan[36] = f32::NAN;
        assert!(max(&with_nan, |x| x).is_nan());
        assert_eq!(max::<f32, f32>(&[], |x| x), f32::NEG_INFINITY);
    }
}
