//! Performance models: how long a codelet takes on a kind of device, learned from runs.
//!
//! As in StarPU, a model is kept per (codelet, device, data footprint): the
//! history of measured times for each footprint (count, mean, deviation, Welford's
//! running form), and across footprints a regression `t = a·n^b + c` fitted in log space
//! to the per-footprint means, which predicts sizes never seen. A prediction prefers the
//! history of the exact footprint once it has [`MIN_SAMPLES`] samples, then the
//! regression once [`MIN_FOOTPRINTS`] footprints have been seen, and otherwise says "not
//! calibrated", which placement answers by spreading such tasks over devices to measure
//! them. A measurement far from its footprint's mean (more than [`RELEARN_FACTOR`] × or
//! less than 1/[`RELEARN_FACTOR`] of it) is held out as an outlier; [`RELEARN_AFTER`] of
//! them in a row replace the history: the device or the code changed. A smaller
//! change moves the mean by itself: past [`MEMORY`] samples it is exponentially
//! weighted, so a device that slows down (a straggler) is soon predicted slower.
//!
//! Models are saved as JSON under `XPU_CACHE_DIR/perfmodels/` (one file per codelet) and
//! loaded at start-up, so they survive restarts.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use crate::codelet::Codelet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Samples of one footprint before its history is trusted.
pub const MIN_SAMPLES: u64 = 3;
/// Distinct footprints before the regression is trusted.
pub const MIN_FOOTPRINTS: usize = 3;
/// A measurement this many times off the mean (either way) counts as a miss.
pub const RELEARN_FACTOR: f64 = 4.0;
/// Consecutive misses after which a footprint's history restarts.
pub const RELEARN_AFTER: u32 = 3;
/// Samples a history averages plainly; after that the mean and deviation are
/// exponentially weighted with weight `1 / MEMORY` for the newest sample, so that a
/// gradual change of speed (too small to be a miss) is followed within a few times
/// this many samples.
pub const MEMORY: u64 = 16;

/// The history of one footprint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct History {
    /// Samples taken.
    pub count: u64,
    /// Their mean, in seconds.
    pub mean: f64,
    /// Sum of squared deviations (Welford), in seconds².
    pub m2: f64,
    /// Consecutive measurements far from the mean, held out of it: outliers if a
    /// normal one follows, a new normal if [`RELEARN_AFTER`] of them come in a row.
    #[serde(default)]
    pub misses: Vec<f64>,
}

impl History {
    /// Adds one measurement of `seconds`.
    pub fn add(&mut self, seconds: f64) {
        if self.count >= MIN_SAMPLES && self.mean > 0.0 {
            let ratio = seconds / self.mean;
            if !(1.0 / RELEARN_FACTOR..=RELEARN_FACTOR).contains(&ratio) {
                self.misses.push(seconds);
                if self.misses.len() >= RELEARN_AFTER as usize {
                    let fresh = std::mem::take(&mut self.misses);
                    *self = History::default();
                    for t in fresh {
                        self.include(t);
                    }
                }
                return;
            }
            self.misses.clear();
        }
        self.include(seconds);
    }

    fn include(&mut self, seconds: f64) {
        self.count += 1;
        let delta = seconds - self.mean;
        if self.count <= MEMORY {
            self.mean += delta / self.count as f64;
            self.m2 += delta * (seconds - self.mean);
            return;
        }
        // Exponentially weighted from here (West, 1979): the history follows a device
        // whose speed drifts (a straggler) instead of averaging it away.
        let alpha = 1.0 / MEMORY as f64;
        let variance = self.m2 / (MEMORY - 1) as f64;
        self.mean += alpha * delta;
        self.m2 = (1.0 - alpha) * (variance + alpha * delta * delta) * (MEMORY - 1) as f64;
    }

    /// The standard deviation of the samples (of about the last [`MEMORY`]), in
    /// seconds.
    pub fn deviation(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            (self.m2 / (self.count.min(MEMORY) - 1) as f64).sqrt()
        }
    }
}

/// One codelet on one device architecture.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ArchModel {
    /// Per footprint (bytes of data the task touches).
    pub history: BTreeMap<u64, History>,
}

/// The fitted `a·n^b + c`, in seconds, or `None` with too few footprints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Regression {
    /// Scale.
    pub a: f64,
    /// Exponent.
    pub b: f64,
    /// Constant.
    pub c: f64,
}

impl Regression {
    /// The predicted seconds for footprint `n`.
    pub fn at(&self, n: u64) -> f64 {
        (self.a * (n.max(1) as f64).powf(self.b) + self.c).max(0.0)
    }
}

impl ArchModel {
    /// Least squares of `ln(t - c) = ln a + b ln n` over the footprints' means, with `c`
    /// the smallest mean scaled by 0.9 (a fixed start-up cost below every sample).
    pub fn regression(&self) -> Option<Regression> {
        let points: Vec<(f64, f64)> = self
            .history
            .iter()
            .filter(|(_, h)| h.count > 0 && h.mean > 0.0)
            .map(|(n, h)| ((*n).max(1) as f64, h.mean))
            .collect();
        if points.len() < MIN_FOOTPRINTS {
            return None;
        }
        let c = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min) * 0.9;
        let logs: Vec<(f64, f64)> = points
            .iter()
            .map(|(n, t)| (n.ln(), (t - c).max(1e-12).ln()))
            .collect();
        let k = logs.len() as f64;
        let (sx, sy) = logs.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
        let (mx, my) = (sx / k, sy / k);
        let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let b = sxy / sxx;
        let a = (my - b * mx).exp();
        (a.is_finite() && b.is_finite()).then_some(Regression { a, b, c })
    }

    /// The predicted seconds for footprint `n`, or `None` when not calibrated.
    pub fn predict(&self, n: u64) -> Option<f64> {
        if let Some(h) = self.history.get(&n) {
            if h.count >= MIN_SAMPLES {
                return Some(h.mean);
            }
        }
        self.regression().map(|r| r.at(n))
    }

    /// Samples taken over all footprints.
    pub fn samples(&self) -> u64 {
        self.history.values().map(|h| h.count).sum()
    }
}

/// Every model of one codelet, by device (`device id/device name`: two devices of one
/// kind may run at different speeds).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CodeletModel {
    /// The codelet's name.
    pub codelet: String,
    /// Per architecture.
    pub archs: BTreeMap<String, ArchModel>,
}

/// The models of every codelet the scheduler has seen, with where they persist.
#[derive(Debug, Default)]
pub struct PerfModels {
    models: Vec<CodeletModel>,
    /// Index in `models` by codelet name.
    by_name: HashMap<String, usize>,
    /// Index in `models` by [`crate::Codelet::id`], for the lookups of every dispatch
    /// (an integer hash instead of a name's; codelets of one name share a model).
    by_id: HashMap<u64, usize>,
    dir: Option<PathBuf>,
}

/// The directory models persist in: `XPU_CACHE_DIR/perfmodels`, else under
/// `XDG_CACHE_HOME/xpu` or `~/.cache/xpu`; `None` when none is known.
pub fn default_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = var("XPU_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("xpu")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/xpu")))?;
    Some(base.join("perfmodels"))
}

/// A file name for a codelet's model: its name with anything but `[A-Za-z0-9._-]`
/// replaced, so any name maps into the directory.
fn file_name(codelet: &str) -> String {
    let safe: String = codelet
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.json")
}

impl PerfModels {
    /// Models kept in `dir` (nothing persists with `None`).
    pub fn new(dir: Option<PathBuf>) -> PerfModels {
        PerfModels {
            models: Vec::new(),
            by_name: HashMap::default(),
            by_id: HashMap::default(),
            dir,
        }
    }

    /// Where models persist.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The index of `codelet`'s model, loading it from the directory (or starting an
    /// empty one) the first time.
    fn index(&mut self, codelet: &str) -> usize {
        if let Some(&i) = self.by_name.get(codelet) {
            return i;
        }
        let loaded = self
            .dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join(file_name(codelet))).ok())
            .and_then(|text| serde_json::from_str::<CodeletModel>(&text).ok())
            .filter(|m| m.codelet == codelet)
            .unwrap_or_else(|| CodeletModel {
                codelet: codelet.to_string(),
                archs: BTreeMap::new(),
            });
        self.models.push(loaded);
        let i = self.models.len() - 1;
        self.by_name.insert(codelet.to_string(), i);
        i
    }

    fn model(&mut self, codelet: &str) -> &mut CodeletModel {
        let i = self.index(codelet);
        &mut self.models[i]
    }

    /// The model of codelet `id` named `name`.
    fn model_of(&mut self, id: u64, name: &str) -> &mut CodeletModel {
        let i = match self.by_id.get(&id) {
            Some(&i) => i,
            None => {
                let i = self.index(name);
                self.by_id.insert(id, i);
                i
            }
        };
        &mut self.models[i]
    }

    /// [`PerfModels::predict`] for a codelet, found by its id.
    pub(crate) fn predict_for(&mut self, codelet: &Codelet, arch: &str, n: u64) -> Option<f64> {
        self.model_of(codelet.id(), codelet.name())
            .archs
            .get(arch)?
            .predict(n)
    }

    /// [`PerfModels::predict_for`] and the samples of `codelet` on `arch` over all
    /// footprints, in one lookup.
    pub(crate) fn estimate_for(
        &mut self,
        codelet: &Codelet,
        arch: &str,
        n: u64,
    ) -> (Option<f64>, u64) {
        match self.model_of(codelet.id(), codelet.name()).archs.get(arch) {
            Some(a) => (a.predict(n), a.samples()),
            None => (None, 0),
        }
    }

    /// Samples of `codelet` on `arch` at footprint `n`.
    pub(crate) fn samples_at(&mut self, codelet: &Codelet, arch: &str, n: u64) -> u64 {
        self.model_of(codelet.id(), codelet.name())
            .archs
            .get(arch)
            .and_then(|a| a.history.get(&n))
            .map_or(0, |h| h.count)
    }

    /// The prediction for `codelet` on `arch` with footprint `n`.
    pub fn predict(&mut self, codelet: &str, arch: &str, n: u64) -> Option<f64> {
        self.model(codelet).archs.get(arch)?.predict(n)
    }

    /// Samples taken of `codelet` on `arch`.
    pub fn samples(&mut self, codelet: &str, arch: &str) -> u64 {
        self.model(codelet)
            .archs
            .get(arch)
            .map_or(0, ArchModel::samples)
    }

    /// Records one run.
    pub fn record(&mut self, codelet: &str, arch: &str, n: u64, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        self.model(codelet)
            .archs
            .entry(arch.to_string())
            .or_default()
            .history
            .entry(n)
            .or_default()
            .add(seconds);
    }

    /// The model of `codelet`, if seen.
    pub fn get(&mut self, codelet: &str) -> &CodeletModel {
        self.model(codelet)
    }

    /// Writes every model to the directory; returns the first error (as text).
    pub fn save(&self) -> Result<(), String> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
        for model in &self.models {
            if model.archs.is_empty() {
                continue;
            }
            let text = serde_json::to_string_pretty(model).map_err(|e| e.to_string())?;
            let path = dir.join(file_name(&model.codelet));
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, text)
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| format!("could not write {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_trusted_after_enough_samples() {
        let mut m = ArchModel::default();
        for _ in 0..2 {
            m.history.entry(100).or_default().add(1e-3);
        }
        assert_eq!(m.predict(100), None);
        m.history.entry(100).or_default().add(1e-3);
        assert_eq!(m.predict(100), Some(1e-3));
    }

    #[test]
    fn the_regression_predicts_unseen_sizes() {
        let mut m = ArchModel::default();
        // t = 2e-9 n + 1e-5.
        for n in [1u64 << 10, 1 << 14, 1 << 18, 1 << 22] {
            for _ in 0..3 {
                m.history.entry(n).or_default().add(2e-9 * n as f64 + 1e-5);
            }
        }
        let want = 2e-9 * (1u64 << 20) as f64 + 1e-5;
        let got = m.predict(1 << 20).unwrap();
        assert!((got / want - 1.0).abs() < 0.25, "{got} vs {want}");
    }

    #[test]
    fn a_model_that_mispredicts_is_relearned() {
        let mut h = History::default();
        for _ in 0..5 {
            h.add(1.0);
        }
        // One outlier is held out of the mean and dropped by the next normal sample.
        h.add(100.0);
        h.add(1.0);
        assert!((h.mean - 1.0).abs() < 1e-12 && h.misses.is_empty(), "{h:?}");
        // Enough in a row are the new normal.
        for _ in 0..RELEARN_AFTER {
            h.add(100.0);
        }
        assert_eq!(h.count, u64::from(RELEARN_AFTER), "{h:?}");
        assert!((h.mean - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_device_that_slows_down_gradually_is_followed() {
        let mut h = History::default();
        for _ in 0..200 {
            h.add(1.0);
        }
        // Twice as slow: not a miss, but the mean gets there.
        for _ in 0..3 * MEMORY {
            h.add(2.0);
        }
        assert!(h.mean > 1.9 && h.mean < 2.0, "{h:?}");
        assert!(h.deviation() < 0.5, "{h:?}");
    }

    #[test]
    fn models_survive_a_restart() {
        let dir = std::env::temp_dir().join(format!("xpu-perfmodels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut a = PerfModels::new(Some(dir.clone()));
        for _ in 0..3 {
            a.record("gemm/f32", "host/cpu", 4096, 2e-4);
        }
        a.save().unwrap();
        let mut b = PerfModels::new(Some(dir.clone()));
        assert_eq!(b.predict("gemm/f32", "host/cpu", 4096), Some(2e-4));
        assert_eq!(b.predict("gemm/f32", "vulkan/llvmpipe", 4096), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
