//! [`Health`]: whether a simulated device still works — the fault injection of
//! `XPU_SIMNPU_LOSE_AFTER`, which loses a device after a number of operations, so that
//! what runs above a plugin can be tested against a device that disappears mid-run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use xpu_plugin_sdk::{Error, Result};

/// A device's health, shared by the device and its streams.
pub(crate) struct Health {
    /// `plugin.simnpu:N`, for messages.
    name: String,
    /// Operations run so far.
    ops: AtomicU64,
    /// Lost once this many have run (`None`: never).
    lose_after: Option<u64>,
    lost: AtomicBool,
}

impl Health {
    pub(crate) fn new(name: String, lose_after: Option<u64>) -> Health {
        Health {
            name,
            ops: AtomicU64::new(0),
            lose_after,
            lost: AtomicBool::new(false),
        }
    }

    /// An error when the device is lost.
    pub(crate) fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(Error::device_lost(format!(
                "{} was lost (XPU_SIMNPU_LOSE_AFTER)",
                self.name
            )));
        }
        Ok(())
    }

    /// Counts one operation about to run; an error when the device is, or now
    /// becomes, lost.
    pub(crate) fn operate(&self) -> Result<()> {
        self.check()?;
        let n = self.ops.fetch_add(1, Ordering::AcqRel) + 1;
        if self.lose_after.is_some_and(|limit| n > limit) {
            self.lost.store(true, Ordering::Release);
        }
        self.check()
    }
}
