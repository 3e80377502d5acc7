//! Every standard operation two devices share, run on identical inputs on both, with
//! the outputs of one compared against the other's (the inputs are the `training`
//! profile's trials).

use serde::Serialize;
use xpu_hal::ops::OpKind;
use xpu_hal::reference::ops::to_f64;
use xpu_hal::{DType, Device, Error, Result};

use super::metrics::{combine, metrics, relative_tolerance, Metrics};
use crate::cases::training::{generator, trial::device_outputs, trials_of};

/// One operation on one dtype on one device, against the reference device.
#[derive(Debug, Clone, Serialize)]
pub struct OpComparison {
    /// The operation.
    pub op: &'static str,
    /// Its dtype.
    pub dtype: &'static str,
    /// The device compared.
    pub device: String,
    /// The reference device.
    pub reference: String,
    /// Trials run (shapes and layouts).
    pub trials: usize,
    /// The metrics over every output of every trial.
    pub metrics: Metrics,
}

/// The dtypes both devices list for `kind`.
fn shared_dtypes(a: &Device, b: &Device, kind: OpKind) -> Vec<DType> {
    let of = |d: &Device| -> Vec<DType> {
        d.capabilities()
            .ops
            .iter()
            .find(|s| s.kind == kind)
            .map(|s| s.dtypes.clone())
            .unwrap_or_default()
    };
    let theirs = of(b);
    of(a).into_iter().filter(|d| theirs.contains(d)).collect()
}

/// Runs each operation of `ops` (every standard operation when empty) that `reference`
/// and `device` both list, on every dtype both list, over identical inputs, and
/// compares `device`'s outputs with `reference`'s. An operation that fails on either
/// device is an error naming it.
pub fn compare_devices(
    reference: &Device,
    device: &Device,
    ops: &[OpKind],
) -> Result<Vec<OpComparison>> {
    let kinds: Vec<OpKind> = if ops.is_empty() {
        OpKind::ALL.to_vec()
    } else {
        ops.to_vec()
    };
    let rs = reference.create_stream()?;
    let ds = device.create_stream()?;
    let mut out = Vec::new();
    for kind in kinds {
        for dtype in shared_dtypes(reference, device, kind) {
            let trials = trials_of(kind)(dtype, &mut generator(kind, dtype))
                .map_err(|e| Error::invalid(format!("{kind} on {dtype}: {}", e.message())))?;
            let mut all = Vec::new();
            for (what, op) in &trials {
                let fail = |who: &Device, e: Error| {
                    Error::aborted(format!(
                        "{kind} ({dtype}, {what}) failed on {}: {e}",
                        who.id()
                    ))
                };
                let want = device_outputs(&rs, op).map_err(|e| fail(reference, e))?;
                let got = device_outputs(&ds, op).map_err(|e| fail(device, e))?;
                for ((_, layout, w), (_, _, g)) in want.iter().zip(&got) {
                    let dt = layout.dtype;
                    all.push(metrics(
                        &to_f64(g, dt),
                        &to_f64(w, dt),
                        relative_tolerance(dt),
                    ));
                }
            }
            if let Some(m) = combine(&all) {
                out.push(OpComparison {
                    op: kind.name(),
                    dtype: dtype.name(),
                    device: device.id().to_string(),
                    reference: reference.id().to_string(),
                    trials: trials.len(),
                    metrics: m,
                });
            }
        }
    }
    Ok(out)
}
