//! Native collectives (plugin ABI 1.3) through the loader: a plugin that offers them
//! (the simulated NPU) gives its devices a collective group with its library's name and
//! figures; plugins that do not — built against an older ABI, leaving the functions
//! NULL, setting only some of them, or setting them under an older `abi_minor` — give
//! none, and their functions are never called.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use xpu_hal::group::{collective_group, GroupConfig};
use xpu_hal::{Device, DeviceSelector, Registry};
use xpu_plugin::PluginBackend;

mod support;

const CONFIG: GroupConfig = GroupConfig {
    timeout: Duration::from_secs(30),
};

fn devices(path: &Path, selector: &str) -> Vec<Device> {
    let mut registry = Registry::new();
    registry
        .register(Arc::new(PluginBackend::load(path).unwrap()))
        .unwrap();
    registry
        .devices(&DeviceSelector::parse(selector).unwrap())
        .unwrap()
}

#[test]
fn the_simulated_npu_offers_its_library_with_figures() {
    let devices = devices(&support::sim_npu(), "plugin.simnpu:0,1");
    let group = collective_group(&devices, CONFIG)
        .expect("the plugin offers a group")
        .unwrap();
    assert_eq!(group.size(), 2);
    assert_eq!(group.library(), "simccl 1.0");
    let cost = group.cost().expect("simccl states its figures");
    assert!(cost.latency > Duration::ZERO && cost.bus_bytes_per_s > 0.0);
    // A device twice is refused by the loader, naming it.
    let twice = [devices[0].clone(), devices[0].clone()];
    let e = collective_group(&twice, CONFIG).unwrap().err().unwrap();
    assert!(e.to_string().contains("rank 0 and rank 1"), "{e}");
}

#[test]
fn plugins_without_native_collectives_offer_no_group() {
    for (path, name) in [
        (support::minimal(), "minimal"),
        (support::minimal_1_0(), "minimal"),
        (support::bad("GROUP_PARTIAL"), "bad"),
        (support::bad("GROUP_MINOR_2"), "bad"),
    ] {
        let devices = devices(&path, &format!("plugin.{name}:0"));
        assert!(
            collective_group(&devices, CONFIG).is_none(),
            "{}: a group was offered",
            path.display()
        );
    }
}
