//! Native collectives (plugin ABI 1.3) through the loader: a plugin that offers them
//! (the simulated NPU) gives its devices a collective group with its library's name and
//! figures; plugins that do not — built against an older ABI, leaving the functions
//! NULL, setting only some of them, or setting them under an older `abi_minor` — give
//! none, and their functions are never called.
//!
//! Groups across processes (ABI 1.4): the simulated NPU's identifier, joined by two
//! parts as two processes would (here two threads, each with its own device and rank),
//! runs operations whose ranks meet in its shared memory; a part alone times out naming
//! the ranks missing; bad ranks and identifiers are refused; older plugins offer none.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use xpu_hal::group::{
    collective_group, collective_group_across, group_id, spans_processes, GroupAcross, GroupConfig,
    GroupOp, GroupPart, GroupReduce,
};
use xpu_hal::{DType, Error};
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

/// Joins the group `id` names with `device` at `rank` of `size`.
fn join(
    device: &Device,
    id: &[u8],
    rank: usize,
    size: usize,
    timeout: Duration,
) -> xpu_hal::Result<Box<dyn xpu_hal::group::CollectiveGroup>> {
    let across = GroupAcross {
        id: id.to_vec(),
        size,
        ranks: vec![rank],
    };
    collective_group_across(
        std::slice::from_ref(device),
        &across,
        GroupConfig { timeout },
    )
}

#[test]
fn a_group_across_processes_is_joined_by_every_part_and_reduces_exactly() {
    let devices = devices(&support::sim_npu(), "plugin.simnpu:0,1");
    assert!(spans_processes(&devices));
    let id = group_id(&devices[0]).unwrap();
    let path = std::str::from_utf8(&id).unwrap().to_string();
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, device)| {
                let id = &id;
                s.spawn(move || {
                    let group = join(device, id, rank, 2, Duration::from_secs(30)).unwrap();
                    assert_eq!((group.size(), group.local_size()), (2, 1));
                    assert_eq!(group.library(), "simccl 1.0");
                    let stream = device.create_stream().unwrap();
                    let data: Vec<f32> = (0..1000).map(|i| (i * (rank + 1)) as f32).collect();
                    let buf = device.allocate(4000).unwrap();
                    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                    stream.write(&buf, &bytes).unwrap();
                    let op = GroupOp::AllReduce {
                        count: 1000,
                        dtype: DType::F32,
                        op: GroupReduce::Sum,
                    };
                    let part = GroupPart {
                        stream: &stream,
                        send: Some(buf.slice(0, 4000)),
                        recv: Some(buf.slice(0, 4000)),
                    };
                    group.run(op, &[part]).unwrap();
                    stream.synchronize().unwrap();
                    let out = stream.read(&buf).unwrap();
                    out.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect::<Vec<f32>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for got in sums {
        let want: Vec<f32> = (0..1000).map(|i| (i * 3) as f32).collect();
        assert_eq!(got, want);
    }
    // Once every part had joined, the shared memory's name was removed.
    assert!(!Path::new(&path).exists(), "{path} is left behind");
}

#[test]
fn a_part_alone_times_out_naming_the_ranks_that_never_joined() {
    let devices = devices(&support::sim_npu(), "plugin.simnpu:0");
    let id = group_id(&devices[0]).unwrap();
    let e = join(&devices[0], &id, 0, 3, Duration::from_millis(300))
        .err()
        .expect("a part alone cannot form the group");
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(e.to_string().contains("[1, 2]"), "{e}");
    let path = std::str::from_utf8(&id).unwrap().to_string();
    assert!(!Path::new(&path).exists(), "{path} is left behind");
}

#[test]
fn bad_ranks_and_identifiers_are_refused_before_anything_waits() {
    let devices = devices(&support::sim_npu(), "plugin.simnpu:0,1");
    let id = group_id(&devices[0]).unwrap();
    let config = GroupConfig {
        timeout: Duration::from_secs(30),
    };
    let refused = |ranks: Vec<usize>, size: usize, id: &[u8], devices: &[Device]| {
        let across = GroupAcross {
            id: id.to_vec(),
            size,
            ranks,
        };
        collective_group_across(devices, &across, config)
            .err()
            .expect("refused")
    };
    // Twice the same rank, a rank beyond the size, fewer ranks than devices.
    let e = refused(vec![0, 0], 2, &id, &devices);
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let e = refused(vec![2], 2, &id, &devices[..1]);
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let e = refused(vec![0], 2, &id, &devices);
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    // An identifier the library never made, and an empty one.
    let e = refused(vec![0], 2, b"/etc/passwd", &devices[..1]);
    assert!(e.to_string().contains("not one simccl made"), "{e}");
    let e = refused(vec![0], 2, b"", &devices[..1]);
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(Path::new("/etc/passwd").exists());
}

#[test]
fn plugins_of_older_abis_offer_no_group_across_processes() {
    for (path, name) in [
        (support::minimal(), "minimal"),
        (support::bad("GROUP_MINOR_2"), "bad"),
        (support::bad("GROUP_ID_MINOR_3"), "bad"),
    ] {
        let devices = devices(&path, &format!("plugin.{name}:0"));
        assert!(!spans_processes(&devices), "{}", path.display());
        // Refused by the loader: the plugin's group_id (which says it was called) is
        // never reached.
        let e = group_id(&devices[0]).expect_err("no identifier");
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        assert!(!e.to_string().contains("was called"), "{e}");
    }
}
