//! [`Health`]: whether a simulated device still works, and how fast. Two kinds of
//! fault injection lose a device, so that what runs above a plugin can be tested
//! against a device that disappears mid-run:
//!
//! - `XPU_SIMNPU_LOSE_AFTER` loses it after a number of operations. From then on its
//!   operations fail (the stream's error, `DeviceLost`), and so do allocations and new
//!   streams; other calls are accepted, and a stream whose error was reported
//!   synchronizes again.
//! - `device_inject_fault` (ABI 1.2, [`Health::lose`]) loses it when the host asks, as
//!   the header's rules for `XPU_FAULT_LOST` say: every later call on the device, its
//!   streams and its events fails with `DeviceLost` ([`Health::check_call`]), work
//!   queued and not yet run fails, and nothing makes it work again.
//!
//! A third makes it a straggler: `device_inject_fault` with `XPU_FAULT_SLOW`
//! ([`Health::slow`]) adds a delay to every operation its streams run from then on,
//! slept by the stream's worker in [`Health::operate`] before the work, so the
//! enqueueing thread never waits and results do not change.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use xpu_plugin_sdk::{Error, Result};

/// [`Health::state`]: the device works.
const WORKING: u8 = 0;
/// [`Health::state`]: lost after `XPU_SIMNPU_LOSE_AFTER` operations.
const LOST_AFTER_OPS: u8 = 1;
/// [`Health::state`]: lost through `device_inject_fault`.
const LOST_INJECTED: u8 = 2;

/// A device's health, shared by the device and its streams and events. Once lost, a
/// device stays lost.
pub(crate) struct Health {
    /// `plugin.simnpu:N`, for messages.
    name: String,
    /// Operations run so far.
    ops: AtomicU64,
    /// Lost once this many have run (`None`: never).
    lose_after: Option<u64>,
    /// [`WORKING`], or how the device was lost.
    state: AtomicU8,
    /// Nanoseconds added to every operation (`XPU_FAULT_SLOW`; 0: none).
    delay_ns: AtomicU64,
}

impl Health {
    pub(crate) fn new(name: String, lose_after: Option<u64>) -> Health {
        Health {
            name,
            ops: AtomicU64::new(0),
            lose_after,
            state: AtomicU8::new(WORKING),
            delay_ns: AtomicU64::new(0),
        }
    }

    /// Makes the device a straggler: every operation that starts from now on takes
    /// `delay` longer ([`operate`](Health::operate)), replacing an earlier delay; zero
    /// ends the slowdown. A lost device stays lost.
    pub(crate) fn slow(&self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.delay_ns.store(ns, Ordering::Release);
    }

    /// The delay [`slow`](Health::slow) set, zero when the device is not slow.
    pub(crate) fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns.load(Ordering::Acquire))
    }

    /// Loses the device now and for good: the fault `device_inject_fault` injects. It
    /// also turns a loss by `XPU_SIMNPU_LOSE_AFTER` into an injected one, whose rules
    /// are stricter: the host that asked relies on them.
    pub(crate) fn lose(&self) {
        self.state.store(LOST_INJECTED, Ordering::Release);
    }

    /// An error when the device is lost, saying how it was lost.
    pub(crate) fn check(&self) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            WORKING => Ok(()),
            LOST_INJECTED => Err(Error::device_lost(format!(
                "{} was lost: a fault was injected (device_inject_fault); it does not come back, use the other devices",
                self.name
            ))),
            _ => Err(Error::device_lost(format!(
                "{} was lost (XPU_SIMNPU_LOSE_AFTER)",
                self.name
            ))),
        }
    }

    /// An error when every call on the device must fail: after an injected loss (the
    /// header's rules for `XPU_FAULT_LOST`). A device lost by `XPU_SIMNPU_LOSE_AFTER`
    /// passes: it fails its operations, allocations and stream creations only ([`check`]
    /// and [`operate`]), so that its failures surface the way they always have, through
    /// the work that runs on it.
    ///
    /// [`check`]: Health::check
    /// [`operate`]: Health::operate
    pub(crate) fn check_call(&self) -> Result<()> {
        if self.state.load(Ordering::Acquire) == LOST_INJECTED {
            self.check()
        } else {
            Ok(())
        }
    }

    /// Counts one operation about to run; an error when the device is, or now
    /// becomes, lost. Called by a stream's worker only: on a straggler it first sleeps
    /// the delay [`slow`](Health::slow) set, so the operation starts that much later (a
    /// loss injected meanwhile still fails it).
    pub(crate) fn operate(&self) -> Result<()> {
        self.check()?;
        let delay = self.delay();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let n = self.ops.fetch_add(1, Ordering::AcqRel) + 1;
        if self.lose_after.is_some_and(|limit| n > limit) {
            // Unless it was lost already (an injected loss stays one).
            let _ = self.state.compare_exchange(
                WORKING,
                LOST_AFTER_OPS,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        self.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpu_plugin_sdk::ErrorCode;

    #[test]
    fn a_lost_device_says_how_it_was_lost_and_stays_lost() {
        let counted = Health::new("plugin.simnpu:0".into(), Some(1));
        assert!(counted.operate().is_ok());
        let e = counted.operate().unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeviceLost);
        assert!(e.message().contains("XPU_SIMNPU_LOSE_AFTER"), "{e}");
        // Calls other than operations pass, until a loss is injected too.
        assert!(counted.check_call().is_ok());
        counted.lose();
        let e = counted.check_call().unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeviceLost);
        assert!(e.message().contains("injected"), "{e}");
        // An injected loss stays one.
        assert!(counted
            .operate()
            .unwrap_err()
            .message()
            .contains("injected"));

        let injected = Health::new("plugin.simnpu:1".into(), None);
        assert!(injected.check().is_ok());
        injected.lose();
        assert_eq!(
            injected.check_call().unwrap_err().code(),
            ErrorCode::DeviceLost
        );
        let e = injected.operate().unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeviceLost);
        assert!(e.message().contains("plugin.simnpu:1"), "{e}");
        assert!(e.message().contains("injected"), "{e}");
        assert!(!e.message().contains("XPU_SIMNPU_LOSE_AFTER"), "{e}");
        assert!(injected.check().is_err());
    }

    #[test]
    fn a_straggler_sleeps_in_operate_until_the_delay_ends_and_a_lost_device_stays_lost() {
        let health = Health::new("plugin.simnpu:0".into(), None);
        assert!(health.delay().is_zero());
        health.slow(Duration::from_millis(5));
        assert_eq!(health.delay(), Duration::from_millis(5));
        // Only the worker's `operate` waits; the other checks do not.
        let start = std::time::Instant::now();
        health.check_call().unwrap();
        health.check().unwrap();
        health.operate().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(5));
        health.slow(Duration::ZERO);
        assert!(health.delay().is_zero());
        health.operate().unwrap();
        // A delay too long for u64 nanoseconds saturates.
        health.slow(Duration::MAX);
        assert_eq!(health.delay(), Duration::from_nanos(u64::MAX));

        health.lose();
        health.slow(Duration::from_millis(1));
        let e = health.operate().unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeviceLost);
        assert!(e.message().contains("injected"), "{e}");
        health.slow(Duration::ZERO);
        assert_eq!(
            health.check_call().unwrap_err().code(),
            ErrorCode::DeviceLost
        );
    }
}
