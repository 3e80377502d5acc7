//! Mixed precision: what is stored and multiplied in `bf16` or `f16`, what stays `f32`,
//! and the dynamic loss scale that keeps `f16` gradients from underflowing.
//!
//! With a low [`Precision`], a replica keeps `f32` master parameters and AdamW moments
//! and, beside them, a copy of the parameters in the compute dtype, cast from the
//! masters after every update. Activations, their gradients, the per-micro-batch
//! gradient slots and the losses are in the compute dtype; every operation computes
//! in `f32` and rounds its result once (the HAL's rule), and layer norm's row
//! statistics stay `f32`. The slots are widened to
//! `f32` before they are summed by the fixed tree, so the accumulation over the
//! batch and the update are `f32`.
//!
//! `f16` has 5 exponent bits: gradients below 2⁻²⁴ vanish. The loss gradient is
//! multiplied by the [`LossScale`] (2¹⁶ to start), every gradient with it; the summed
//! gradients are divided by it again in `f32` and checked: when any is infinite or NaN
//! the update is skipped and the scale halved, and after [`GROWTH_INTERVAL`] clean
//! steps in a row it is doubled. The scale is part of a checkpoint, so a resumed `f16`
//! run continues bit for bit like the others.

use serde::{Deserialize, Serialize};
use xpu_hal::reference::{bf16, f16};
use xpu_hal::{DType, Error, Result};

/// The dtype a model is stored and computed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in `f32`.
    #[default]
    F32,
    /// `bf16` storage and matrix products, `f32` masters and accumulation.
    Bf16,
    /// `f16` storage and matrix products, `f32` masters and accumulation, dynamic loss
    /// scaling.
    F16,
}

impl Precision {
    /// The compute dtype.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    /// Whether the loss is scaled.
    pub fn scales_loss(self) -> bool {
        self == Precision::F16
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.dtype().fmt(f)
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Precision> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "f16" => Ok(Precision::F16),
            _ => Err(Error::invalid(format!(
                "unknown precision `{s}`; give f32, bf16 or f16"
            ))),
        }
    }
}

/// `values` as little-endian elements of `dtype` (`f32`, `bf16` or `f16`), rounded to
/// nearest; a value beyond the dtype's range becomes its largest finite value of that
/// sign (a mask's −10⁹ stays finite in `f16`).
pub(crate) fn encode(values: &[f32], dtype: DType) -> Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::BF16 => values
            .iter()
            .flat_map(|v| {
                bf16::from_f32(v.clamp(-bf16::MAX.to_f32(), bf16::MAX.to_f32())).to_le_bytes()
            })
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|v| {
                f16::from_f32(v.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32())).to_le_bytes()
            })
            .collect(),
        other => return Err(Error::invalid(format!("{other} is not a compute dtype"))),
    })
}

/// Little-endian elements of `dtype` (`f32`, `bf16` or `f16`) as `f32`.
pub(crate) fn decode(bytes: &[u8], dtype: DType) -> Result<Vec<f32>> {
    Ok(match dtype {
        DType::F32 => bytemuck::pod_collect_to_vec(bytes),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => return Err(Error::invalid(format!("{other} is not a compute dtype"))),
    })
}

/// Clean steps in a row after which the loss scale doubles.
pub const GROWTH_INTERVAL: u32 = 200;
/// The first loss scale.
pub const INITIAL_SCALE: f32 = 65536.0;
/// The smallest loss scale: below it, the gradients overflow in `f32` itself, which no
/// scale fixes.
const MIN_SCALE: f32 = 1.0;
/// The largest: `f16`'s range is spent well before.
const MAX_SCALE: f32 = 16_777_216.0;

/// The dynamic loss scale of an `f16` run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// The factor of the loss gradient.
    pub scale: f32,
    /// Clean steps since the scale last changed.
    pub clean: u32,
    /// Updates skipped so far (their gradients overflowed).
    pub skipped: u64,
}

impl Default for LossScale {
    fn default() -> Self {
        LossScale {
            scale: INITIAL_SCALE,
            clean: 0,
            skipped: 0,
        }
    }
}

impl LossScale {
    /// Takes a step's outcome: `finite` when every summed gradient was finite (the
    /// update was applied). Returns whether the scale changed.
    pub fn observe(&mut self, finite: bool) -> bool {
        if !finite {
            self.skipped += 1;
            self.clean = 0;
            let halved = (self.scale / 2.0).max(MIN_SCALE);
            let changed = halved != self.scale;
            self.scale = halved;
            return changed;
        }
        self.clean += 1;
        if self.clean >= GROWTH_INTERVAL && self.scale < MAX_SCALE {
            self.scale *= 2.0;
            self.clean = 0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_every_compute_dtype() {
        let values = [0.0f32, 1.0, -2.5, 0.1, 3.0e-3, -1e9];
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let back = decode(&encode(&values, dtype).unwrap(), dtype).unwrap();
            for (v, b) in values[..5].iter().zip(&back) {
                assert!((v - b).abs() <= v.abs() * 1e-2, "{dtype}: {v} → {b}");
            }
            // Out of range saturates rather than becoming infinite.
            assert!(
                back[5].is_finite() && back[5] < -6e4,
                "{dtype}: {}",
                back[5]
            );
        }
        assert_eq!(encode(&[1.0], DType::F32).unwrap(), 1.0f32.to_le_bytes());
        assert!(encode(&[1.0], DType::I32).is_err());
    }

    #[test]
    fn the_loss_scale_halves_on_overflow_and_doubles_after_clean_steps() {
        let mut s = LossScale::default();
        assert!(s.observe(false));
        assert_eq!((s.scale, s.skipped), (INITIAL_SCALE / 2.0, 1));
        for _ in 0..GROWTH_INTERVAL - 1 {
            assert!(!s.observe(true));
        }
        assert!(s.observe(true));
        assert_eq!((s.scale, s.clean), (INITIAL_SCALE, 0));
        let mut low = LossScale {
            scale: 1.0,
            ..LossScale::default()
        };
        assert!(!low.observe(false));
        assert_eq!(low.scale, 1.0);
    }

    #[test]
    fn precisions_parse_and_name_their_dtype() {
        for p in [Precision::F32, Precision::Bf16, Precision::F16] {
            assert_eq!(p.to_string().parse::<Precision>().unwrap(), p);
        }
        assert!("f8".parse::<Precision>().is_err());
        assert!(Precision::F16.scales_loss() && !Precision::Bf16.scales_loss());
    }
}
