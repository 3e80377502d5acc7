//! The simulated NPU configured from the environment as a small, slow device: 3 devices
//! of 1 MiB, 3 ms per operation, 0.05 GB/s (50 MB/s) copies. The variables are set
//! before the plugin is first asked for devices, which is when it reads them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Once;
use std::time::{Duration, Instant};

use common::*;
use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::ErrorCode;

fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("XPU_SIMNPU_DEVICES", "3");
        std::env::set_var("XPU_SIMNPU_MEMORY", "1M");
        std::env::set_var("XPU_SIMNPU_LATENCY_US", "3000");
        std::env::set_var("XPU_SIMNPU_BANDWIDTH_GBPS", "0.05");
    });
}

#[test]
fn the_environment_sets_devices_memory_and_speed() {
    configure();
    assert_eq!(device_count().unwrap(), 3);
    let d = open(2).unwrap();
    assert_eq!(properties(d).memory_bytes, 1 << 20);
    assert_eq!(memory(d), (1 << 20, 1 << 20));
    assert_eq!(
        capabilities(d),
        ["simulated=1", "latency_us=3000", "bandwidth_gbps=0.05"]
    );
    close(d);
}

#[test]
fn operations_take_their_simulated_time() {
    configure();
    let d = open(0).unwrap();
    let s = stream(d);
    let b = alloc(d, 256 << 10).unwrap();
    let data = pattern(9, 256 << 10);
    let wall = Instant::now();
    let e0 = record(s);
    builtin(s, &Op::new(builtin_kind::FILL, dtype::U8, range(b, 0, 64))).unwrap();
    let e1 = record(s);
    write_async(s, range(b, 0, 256 << 10), &data).unwrap();
    let e2 = record(s);
    sync(s).unwrap();
    let wall = wall.elapsed();

    // A builtin: the latency. A 256 KiB copy: latency + 262144 B / 50 MB/s = 8.24 ms.
    let fill = Duration::from_nanos(elapsed_ns(e0, e1).unwrap());
    let copy = Duration::from_nanos(elapsed_ns(e1, e2).unwrap());
    assert!(fill >= Duration::from_micros(3000), "{fill:?}");
    assert!(copy >= Duration::from_micros(8240), "{copy:?}");
    assert!(wall >= fill + copy, "{wall:?}");
    assert_eq!(read(s, range(b, 0, 256 << 10)).unwrap(), data);

    for e in [e0, e1, e2] {
        destroy_event(e);
    }
    free(b);
    destroy_stream(s);
    close(d);
}

#[test]
fn a_small_memory_runs_out_and_fragments() {
    configure();
    let d = open(1).unwrap();
    let all = alloc(d, 1 << 20).unwrap();
    let e = alloc(d, 1).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutOfMemory);
    free(all);
    let a = alloc(d, 300 << 10).unwrap();
    let b = alloc(d, 300 << 10).unwrap();
    let c = alloc(d, 300 << 10).unwrap();
    free(b);
    // 424 KiB are free, but in two pieces of 300 and 124 KiB.
    assert_eq!(memory(d).1, 424 << 10);
    let e = alloc(d, 400 << 10).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutOfMemory);
    assert!(
        e.message().contains("the largest free block holds 307200"),
        "{e}"
    );
    free(a);
    free(c);
    close(d);
}
