//! `--compare-with SEL`: the same training on a second device mix, and the precision
//! of its losses and final weights against the run's.
//!
//! Tolerance (documented in the README): data-parallel training over other devices
//! matches when every step's loss is within a relative 1e-3 of the run's
//! ([`LOSS_TOLERANCE`]) and the final weights, as one vector, have a cosine similarity
//! of at least [`WEIGHT_COSINE`] with the run's. Devices of one backend (the host
//! devices, whatever the split) give the same bits; other backends round
//! differently, and training carries those differences forward, which is why the
//! weights are compared by direction rather than element by element.

use serde_json::{json, Value};
use xpu::{Device, Result};
use xpu_conformance::precision::{metrics, Metrics};
use xpu_train::checkpoint::Checkpoint;
use xpu_train::{TrainConfig, Trainer};

/// Largest relative difference of a step's loss.
pub const LOSS_TOLERANCE: f64 = 1e-3;
/// Smallest cosine similarity of the final weights.
pub const WEIGHT_COSINE: f64 = 0.9999;

/// The comparison's outcome.
pub struct Comparison {
    /// The second mix's devices.
    pub devices: Vec<String>,
    /// Its losses against the run's.
    pub losses: Metrics,
    /// Its final weights against the run's.
    pub weights: Metrics,
}

impl Comparison {
    /// Whether the second mix matches within the documented tolerance.
    pub fn matches(&self) -> bool {
        self.losses.max_rel_err <= LOSS_TOLERANCE && self.weights.cosine >= WEIGHT_COSINE
    }

    /// The comparison as JSON.
    pub fn to_json(&self) -> Value {
        let m = |m: &Metrics| {
            json!({
                "elements": m.elements,
                "max_abs_err": m.max_abs_err,
                "max_rel_err": m.max_rel_err,
                "cosine": m.cosine,
            })
        };
        json!({
            "devices": self.devices,
            "losses": m(&self.losses),
            "weights": m(&self.weights),
            "matches": self.matches(),
        })
    }

    /// The comparison as lines of text.
    pub fn print(&self) {
        println!("compared with training on {}:", self.devices.join(", "));
        for (what, m) in [("losses", &self.losses), ("weights", &self.weights)] {
            println!(
                "  {what:<8} {:>8} values  max abs {:.3e}  max rel {:.3e}  cosine {:.9}",
                m.elements, m.max_abs_err, m.max_rel_err, m.cosine
            );
        }
        println!(
            "  {} (losses within a relative {LOSS_TOLERANCE:e}, weights' cosine at least {WEIGHT_COSINE})",
            if self.matches() {
                "matches"
            } else {
                "DOES NOT MATCH"
            }
        );
    }
}

/// The final weights of replica 0 as one vector.
pub fn weights(trainer: &Trainer) -> Result<Vec<f64>> {
    Ok(trainer
        .read_parameters(0)?
        .into_iter()
        .flatten()
        .map(f64::from)
        .collect())
}

/// Trains `config` on `devices` from `start` (or from the beginning) to `steps`, and
/// compares the losses of the steps both ran and the final weights with `losses` and
/// `final_weights`.
pub fn compare(
    devices: &[Device],
    config: &TrainConfig,
    start: Option<&Checkpoint>,
    steps: u64,
    losses: &[(u64, f64)],
    final_weights: &[f64],
) -> Result<Comparison> {
    let mut t = Trainer::new(devices, config.clone())?;
    if let Some(c) = start {
        t.restore(c)?;
    }
    let (mut got, mut want) = (Vec::new(), Vec::new());
    while t.steps_done() < steps {
        let r = t.step()?;
        if let Some((_, l)) = losses.iter().find(|(s, _)| *s == r.step) {
            got.push(r.loss);
            want.push(*l);
        }
    }
    let w = weights(&t)?;
    Ok(Comparison {
        devices: devices.iter().map(|d| d.id().to_string()).collect(),
        losses: metrics(&got, &want, LOSS_TOLERANCE),
        weights: metrics(&w, final_weights, LOSS_TOLERANCE),
    })
}
