//! Inputs and layouts for the `training` trials.

use xpu_hal::ops::Layout;
use xpu_hal::DType;

use super::trial::Spec;
use crate::case::CaseError;
use crate::cases::util::Rng;

/// A value range: `(low, high)`.
pub(crate) type Range = (f64, f64);

/// Values in `[-r, r]`.
pub(crate) fn signed(r: f64) -> Range {
    (-r, r)
}

/// Values in `(0, r]`.
pub(crate) fn positive(r: f64) -> Range {
    (r / 4096.0, r)
}

/// A row-major layout.
pub(crate) fn contiguous(dtype: DType, dims: &[u64]) -> Result<Layout, CaseError> {
    Ok(Layout::contiguous(dtype, dims)?)
}

/// A layout with every element followed by a one-element gap (all strides doubled).
pub(crate) fn gapped(dtype: DType, dims: &[u64]) -> Result<Layout, CaseError> {
    let dense = Layout::contiguous(dtype, dims)?;
    let strides: Vec<u64> = dense.strides().iter().map(|s| s * 2).collect();
    Ok(Layout::strided(dtype, dims, &strides)?)
}

/// `[rows, n]` with each row followed by `pad` unused elements.
pub(crate) fn padded_rows(dtype: DType, rows: u64, n: u64, pad: u64) -> Result<Layout, CaseError> {
    Ok(Layout::strided(dtype, &[rows, n], &[n + pad, 1])?)
}

/// Class labels for `rows` rows of `classes`: mostly in range, every fifth row −1
/// (ignored).
pub(crate) fn labels(g: &mut Gen, rows: u64, classes: u64) -> Vec<f64> {
    (0..rows)
        .map(|r| {
            if r % 5 == 3 {
                -1.0
            } else {
                g.below(classes) as f64
            }
        })
        .collect()
}

/// Puts NaN, −0, a subnormal (and, with `infinities`, +inf and −inf) at the first
/// elements of `values`.
pub(crate) fn with_specials(values: &mut [f64], dtype: DType, infinities: bool) {
    let subnormal = match dtype {
        DType::F64 => 1e-310,
        DType::F16 => 3.0e-6,
        _ => 1e-39,
    };
    let mut specials = vec![f64::NAN, -0.0, subnormal, -subnormal];
    if infinities {
        specials.extend([f64::INFINITY, f64::NEG_INFINITY]);
    }
    for (v, s) in values.iter_mut().zip(specials) {
        *v = s;
    }
}

/// The source of a trial's values and operand placement: deterministic from its seed.
pub(crate) struct Gen {
    rng: Rng,
    seed: u64,
}

impl Gen {
    pub(crate) fn new(seed: u64) -> Self {
        Gen {
            rng: Rng::new(seed),
            seed,
        }
    }

    fn next_seed(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(1);
        self.seed
    }

    /// A number in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// `n` pseudo-random bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        self.rng.bytes(n)
    }

    /// `n` values in `range`, on a grid of 1/4096 of its width.
    pub(crate) fn values(&mut self, n: u64, (low, high): Range) -> Vec<f64> {
        (0..n)
            .map(|_| low + (high - low) * self.rng.below(4097) as f64 / 4096.0)
            .collect()
    }

    /// Element offset of the next operand in its allocation (0 to 3 elements).
    fn skip(&mut self) -> u64 {
        self.rng.below(4)
    }

    /// An input holding `values`.
    pub(crate) fn input(&mut self, layout: Layout, values: &[f64]) -> Spec {
        let (skip, seed) = (self.skip(), self.next_seed());
        Spec::input(layout, values, skip, seed)
    }

    /// An input holding raw packed element bytes.
    pub(crate) fn input_bytes(&mut self, layout: Layout, packed: &[u8]) -> Spec {
        let (skip, seed) = (self.skip(), self.next_seed());
        Spec::input_bytes(layout, packed, skip, seed)
    }

    /// An output.
    pub(crate) fn output(&mut self, layout: Layout) -> Spec {
        let (skip, seed) = (self.skip(), self.next_seed());
        Spec::output(layout, skip, seed)
    }
}
