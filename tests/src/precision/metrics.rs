//! The accuracy metrics chip qualifiers compare per-operation outputs with.

use serde::Serialize;
use xpu_hal::DType;

/// How far `got` is from `want`, element by element (both widened to `f64`).
///
/// An element where both are NaN, or both the same infinity, counts as exact; one where
/// only one side is finite, or the infinities differ, has infinite absolute and relative
/// error and is left out of the cosine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Metrics {
    /// Elements compared.
    pub elements: u64,
    /// `max |got − want|`.
    pub max_abs_err: f64,
    /// `max |got − want| / max(|want|, 1e-12)`.
    pub max_rel_err: f64,
    /// `Σ got·want / (‖got‖·‖want‖)` over the finite pairs (1 when both are all zero).
    pub cosine: f64,
    /// Share of elements whose relative error exceeds 0.1%.
    #[serde(rename = "frac_rel_err_gt_1e-3")]
    pub frac_rel_err_gt_1e_3: f64,
    /// Share of elements whose relative error exceeds 0.5%.
    #[serde(rename = "frac_rel_err_gt_5e-3")]
    pub frac_rel_err_gt_5e_3: f64,
    /// Whether every element is within the dtype's tolerance (see [`within_tolerance`]).
    pub within_tolerance: bool,
}

/// The relative tolerance of results of `dtype` against a reference computed in `f64`:
/// 1e-9 for `f64`, 1e-4 for `f32`, 2e-3 for `f16`, 1.6e-2 for `bf16`, 0 (exact)
/// otherwise.
pub fn relative_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// Whether every element satisfies `|got − want| ≤ tol·(|want| + max|want|)` (max over
/// the finite reference values), NaN where the reference is NaN and the same infinity
/// where it is infinite.
pub fn within_tolerance(got: &[f64], want: &[f64], tol: f64) -> bool {
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    got.len() == want.len()
        && got.iter().zip(want).all(|(&g, &w)| {
            if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w
            } else {
                g.is_finite() && (g - w).abs() <= tol * (w.abs() + scale)
            }
        })
}

/// The metrics of `got` against `want` (same length; extra elements of the longer are
/// ignored), with `tol` for [`Metrics::within_tolerance`].
pub fn metrics(got: &[f64], want: &[f64], tol: f64) -> Metrics {
    let mut m = Metrics {
        elements: got.len().min(want.len()) as u64,
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        cosine: 1.0,
        frac_rel_err_gt_1e_3: 0.0,
        frac_rel_err_gt_5e_3: 0.0,
        within_tolerance: got.len() == want.len() && within_tolerance(got, want, tol),
    };
    let (mut dot, mut gg, mut ww) = (0.0f64, 0.0f64, 0.0f64);
    let (mut over3, mut over5) = (0u64, 0u64);
    for (&g, &w) in got.iter().zip(want) {
        let same_special = (g.is_nan() && w.is_nan()) || (g.is_infinite() && g == w);
        let (abs, rel) = if same_special {
            (0.0, 0.0)
        } else if !g.is_finite() || !w.is_finite() {
            (f64::INFINITY, f64::INFINITY)
        } else {
            dot += g * w;
            gg += g * g;
            ww += w * w;
            let abs = (g - w).abs();
            (abs, abs / w.abs().max(1e-12))
        };
        m.max_abs_err = m.max_abs_err.max(abs);
        m.max_rel_err = m.max_rel_err.max(rel);
        over3 += u64::from(rel > 1e-3);
        over5 += u64::from(rel > 5e-3);
    }
    if gg > 0.0 || ww > 0.0 {
        m.cosine = if gg > 0.0 && ww > 0.0 {
            dot / (gg.sqrt() * ww.sqrt())
        } else {
            0.0
        };
    }
    if m.elements > 0 {
        m.frac_rel_err_gt_1e_3 = over3 as f64 / m.elements as f64;
        m.frac_rel_err_gt_5e_3 = over5 as f64 / m.elements as f64;
    }
    m
}

/// Folds the metrics of several tensors into one: worst errors, lowest cosine, shares
/// weighted by element counts, within tolerance only if all were.
pub fn combine(all: &[Metrics]) -> Option<Metrics> {
    let first = *all.first()?;
    let total: u64 = all.iter().map(|m| m.elements).sum();
    let share = |f: fn(&Metrics) -> f64| {
        if total == 0 {
            0.0
        } else {
            all.iter().map(|m| f(m) * m.elements as f64).sum::<f64>() / total as f64
        }
    };
    Some(Metrics {
        elements: total,
        max_abs_err: all
            .iter()
            .map(|m| m.max_abs_err)
            .fold(first.max_abs_err, f64::max),
        max_rel_err: all
            .iter()
            .map(|m| m.max_rel_err)
            .fold(first.max_rel_err, f64::max),
        cosine: all.iter().map(|m| m.cosine).fold(first.cosine, f64::min),
        frac_rel_err_gt_1e_3: share(|m| m.frac_rel_err_gt_1e_3),
        frac_rel_err_gt_5e_3: share(|m| m.frac_rel_err_gt_5e_3),
        within_tolerance: all.iter().all(|m| m.within_tolerance),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_of_known_vectors() {
        let want = [1.0, 2.0, 0.0, f64::NAN, 4.0];
        let got = [1.0, 2.004, 0.0, f64::NAN, 4.0];
        let m = metrics(&got, &want, 1e-4);
        assert!((m.max_abs_err - 0.004).abs() < 1e-12);
        assert!((m.max_rel_err - 0.002).abs() < 1e-9);
        assert!(m.cosine > 0.99999 && m.cosine <= 1.0 + 1e-12);
        assert_eq!(m.frac_rel_err_gt_1e_3, 0.2);
        assert_eq!(m.frac_rel_err_gt_5e_3, 0.0);
        assert!(!m.within_tolerance);
        assert!(metrics(&got, &want, 1e-3).within_tolerance);
        assert!(!metrics(&got, &want, 4e-4).within_tolerance);
        let inf = metrics(&[f64::INFINITY], &[1.0], 1.0);
        assert!(inf.max_abs_err.is_infinite() && !inf.within_tolerance);
        let opposite = metrics(&[-1.0, -2.0], &[1.0, 2.0], 1e-4);
        assert!((opposite.cosine + 1.0).abs() < 1e-12);
        let all = combine(&[m, opposite]).unwrap();
        assert_eq!(all.elements, 7);
        assert!(!all.within_tolerance && all.cosine < -0.99);
    }
}
