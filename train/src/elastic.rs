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
//!
//! Across processes ([`recover_across`]) the unit that fails is a process: the
//! survivors shrink the communicator to themselves (`Communicator::shrink`, which makes
//! them agree on who failed) and go on the same way, from the checkpoint every process
//! keeps in memory.

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

/// Whether `e`, from a step of a group across processes, may mean that another process
/// failed (it did not take part in time, or another survivor gave up on it).
pub fn may_be_process_failure(e: &Error) -> bool {
    matches!(e, Error::Timeout { .. } | Error::Aborted { .. })
}

/// Recovers a group across processes from `error`, which `failed` returned from a
/// step: when it may mean that a process failed, the surviving processes shrink the
/// communicator to themselves and build a new trainer over their ranks, restored from
/// `last` (the latest checkpoint, kept by every process; `None` before the first).
/// Every surviving process calls it. Returns `error` itself when it is no failure of
/// another process, and the shrink's error when the survivors cannot agree.
pub fn recover_across(
    failed: Trainer,
    error: Error,
    last: Option<&Checkpoint>,
) -> Result<(Trainer, Recovery)> {
    let start = Instant::now();
    let Some(comm) = failed
        .communicator()
        .filter(|c| !c.processes().is_empty() && may_be_process_failure(&error))
        .cloned()
    else {
        // A failure of this process's own: the others hear of it at once, and go on
        // without it.
        failed.abort();
        return Err(error);
    };
    let failed_step = failed.steps_done() + 1;
    let config = failed.config().clone();
    let before = comm.processes().to_vec();
    drop(failed);
    let shrunk = comm.shrink().map_err(|e| {
        let last = match last {
            Some(c) => format!("the last checkpoint is at step {}: resume from it", c.step),
            None => "no checkpoint was made: start again".to_string(),
        };
        Error::aborted(format!(
            "step {failed_step} failed ({error}) and the processes that remain could not go on without the failed one ({e}); {last}"
        ))
    })?;
    let after = shrunk.processes().to_vec();
    let lost = before
        .iter()
        .filter(|p| !after.iter().any(|q| q.host == p.host && q.pid == p.pid))
        .map(|p| (p.describe(), "it did not take part in time".to_string()))
        .collect();
    let mut trainer = Trainer::across(shrunk, config)?;
    if let Some(c) = last {
        trainer.restore(c)?;
    }
    let recovery = Recovery {
        failed_step,
        lost,
        survivors: trainer.rank_names(),
        resumed_at: trainer.steps_done(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((trainer, recovery))
}
