//! Case instances as `cargo test` trials, for a backend's own test target.
//!
//! A backend crate (or a vendor's plugin crate) gets the whole suite as a test with a
//! `[[test]] harness = false` target whose `main` builds its devices and calls
//! [`run_trials`]. Each case instance is a trial named `[backend/device] case`, so
//! `cargo test -- copy.` filters as usual; a skip shows as `ignored` with its reason, an
//! expected failure as `ignored` with the expectation's reason.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use xpu_hal::Device;

use crate::case::Case;
use crate::expectations::Expectations;
use crate::report::Status;
use crate::runner::{context_for, run_one};

/// One trial per case and device. The other devices are each case's peers.
pub fn trials(
    cases: &[Case],
    devices: &[Device],
    expectations: &Expectations,
    timeout: Duration,
) -> Vec<Trial> {
    let mut out = Vec::with_capacity(cases.len() * devices.len());
    // Trials run in parallel; a case that needs the devices to itself (it measures
    // free memory to the byte, or takes all of it) runs alone: it takes this lock
    // exclusively, every other trial shares it.
    let alone = Arc::new(RwLock::new(()));
    for index in 0..devices.len() {
        let Some(ctx) = context_for(devices, index) else {
            continue;
        };
        for case in cases {
            let case = *case;
            let ctx = ctx.clone();
            let expectations = expectations.clone();
            let alone = alone.clone();
            out.push(Trial::ignorable_test(
                case.display_name(&ctx.device),
                move || {
                    let result = if case.exclusive {
                        let _all = alone.write().unwrap_or_else(PoisonError::into_inner);
                        run_one(&case, &ctx, &expectations, timeout)
                    } else {
                        let _shared = alone.read().unwrap_or_else(PoisonError::into_inner);
                        run_one(&case, &ctx, &expectations, timeout)
                    };
                    let reason = result.reason.unwrap_or_default();
                    match result.status {
                        Status::Pass => Ok(Completion::Completed),
                        Status::Skip => Ok(Completion::ignored_with(format!("skip: {reason}"))),
                        Status::Xfail => Ok(Completion::ignored_with(format!("xfail: {reason}"))),
                        Status::Fail => Err(Failed::from(reason)),
                        Status::Xpass => Err(Failed::from(format!("xpass: {reason}"))),
                    }
                },
            ));
        }
    }
    out
}

/// Parses the test harness's command line, runs every case on every device as trials,
/// and exits the process with the harness's status.
pub fn run_trials(
    cases: &[Case],
    devices: &[Device],
    expectations: &Expectations,
    timeout: Duration,
) -> ! {
    let args = Arguments::from_args();
    libtest_mimic::run(&args, trials(cases, devices, expectations, timeout)).exit()
}
