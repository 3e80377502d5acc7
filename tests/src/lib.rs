//! # xpu-conformance: does this device keep the contract?
//!
//! Everything above the HAL — memory pools, collectives, the scheduler, a training
//! framework — is written once against [`xpu_hal`] and trusts every device to behave
//! the same way. This crate is what earns that trust. It is a product in itself: a
//! hardware qualifier runs it against a device (`xpu conformance`), a vendor runs it
//! against a plugin before shipping, and each backend crate runs it in its own tests.
//!
//! ## Cases are written once and run per device
//!
//! A [`Case`] is a named check of one part of the contract (`copy.h2d_offsets`,
//! `event.cross_device` …). It is written against the HAL's handles only, never against
//! a backend, and receives a [`CaseContext`]: the device under test and the other
//! devices of the run as peers, of any backend. The runner ([`run`]) instantiates every
//! case of a [`Profile`] for every device, so adding a backend adds a column to the
//! matrix without touching a case. Cases compare results with references computed on
//! the host independently of any backend ([`reference`](crate#references)), with
//! pseudo-random data at odd offsets and sizes, and check that neighbouring bytes stay
//! untouched. A failure says what was expected and what was found, and with which
//! inputs.
//!
//! ## Skips are honest, expected failures are explicit
//!
//! There are three ways for a case not to pass, and they are kept apart:
//!
//! - **fail**: the device broke the contract. The run fails.
//! - **skip**: the device lacks what the case needs — a dtype, host-function kernels,
//!   a second device. The case returns [`CaseError::Skip`] with a reason naming the
//!   missing capability, and the report carries it. A case never returns early with a
//!   pass it did not earn.
//! - **xfail**: the case fails and an [`Expectation`] for the device's backend says it
//!   does, with a reason. The run still succeeds. If the case passes, the status is
//!   **xpass** and the run *fails*, so that fixed bugs cannot hide behind stale
//!   expectations. A skip stays a skip whatever the expectations say.
//!
//! Expectations come from the suite's built-in list per backend
//! ([`Expectations::builtin`]; the host backend, being the reference, has none) and
//! from JSON files a qualifier passes ([`Expectations::from_json_file`]).
//!
//! ## A misbehaving backend cannot take the run down
//!
//! Each case runs on its own thread inside `catch_unwind` and with a time limit
//! ([`RunOptions::case_timeout`]). A panic is a failure of that case, not an abort of
//! the run; a hang is a failure after the limit, and the run goes on. Cases themselves
//! never panic: they return errors, and any HAL error they did not expect is a failure
//! naming its kind. Cases that hold a stream at a known point (a host-function kernel
//! waiting on a latch) release it on every path, and give up on their own after a few
//! seconds if a backend ran the kernel synchronously instead of enqueuing it.
//!
//! ## What is checked without timing
//!
//! Asynchronous behaviour is checked deterministically where the device allows:
//! "this event is not complete yet" is asserted while a host-function kernel is
//! blocked on a latch that the case opens afterwards, never by sleeping and hoping.
//! A device without host functions (most GPUs) is held the same way through a peer of
//! the run that has them: its stream waits on an event of the peer recorded behind
//! such a kernel. Work that fails on demand is made alike (a failing host-function
//! kernel, or a wait on an event recorded after one). With no such device in the run,
//! the ordering cases keep the stream busy with a burst of copies instead and check
//! only the results, and the cases that cannot be made deterministic skip with that
//! reason.
//!
//! Kernel cases write their kernels as host functions and in WGSL, and run whichever
//! the device loads (host functions first); only the cases about what a host function
//! alone can do (see its launch dimensions, report an error, panic) skip elsewhere.
//!
//! ## Reports
//!
//! A run yields a [`Report`]: one [`CaseResult`] per case and device, and a
//! [`Summary`]. [`Report::to_json`] writes it for machines, [`Report::to_junit`] for CI
//! dashboards (one test suite per device), and [`Report::closing_line`] ends a console
//! run with `N passed, N failed, N skipped`. A case instance is named
//! `[backend/device] case`, as in `[host/host:0] copy.h2d_offsets`, everywhere.
//!
//! ## Running it
//!
//! ```no_run
//! # fn devices() -> Vec<xpu_hal::Device> { Vec::new() }
//! use xpu_conformance::{run, Expectations, Profile, RunOptions};
//!
//! let mut options = RunOptions::new(Profile::Core);
//! options.expectations.merge(Expectations::from_json_file("expectations.json")?);
//! let report = run(&devices(), &options, |r| println!("{} {}", r.status, r.display_name()));
//! println!("{}", report.closing_line());
//! std::process::exit(if report.success() { 0 } else { 1 });
//! # Ok::<(), xpu_hal::Error>(())
//! ```
//!
//! A backend's own test target gets the whole suite as `cargo test` trials through
//! [`harness::run_trials`]; vendors add their own cases by building [`Case`] values and
//! passing them to [`run_cases`] or [`harness::trials`].
//!
//! ## References
//!
//! The arithmetic rules of [`xpu_hal::dtype`] are re-implemented here from their
//! statement, not borrowed from a backend: integers wrap; `f16`/`bf16` results are
//! computed in `f32` and rounded once to nearest-even; `min`/`max` ignore a NaN when the
//! other operand is a number; casts truncate and saturate (NaN → 0), wrap between
//! integers, and round to nearest-even into floats. Pattern cases allow `f16`/`bf16`
//! results one unit in the last place (a device computing natively in half precision
//! rounds from the exact result rather than from `f32`); the cases about rounding
//! ties (`ops.half_rounding`, `cast.int_to_float`) demand exact results.

mod case;
mod cases;
mod certificate;
mod expectations;
pub mod harness;
pub mod precision;
mod reference;
mod report;
mod required;
mod runner;

pub use case::{Case, CaseContext, CaseError, CaseOutcome, Profile};
pub use cases::{all_cases, cases, find_case};
pub use certificate::{
    file_sha256, suite_hash, Certificate, CertifiedResult, DeviceIdentity, RunContext,
    CERTIFICATE_FORMAT,
};
pub use expectations::{DeviceFacts, Expectation, Expectations};
pub use report::{BackendVerdict, CaseResult, Report, ReportError, Status, Summary};
pub use required::{
    check_required, diagnostics_results, parse_required, required_from_env, DIAGNOSTICS_CASE,
    REQUIRED_CASE, REQUIRE_ENV,
};
pub use runner::{
    classify, context_for, matches_filter, run, run_cases, run_guarded, run_one, RunOptions,
    DEFAULT_CASE_TIMEOUT,
};
