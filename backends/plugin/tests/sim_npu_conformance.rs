//! The conformance suite on the devices of the simulated NPU (`xpu-sim-npu`, built as a
//! dev-dependency of this package and loaded from its shared library), as `cargo test`
//! trials named `[plugin.simnpu/plugin.simnpu:N] case`, with one host device in the
//! run as a peer. The simulated NPU lists every standard operation on every dtype, so
//! the `training` profile runs in full through the ABI 1.1 entry points.
//!
//! Any diagnostic the plugin backend recorded (a failed free, destroy or close, a bad
//! operation list) fails the run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(unix)]
mod support;

/// The sim-npu plugin library next to this test binary (Cargo builds it into `deps/`).
#[cfg(unix)]
fn sim_npu() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = support::library_file("xpu_sim_npu");
    [deps.join(&name), deps.join("..").join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .expect("the xpu-sim-npu plugin is built (it is a dev-dependency)")
}

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
    let plugin = Arc::new(PluginBackend::load(sim_npu())?);
    assert_eq!(plugin.abi_version(), (1, 4));
    let mut registry = Registry::new();
    registry.register(plugin.clone())?;
    registry.register(Arc::new(HostBackend::new(HostConfig {
        devices: 1,
        capacity: 256 << 20,
    })))?;
    let devices = registry.devices(&DeviceSelector::parse("plugin.simnpu:*;host:0")?)?;
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
    println!("the plugin's library is looked up as a Unix shared library; no trial runs here");
}
