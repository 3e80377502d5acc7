//! The conformance suite on the devices of the example C plugin (built here from
//! `examples/c-minimal/minimal.c`), as `cargo test` trials named
//! `[plugin.minimal/plugin.minimal:N] case`, with one host device in the run as a peer:
//! it holds the plugin's streams at known points (through waits on its events) and
//! exercises waits between the two backends in both directions.
//!
//! Any diagnostic the plugin backend recorded (a failed free, destroy or close) fails
//! the run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(unix)]
mod support;

#[cfg(unix)]
fn main() -> xpu_hal::Result<()> {
    use std::sync::Arc;

    use libtest_mimic::Arguments;
    use xpu_conformance::{all_cases, harness, Expectations, Profile, DEFAULT_CASE_TIMEOUT};
    use xpu_hal::backend::Backend;
    use xpu_hal::{DeviceSelector, Registry};
    use xpu_host::{HostBackend, HostConfig};
    use xpu_plugin::PluginBackend;

    let args = Arguments::from_args();
    let plugin = Arc::new(PluginBackend::load(support::minimal())?);
    let mut registry = Registry::new();
    registry.register(plugin.clone())?;
    registry.register(Arc::new(HostBackend::new(HostConfig {
        devices: 1,
        capacity: 256 << 20,
    })))?;
    let devices = registry.devices(&DeviceSelector::parse("plugin.minimal:*;host:0")?)?;
    // The abi profile runs in `alone.rs`, one case at a time: its out-of-memory check
    // takes all of a device's memory, which parallel trials on that device would feel.
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| c.profile != Profile::Abi)
        .collect();
    let trials = harness::trials(
        &cases,
        &devices,
        &Expectations::builtin(),
        DEFAULT_CASE_TIMEOUT,
    );
    let conclusion = libtest_mimic::run(&args, trials);
    drop(devices);
    drop(registry);
    let diagnostics = plugin.diagnostics();
    if !diagnostics.is_empty() {
        eprintln!("the plugin backend recorded problems:");
        for m in &diagnostics {
            eprintln!("  {m}");
        }
        std::process::exit(101);
    }
    conclusion.exit()
}

#[cfg(not(unix))]
fn main() {
    println!("the C plugin is built with POSIX threads; this platform runs no trial");
}
