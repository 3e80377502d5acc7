//! Surviving a device failure: find the devices that no longer work, re-form the
//! data-parallel group from the survivors and continue from the last checkpoint.
//!
//! A failed step leaves the failed trainer's state undefined (a step is not a
//! transaction: some replicas may have updated their parameters, others not), so
//! recovery never repairs it. It drops the whole trainer — scheduler, communicator
//! and replicas — and builds a new one on the devices that still answer, restored from
//! the last checkpoint (or from the initial parameters when there is none yet). The
//! steps since that checkpoint are trained again; with the micro-batch scheme of
//! [`crate::trainer`] they give the same gradients on the survivors as they did
//! before, so the run's trajectory continues as if nothing had happened (bit for bit
//! on devices that compute alike).

use std::time::Instant;

use xpu_hal::{Device, Error, Result};

use crate::checkpoint::Checkpoint;
use crate::trainer::Trainer;

/// What a recovery did.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    /// The step that failed (the one after the last completed).
    pub failed_step: u64,
    /// The devices found failed, each with what its probe returned.
    pub lost: Vec<(String, String)>,
    /// The devices training goes on with.
    pub survivors: Vec<String>,
    /// The step of the checkpoint training continues from (0: from the start).
    pub resumed_at: u64,
    /// Seconds from the failure to the new group being ready.
    pub seconds: f64,
}

/// Whether `e` may mean a device failed (as opposed to a mistake in the request).
pub fn may_be_device_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::DeviceLost { .. } | Error::Unavailable { .. } | Error::Timeout { .. }
    )
}

/// Asks `device` to do the least a working device does (report its memory, allocate,
/// run and finish an empty stream); the error of a device that cannot.
pub fn probe(device: &Device) -> Result<()> {
    device.memory_info()?;
    let a = device.allocate(4)?;
    let s = device.create_stream()?;
    s.fill(&a, xpu_hal::Scalar::U8(0))?;
    s.synchronize()
}

/// Recovers from `error`, which `failed` returned from a step: when some of its
/// devices fail their [`probe`], a new trainer on the others restored from `last` (the
/// latest checkpoint, `None` before the first). Returns `error` itself when it is not
/// a device failure or every device still works, and an error naming the last
/// checkpoint when no device survives.
pub fn recover(
    failed: Trainer,
    error: Error,
    last: Option<&Checkpoint>,
) -> Result<(Trainer, Recovery)> {
    let start = Instant::now();
    if !may_be_device_failure(&error) {
        return Err(error);
    }
    let failed_step = failed.steps_done() + 1;
    let config = failed.config().clone();
    let devices = failed.devices();
    // The old group goes first: its streams and buffers on the survivors are released
    // before the new one allocates.
    drop(failed);
    let mut lost = Vec::new();
    let mut survivors = Vec::new();
    for d in devices {
        match probe(&d) {
            Ok(()) => survivors.push(d),
            Err(e) => lost.push((d.id().to_string(), e.to_string())),
        }
    }
    if lost.is_empty() {
        return Err(error);
    }
    if survivors.is_empty() {
        return Err(Error::DeviceLost {
            device: lost
                .iter()
                .map(|(d, _)| d.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            message: format!(
                "step {failed_step} failed ({error}) and no device is left to train on; {}",
                match last {
                    Some(c) => format!(
                        "the last checkpoint is at step {}: resume from it on working devices",
                        c.step
                    ),
                    None => "no checkpoint was made: start again on working devices".to_string(),
                }
            ),
        });
    }
    let mut trainer = Trainer::new(&survivors, config)?;
    if let Some(c) = last {
        trainer.restore(c)?;
    }
    let recovery = Recovery {
        failed_step,
        lost,
        survivors: survivors.iter().map(|d| d.id().to_string()).collect(),
        resumed_at: trainer.steps_done(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((trainer, recovery))
}
