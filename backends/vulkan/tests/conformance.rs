//! The conformance suite on every Vulkan device, as `cargo test` trials named
//! `[vulkan/vulkan:N] case`, with one host device in the run as a peer so that waits
//! between the two backends are exercised in both directions.
//!
//! Without a Vulkan device the run has one ignored trial saying why — unless
//! `XPU_REQUIRE` names `vulkan`, as CI does, in which case that trial fails. With
//! `XPU_VULKAN_VALIDATION=1`, any message of the validation layer fails the run.

use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use xpu_conformance::{all_cases, harness, required_from_env, Expectations, DEFAULT_CASE_TIMEOUT};
use xpu_hal::backend::Backend;
use xpu_hal::{Availability, DeviceSelector, Registry};
use xpu_host::{HostBackend, HostConfig};
use xpu_vulkan::VulkanBackend;

fn required() -> bool {
    required_from_env()
        .iter()
        .any(|p| match p.strip_suffix('*') {
            Some(prefix) => xpu_vulkan::NAME.starts_with(prefix),
            None => p == xpu_vulkan::NAME,
        })
}

fn main() -> xpu_hal::Result<()> {
    let args = Arguments::from_args();
    let vulkan = Arc::new(VulkanBackend::new());
    let mut registry = Registry::new();
    registry.register(vulkan.clone())?;
    registry.register(Arc::new(HostBackend::new(HostConfig {
        devices: 1,
        capacity: 256 << 20,
    })))?;
    let unavailable = registry
        .backends()
        .into_iter()
        .find(|b| b.name == xpu_vulkan::NAME)
        .and_then(|b| match b.availability {
            Availability::Unavailable(r) => Some(r),
            Availability::Available(_) => None,
        });
    if let Some(reason) = unavailable {
        let trial = if required() {
            Trial::test("vulkan backend", move || {
                Err(Failed::from(format!(
                    "the Vulkan backend is required (XPU_REQUIRE) but unavailable: {reason}"
                )))
            })
        } else {
            Trial::test(format!("vulkan backend (unavailable: {reason})"), || Ok(()))
                .with_ignored_flag(true)
        };
        libtest_mimic::run(&args, vec![trial]).exit();
    }
    let devices = registry.devices(&DeviceSelector::parse("vulkan:*;host:0")?)?;
    let trials = harness::trials(
        &all_cases(),
        &devices,
        &Expectations::builtin(),
        DEFAULT_CASE_TIMEOUT,
    );
    let conclusion = libtest_mimic::run(&args, trials);
    let diagnostics = vulkan.diagnostics();
    if !diagnostics.is_empty() {
        eprintln!("the Vulkan validation layer reported problems:");
        for m in &diagnostics {
            eprintln!("  {m}");
        }
        std::process::exit(101);
    }
    conclusion.exit()
}
