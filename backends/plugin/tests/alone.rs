//! The conformance suite on one plugin device alone — a vendor qualifying a device on a
//! machine with nothing else: the example C plugin's first device and the simulated
//! NPU's, each the only device of the run. Every case that does not genuinely need more
//! than the device (a second device, virtual memory the device lacks, a dtype it lacks,
//! a kernel format the suite can write) runs and passes: streams are held and work
//! failed on demand through the contract's own path for waits on what the device did
//! not record (user events, `stream_wait_external`), not through another backend.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;

use xpu_conformance::{all_cases, run_cases, Profile, RunOptions, Status};
use xpu_hal::backend::Backend;
use xpu_hal::{DeviceSelector, Registry};
use xpu_plugin::PluginBackend;

/// Why a case may skip on a device alone: each reason names something the device
/// itself lacks, or a second device.
const GENUINE: &[&str] = &[
    "second device",
    "virtual memory",
    "supports every dtype",
    "device does not load host-function kernels",
    "device loads neither host-function nor wgsl kernels",
];

fn alone(library: &Path, selector: &str) {
    let plugin = Arc::new(PluginBackend::load(library).unwrap());
    let mut registry = Registry::new();
    registry.register(plugin.clone()).unwrap();
    let devices = registry
        .devices(&DeviceSelector::parse(selector).unwrap())
        .unwrap();
    assert_eq!(devices.len(), 1);
    let core: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| c.profile == Profile::Core)
        .collect();
    let report = run_cases(&core, &devices, &RunOptions::new(Profile::Core), |_| {});
    let mut ran = 0;
    for r in &report.results {
        let reason = r.reason.clone().unwrap_or_default();
        match r.status {
            Status::Pass => ran += 1,
            Status::Skip => assert!(
                GENUINE.iter().any(|g| reason.contains(g)),
                "{}: skipped on {selector} alone for a reason the device does not explain: {reason}",
                r.case
            ),
            _ => panic!("{}: {:?} on {selector} alone: {reason}", r.case, r.status),
        }
    }
    // Holding and failing work on the device itself: these used to need a peer.
    for case in [
        "event.query_pending",
        "event.wait_timeout",
        "event.failed_work",
        "event.wait_on_failed",
        "event.user_event",
    ] {
        assert!(
            report
                .results
                .iter()
                .any(|r| r.case == case && r.status == Status::Pass),
            "{case} did not pass on {selector} alone"
        );
    }
    assert!(ran >= 60, "only {ran} cases passed on {selector} alone");
    // The plugin's C table, called directly.
    let abi: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| c.profile == Profile::Abi)
        .collect();
    assert!(abi.len() >= 7);
    let report = run_cases(&abi, &devices, &RunOptions::new(Profile::Abi), |_| {});
    for r in &report.results {
        assert_eq!(
            r.status,
            Status::Pass,
            "{} on {selector} alone: {:?}",
            r.case,
            r.reason
        );
    }
    drop(devices);
    drop(registry);
    assert!(
        plugin.diagnostics().is_empty(),
        "{:?}",
        plugin.diagnostics()
    );
}

#[test]
fn the_c_plugin_alone_passes_every_case_it_can_run() {
    alone(&support::minimal(), "plugin.minimal:0");
}

#[test]
fn the_simulated_npu_alone_passes_every_case_it_can_run() {
    alone(&support::sim_npu(), "plugin.simnpu:0");
}
