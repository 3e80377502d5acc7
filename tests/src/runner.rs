//! Running cases on devices: [`run`], [`run_cases`] and [`run_one`].
//!
//! Each case runs on its own thread, inside `catch_unwind`, with a time limit: a
//! backend that panics is a failure of that case, not an abort of the run, and a
//! backend that hangs is a failure after [`RunOptions::case_timeout`] (its thread is
//! left behind; the run goes on with the next case).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xpu_hal::Device;

use crate::case::{instance_name, Case, CaseContext, CaseError, CaseOutcome, Profile};
use crate::cases::cases;
use crate::expectations::{DeviceFacts, Expectation, Expectations};
use crate::report::{CaseResult, Report, Status};

/// How long one case may run before it counts as hung, unless
/// [`RunOptions::case_timeout`] says otherwise.
pub const DEFAULT_CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// What to run and how to judge it.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The profile whose cases run.
    pub profile: Profile,
    /// Expected failures (see [`Expectations`]).
    pub expectations: Expectations,
    /// Runs only the case instances whose display name (`[host/host:0] copy.overlap`)
    /// contains this text.
    pub filter: Option<String>,
    /// How long one case may run before it is a failure.
    pub case_timeout: Duration,
}

impl RunOptions {
    /// The cases of `profile`, with the built-in expectations, no filter and the
    /// default time limit.
    pub fn new(profile: Profile) -> Self {
        RunOptions {
            profile,
            expectations: Expectations::builtin(),
            filter: None,
            case_timeout: DEFAULT_CASE_TIMEOUT,
        }
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions::new(Profile::Core)
    }
}

/// The status and reason of a case's outcome under an optional expectation.
///
/// | outcome | no expectation | expectation | flaky expectation |
/// |---------|----------------|-------------|-------------------|
/// | pass    | pass           | xpass       | pass              |
/// | fail    | fail           | xfail       | xfail             |
/// | skip    | skip           | skip        | skip              |
///
/// A failure whose message the expectation's `message` pattern does not match is a
/// failure: the entry expects another one.
pub fn classify(
    outcome: &CaseOutcome,
    expectation: Option<&Expectation>,
) -> (Status, Option<String>) {
    match (outcome, expectation) {
        (Ok(()), None) => (Status::Pass, None),
        (Ok(()), Some(e)) if e.flaky => (Status::Pass, None),
        (Ok(()), Some(e)) => (
            Status::Xpass,
            Some(format!(
                "expected to fail ({}), but passed; remove the expectation ({})",
                e.reason,
                e.describe()
            )),
        ),
        (Err(CaseError::Skip(reason)), _) => (Status::Skip, Some(reason.clone())),
        (Err(CaseError::Fail(message)), None) => (Status::Fail, Some(message.clone())),
        (Err(CaseError::Fail(message)), Some(e)) if e.expects_message(message) => (
            Status::Xfail,
            Some(format!("{} (failed with: {message})", e.reason)),
        ),
        (Err(CaseError::Fail(message)), Some(e)) => (
            Status::Fail,
            Some(format!(
                "{message} (an expectation covers this case ({}), but for a failure matching `{}`, not this one)",
                e.describe(),
                e.message.as_deref().unwrap_or("*")
            )),
        ),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Runs `case` in `ctx` on a thread of its own, catching panics and giving up after
/// `timeout`. Returns the outcome and the wall time.
///
/// A case that finishes in time has also finished with its devices when this returns:
/// its thread drops its share of the context before it reports, and is joined. The
/// share it drops may be the last reference to a device, and tearing a device down (a
/// Vulkan instance unloading its layers, say) on a thread that outlives the run races
/// the process's exit handlers and can crash the process after the report is written.
pub fn run_guarded(case: &Case, ctx: &CaseContext, timeout: Duration) -> (CaseOutcome, Duration) {
    let start = Instant::now();
    let (tx, rx) = mpsc::channel();
    let run = case.run;
    let thread_ctx = ctx.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("xpu-conformance {}", case.name))
        .spawn(move || {
            let outcome =
                catch_unwind(AssertUnwindSafe(|| run(&thread_ctx))).unwrap_or_else(|payload| {
                    Err(CaseError::fail(format!(
                        "panicked: {}; a backend must turn panics into errors",
                        panic_message(&*payload)
                    )))
                });
            // Devices are released here, before the runner hears of the outcome.
            drop(thread_ctx);
            // The receiver is gone only when the runner gave up on this case.
            let _ = tx.send(outcome);
        });
    let outcome = match spawned {
        Err(e) => Err(CaseError::fail(format!(
            "could not start a thread for the case: {e}"
        ))),
        Ok(handle) => match rx.recv_timeout(timeout) {
            Ok(outcome) => {
                // It has sent its last word; what is left is the thread's own exit.
                let _ = handle.join();
                outcome
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Err(CaseError::fail(format!(
                "did not finish within {:.1} s; the device or its backend appears to hang (the case's thread was left running)",
                timeout.as_secs_f64()
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(CaseError::fail(
                "the case's thread ended without a result",
            )),
        },
    };
    (outcome, start.elapsed())
}

/// Runs one case on `ctx.device` and judges it under `expectations`.
pub fn run_one(
    case: &Case,
    ctx: &CaseContext,
    expectations: &Expectations,
    timeout: Duration,
) -> CaseResult {
    let (outcome, elapsed) = run_guarded(case, ctx, timeout);
    let backend = ctx.device.backend().to_string();
    let info = ctx.device.info();
    let facts = DeviceFacts {
        backend: &backend,
        name: &info.name,
        vendor: &info.vendor,
        driver: &info.driver,
    };
    let (status, reason) = classify(&outcome, expectations.lookup_for(&facts, case.name));
    CaseResult {
        case: case.name.to_string(),
        device: ctx.device.id().to_string(),
        backend,
        status,
        reason,
        duration_s: elapsed.as_secs_f64(),
    }
}

/// The context for `devices[index]`: that device under test, every other one a peer.
pub fn context_for(devices: &[Device], index: usize) -> Option<CaseContext> {
    let device = devices.get(index)?.clone();
    let peers = devices
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != index)
        .map(|(_, d)| d.clone())
        .collect();
    Some(CaseContext::new(device, peers))
}

/// Whether the instance of `case` on `device` passes `filter` (a substring of its
/// display name; `None` passes everything).
pub fn matches_filter(filter: Option<&str>, case: &Case, device: &Device) -> bool {
    match filter {
        None => true,
        Some(f) => instance_name(device.backend(), &device.id().to_string(), case.name).contains(f),
    }
}

/// Runs every case of `options.profile` on every device and returns the report.
///
/// Devices run one after another, and the cases of one device one after another; the
/// other devices of the run are each case's peers. `on_result` sees every result as it
/// is made (to print progress).
pub fn run(devices: &[Device], options: &RunOptions, on_result: impl FnMut(&CaseResult)) -> Report {
    let mut report = run_cases(&cases(options.profile), devices, options, on_result);
    report.profile = options.profile.name().to_string();
    report
}

/// Like [`run`], with the cases given (built-in, a vendor's own, or both); the
/// profile in `options` is not consulted.
pub fn run_cases(
    cases: &[Case],
    devices: &[Device],
    options: &RunOptions,
    mut on_result: impl FnMut(&CaseResult),
) -> Report {
    let mut report = Report::default();
    for index in 0..devices.len() {
        let Some(ctx) = context_for(devices, index) else {
            continue;
        };
        for case in cases {
            if !matches_filter(options.filter.as_deref(), case, &ctx.device) {
                continue;
            }
            let result = run_one(case, &ctx, &options.expectations, options.case_timeout);
            on_result(&result);
            report.push(result);
        }
    }
    report
}
