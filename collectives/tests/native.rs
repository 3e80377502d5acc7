//! A plugin's native collectives (plugin ABI 1.3) under a communicator: the simulated
//! NPU's `simccl`, loaded from its real shared library through the plugin loader.
//! Every operation, dtype and reduction, in place and out of place, through the
//! library; the figures it states reaching the cost model; forcing either way; and an
//! abort reaching the library's waiting parts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use xpu_collectives::{Algorithm, Collective, Communicator, ReduceOp};
use xpu_hal::{DType, Device, DeviceSelector, LaunchDims, Registry};
use xpu_host::{HostBackend, HostConfig};
use xpu_plugin::PluginBackend;

mod support;
use support::{check_every, forced, gate, run, KINDS};

/// One registry for the whole binary: the plugin reads its configuration once.
fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::new();
        r.register(Arc::new(PluginBackend::load(support::sim_npu()).unwrap()))
            .unwrap();
        r.register(Arc::new(HostBackend::new(HostConfig {
            devices: 1,
            capacity: 64 << 20,
        })))
        .unwrap();
        r
    })
}

fn devices(sel: &str) -> Vec<Device> {
    registry()
        .devices(&DeviceSelector::parse(sel).unwrap())
        .unwrap()
}

fn comm(sel: &str, overrides: &str, timeout: Duration) -> Communicator {
    support::communicator(devices(sel), overrides, timeout)
}

#[test]
fn every_operation_is_exact_through_the_plugins_library() {
    let comm = comm(
        "plugin.simnpu:0,1",
        &forced("native"),
        Duration::from_secs(60),
    );
    assert_eq!(comm.native_library().as_deref(), Some("simccl 1.0"));
    assert!(comm.offers(Algorithm::Native));
    for kind in KINDS {
        assert_eq!(comm.algorithm_for(kind, 64).0, Algorithm::Native, "{kind}");
        check_every(&comm, kind, &DType::ALL, &[1, 7, 300], "simccl:");
    }
}

#[test]
fn the_librarys_figures_are_weighed_and_either_side_can_be_forced() {
    let own = comm("plugin.simnpu:0,1", "", Duration::from_secs(60));
    // simccl states 60 µs and 4 GB/s by default: a 2-rank all-reduce of B bytes moves
    // B bytes on the bus (factor 2(n−1)/n = 1).
    let bytes = 1u64 << 20;
    let t = own
        .estimate(Collective::AllReduce, Algorithm::Native, bytes)
        .unwrap();
    let want = 60.0 + bytes as f64 / 4e9 * 1e6;
    assert!(
        (t - want).abs() < 1e-6,
        "estimate {t} µs, stated figures give {want}"
    );
    // The choice is the cheapest estimate among what the communicator offers.
    for bytes in [64u64, 1 << 20] {
        let (chosen, why) = own.algorithm_for(Collective::AllReduce, bytes);
        let best = Algorithm::ALL
            .into_iter()
            .filter(|&a| own.offers(a))
            .filter_map(|a| Some((a, own.estimate(Collective::AllReduce, a, bytes)?)))
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .unwrap();
        let chosen_t = own.estimate(Collective::AllReduce, chosen, bytes).unwrap();
        assert!(
            chosen_t <= best.1 * 1.0101,
            "{bytes} B: chose {chosen} ({why}, {chosen_t} µs) over {best:?}"
        );
    }
    // Forcing xpu's own algorithms runs them, with the same results.
    let ring = comm(
        "plugin.simnpu:0,1",
        &forced("ring"),
        Duration::from_secs(60),
    );
    assert_eq!(
        ring.algorithm_for(Collective::AllReduce, 1 << 20).0,
        Algorithm::Ring
    );
    let wrong = run(
        &ring,
        Collective::AllReduce,
        DType::F32,
        ReduceOp::Sum,
        300,
        false,
    );
    assert_eq!(wrong, vec![0, 0]);
    // `nccl`, the algorithm's earlier name, still forces the native library.
    let old = comm(
        "plugin.simnpu:0,1",
        "allreduce:nccl",
        Duration::from_secs(60),
    );
    assert_eq!(
        old.algorithm_for(Collective::AllReduce, 64).0,
        Algorithm::Native
    );
}

#[test]
fn abort_releases_a_rank_waiting_in_the_library() {
    let comm = comm(
        "plugin.simnpu:0,1",
        &forced("native"),
        Duration::from_secs(120),
    );
    let ranks = comm.ranks();
    let streams: Vec<_> = ranks
        .iter()
        .map(|r| r.device().create_stream().unwrap())
        .collect();
    let buffers: Vec<_> = ranks
        .iter()
        .map(|r| r.device().allocate(4096).unwrap())
        .collect();
    // Rank 1's stream waits behind a gate on a host stream, so its part cannot start;
    // rank 0's part waits inside simccl for it until the abort.
    let host = devices("host:0").remove(0);
    let host_stream = host.create_stream().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    host_stream
        .launch(&gate(&host, release.clone()), LaunchDims::linear(1, 1), &[])
        .unwrap();
    let held = host_stream.record_event().unwrap();
    streams[1].wait_event(&held).unwrap();
    std::thread::scope(|s| {
        for (r, rank) in ranks.iter().enumerate() {
            let (b, st) = (&buffers[r], &streams[r]);
            s.spawn(move || {
                rank.all_reduce(b, b, DType::F32, ReduceOp::Sum, st)
                    .unwrap()
            });
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    comm.abort();
    let e = streams[0].synchronize().unwrap_err();
    assert!(e.to_string().contains("aborted"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "released at once"
    );
    // Rank 1's part, once its stream moves on, fails too instead of waiting.
    release.store(true, Ordering::Release);
    host_stream.synchronize().unwrap();
    let e = streams[1].synchronize().unwrap_err();
    assert!(e.to_string().contains("aborted"), "{e}");
}
