//! Counter-based random numbers and dropout: element `n` uses value `n` of the
//! [`PhiloxStream`] for the seed and offset, so pieces (cut at multiples of four
//! elements, one Philox block each) can be computed by any thread in any order.

use xpu_hal::ops::{uniform_from_bits, Distribution, PhiloxStream};
use xpu_hal::DType;

use super::access::Plan;
use super::elementwise::MIN_PIECE;
use super::math::Elem;
use super::{with_float, Par};

/// A piece length that is a multiple of 4 (whole Philox blocks).
fn blocks_piece(par: &Par<'_>, len: usize) -> usize {
    par.piece(len, MIN_PIECE).next_multiple_of(4)
}

/// Fills `out` (starting at element `start`, a multiple of 4) with `f(n, value n)`.
#[inline(always)]
fn each_value<T>(s: &PhiloxStream, start: usize, out: &mut [T], f: impl Fn(usize, u32, &mut T)) {
    for (b, quad) in out.chunks_mut(4).enumerate() {
        let first = start + 4 * b;
        let values = s.block((first / 4) as u64);
        for (k, (o, &v)) in quad.iter_mut().zip(&values).enumerate() {
            f(first + k, v, o);
        }
    }
}

/// Draws `y` from `dist`.
pub(super) fn random(
    plan: &Plan<'_>,
    par: &Par<'_>,
    dtype: DType,
    dist: Distribution,
    seed: u64,
    offset: u64,
) -> bool {
    let s = PhiloxStream { seed, offset };
    match dist {
        Distribution::Bits => {
            let Some(y) = plan.output::<u32>(0) else {
                return false;
            };
            let piece = blocks_piece(par, y.len());
            par.chunks(y, piece, |start, out| {
                each_value(&s, start, out, |_, v, o| *o = v);
            });
            true
        }
        Distribution::Uniform { low, high } => {
            with_float!(dtype, E => uniform::<E>(plan, par, &s, low, high))
        }
        Distribution::Normal { mean, std } => {
            with_float!(dtype, E => normal::<E>(plan, par, &s, mean, std))
        }
    }
}

/// `low + (high − low)·u` in `f64`, rounded once as the reference does.
fn uniform<E: Elem>(plan: &Plan<'_>, par: &Par<'_>, s: &PhiloxStream, low: f32, high: f32) -> bool {
    let Some(y) = plan.output::<E>(0) else {
        return false;
    };
    let (low, high) = (f64::from(low), f64::from(high));
    let piece = blocks_piece(par, y.len());
    par.chunks(y, piece, |start, out| {
        each_value(s, start, out, |_, v, o| {
            *o = E::from_wide(low + (high - low) * f64::from(uniform_from_bits(v)));
        });
    });
    true
}

/// `mean + std·z` with `z` from [`PhiloxStream::normal`]'s Box–Muller, each pair of
/// values giving a cosine and a sine from one logarithm.
fn normal<E: Elem>(plan: &Plan<'_>, par: &Par<'_>, s: &PhiloxStream, mean: f32, std: f32) -> bool {
    let Some(y) = plan.output::<E>(0) else {
        return false;
    };
    let (mean, std) = (f64::from(mean), f64::from(std));
    let piece = blocks_piece(par, y.len());
    par.chunks(y, piece, |start, out| {
        for (b, quad) in out.chunks_mut(4).enumerate() {
            let z = normal_quad(s.block(((start + 4 * b) / 4) as u64));
            for (o, &z) in quad.iter_mut().zip(&z) {
                *o = E::from_wide(mean + std * z);
            }
        }
    });
    true
}

/// The four standard normals of one Philox block, as [`PhiloxStream::normal`] computes
/// them (values 0 and 1 share a logarithm, 2 and 3 another).
fn normal_quad(block: [u32; 4]) -> [f64; 4] {
    let mut z = [0.0f64; 4];
    for pair in [0, 2] {
        // u1 in (0, 1], u2 in [0, 1).
        let u1 = (f64::from(block[pair] >> 8) + 1.0) / 16_777_216.0;
        let u2 = f64::from(block[pair + 1] >> 8) / 16_777_216.0;
        let r = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        z[pair] = r * angle.cos();
        z[pair + 1] = r * angle.sin();
    }
    z
}

/// Inverted dropout: `y = x/(1 − p)` where the element's uniform is at least `p`, else 0
/// (the product in `f64`, rounded once, as the reference); `y` may be `x`.
pub(super) fn dropout(
    plan: &Plan<'_>,
    par: &Par<'_>,
    dtype: DType,
    p: f32,
    seed: u64,
    offset: u64,
) -> bool {
    with_float!(dtype, E => dropout_typed::<E>(plan, par, p, &PhiloxStream { seed, offset }))
}

fn dropout_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>, p: f32, s: &PhiloxStream) -> bool {
    let src = if plan.same(0, 1) {
        None
    } else {
        match plan.input::<E>(0) {
            Some(x) => Some(x),
            None => return false,
        }
    };
    let Some(y) = plan.output::<E>(1) else {
        return false;
    };
    let scale = 1.0 / (1.0 - f64::from(p));
    let piece = blocks_piece(par, y.len());
    let zero = E::from_wide(0.0);
    par.chunks(y, piece, |start, out| {
        each_value(s, start, out, |n, v, o| {
            let x = match src {
                Some(src) => src[n],
                None => *o,
            };
            // The reference's decision, `dropout_keeps`, on the value already drawn.
            *o = if uniform_from_bits(v) >= p {
                E::from_wide(x.wide() * scale)
            } else {
                zero
            };
        });
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpu_hal::reference::ops::dropout_keeps;

    /// The decision `dropout` makes from the value it draws is the reference's.
    #[test]
    fn dropout_decision_is_the_references() {
        let s = PhiloxStream {
            seed: 9,
            offset: 77,
        };
        for p in [0.0f32, 0.1, 0.5, 0.999] {
            let mut out = vec![0u8; 4096];
            each_value(&s, 0, &mut out, |_, v, o| {
                *o = u8::from(uniform_from_bits(v) >= p)
            });
            for (n, &o) in out.iter().enumerate() {
                assert_eq!(o == 1, dropout_keeps(&s, n as u64, p));
            }
        }
    }

    /// The pairs of `normal` are `PhiloxStream::normal`'s values.
    #[test]
    fn normals_are_the_streams() {
        let s = PhiloxStream { seed: 3, offset: 5 };
        for b in 0..64u64 {
            for (k, &z) in normal_quad(s.block(b)).iter().enumerate() {
                assert_eq!(z, s.normal(4 * b + k as u64));
            }
        }
    }
}
