//! `simccl`, the simulated NPU's native collectives (ABI 1.3), driven through the C ABI
//! as a host would: results, the figures it states, and every failure path — a peer
//! that never starts, an abort, a lost device, and arguments the SDK refuses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::*;
use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::ErrorCode;

struct Group {
    raw: *mut xpu_group,
    library: String,
    latency_ns: u64,
    bus: u64,
}

fn create(devices: &[*mut xpu_device], timeout: Duration) -> R<Group> {
    let mut a: xpu_group_create_args = args();
    a.devices = devices.as_ptr();
    a.device_count = devices.len() as u64;
    a.timeout_ns = timeout.as_nanos() as u64;
    call(api().group_create, &mut a)?;
    assert!(!a.group.is_null());
    Ok(Group {
        raw: a.group,
        library: cstr(a.library),
        latency_ns: a.latency_ns,
        bus: a.bus_bytes_per_s,
    })
}

fn destroy(g: Group) {
    let mut a: xpu_group_args = args();
    a.group = g.raw;
    call(api().group_destroy, &mut a).unwrap();
}

fn abort(g: &Group) {
    let mut a: xpu_group_args = args();
    a.group = g.raw;
    call(api().group_abort, &mut a).unwrap();
}

fn part(stream: *mut xpu_stream, send: xpu_buffer_range, recv: xpu_buffer_range) -> xpu_group_part {
    xpu_group_part {
        struct_size: std::mem::size_of::<xpu_group_part>(),
        stream,
        send,
        recv,
    }
}

/// An f32 sum all-reduce of `count` elements.
fn all_reduce(g: &Group, parts: &[xpu_group_part], count: u64) -> R<()> {
    run(g, parts, collective::ALL_REDUCE, count, |a| {
        a.dtype = dtype::F32;
        a.op = collective_op::SUM;
    })
}

fn run(
    g: &Group,
    parts: &[xpu_group_part],
    kind: u32,
    count: u64,
    fill: impl FnOnce(&mut xpu_group_run_args),
) -> R<()> {
    let pointers: Vec<*const xpu_group_part> = parts.iter().map(|p| p as *const _).collect();
    let mut a: xpu_group_run_args = args();
    a.group = g.raw;
    a.collective = kind;
    a.count = count;
    a.parts = pointers.as_ptr();
    a.part_count = pointers.len() as u64;
    fill(&mut a);
    call(api().group_run, &mut a)
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Two devices, a stream and a 16-float buffer on each holding `i + 100 r`.
struct Pair {
    devices: [*mut xpu_device; 2],
    streams: [*mut xpu_stream; 2],
    buffers: [*mut xpu_buffer; 2],
}

impl Pair {
    fn new() -> Pair {
        let devices = [open(0).unwrap(), open(1).unwrap()];
        let streams = devices.map(stream);
        let buffers = devices.map(|d| alloc(d, 64).unwrap());
        for r in 0..2 {
            let values: Vec<f32> = (0..16).map(|i| (i + 100 * r) as f32).collect();
            write(streams[r], range(buffers[r], 0, 64), &floats(&values)).unwrap();
        }
        Pair {
            devices,
            streams,
            buffers,
        }
    }

    fn whole(&self, r: usize) -> xpu_buffer_range {
        range(self.buffers[r], 0, 64)
    }

    fn parts(&self) -> Vec<xpu_group_part> {
        (0..2)
            .map(|r| part(self.streams[r], self.whole(r), self.whole(r)))
            .collect()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for r in 0..2 {
            let _ = sync(self.streams[r]);
            destroy_stream(self.streams[r]);
            free(self.buffers[r]);
            close(self.devices[r]);
        }
    }
}

#[test]
fn simccl_reduces_and_moves_data_across_devices() {
    let p = Pair::new();
    let g = create(&p.devices, Duration::from_secs(30)).unwrap();
    assert_eq!(g.library, "simccl 1.0");
    assert!(g.latency_ns > 0 && g.bus > 0, "figures are stated");
    // In place on both ranks.
    all_reduce(&g, &p.parts(), 16).unwrap();
    for r in 0..2 {
        sync(p.streams[r]).unwrap();
        let got = to_floats(&read(p.streams[r], p.whole(r)).unwrap());
        let want: Vec<f32> = (0..16).map(|i| (2 * i + 100) as f32).collect();
        assert_eq!(got, want, "rank {r}");
    }
    // All-gather of 8 bytes per rank, in place by block (send is block r of recv).
    let parts: Vec<_> = (0..2)
        .map(|r| {
            let recv = range(p.buffers[r], 0, 16);
            part(p.streams[r], range(p.buffers[r], r as u64 * 8, 8), recv)
        })
        .collect();
    run(&g, &parts[..], collective::ALL_GATHER, 8, |_| {}).unwrap();
    for r in 0..2 {
        let got = to_floats(&read(p.streams[r], range(p.buffers[r], 0, 16)).unwrap());
        assert_eq!(got, vec![100.0, 102.0, 104.0, 106.0], "rank {r}");
    }
    // Broadcast from rank 1 without a send range of its own.
    let parts: Vec<_> = (0..2)
        .map(|r| {
            let none = xpu_buffer_range {
                buffer: null_mut(),
                offset: 0,
                length: 0,
            };
            part(p.streams[r], none, range(p.buffers[r], 32, 32))
        })
        .collect();
    write(
        p.streams[1],
        range(p.buffers[1], 32, 32),
        &floats(&[7.0; 8]),
    )
    .unwrap();
    run(&g, &parts[..], collective::BROADCAST, 32, |a| a.root = 1).unwrap();
    let got = to_floats(&read(p.streams[0], range(p.buffers[0], 32, 32)).unwrap());
    assert_eq!(got, vec![7.0; 8]);
    destroy(g);
}

#[test]
fn a_part_whose_peer_never_starts_times_out_naming_it() {
    let p = Pair::new();
    let g = create(&p.devices, Duration::from_millis(200)).unwrap();
    let gate = Gate::new();
    wait_external(p.streams[1], &gate).unwrap();
    let start = Instant::now();
    all_reduce(&g, &p.parts(), 16).unwrap();
    let e = sync(p.streams[0]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    assert!(e.message().contains("rank(s) [1]"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(20));
    // Rank 1's part then finds its peer failed.
    gate.open(0);
    let e = sync(p.streams[1]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    assert!(e.message().contains("rank 0"), "{e}");
    destroy(g);
}

#[test]
fn abort_releases_a_waiting_part_and_fails_later_runs() {
    let p = Pair::new();
    let g = create(&p.devices, Duration::from_secs(120)).unwrap();
    let gate = Gate::new();
    wait_external(p.streams[1], &gate).unwrap();
    all_reduce(&g, &p.parts(), 16).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    abort(&g);
    let e = sync(p.streams[0]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "released at once"
    );
    let e = all_reduce(&g, &p.parts(), 16).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    abort(&g); // more than once is fine
    gate.open(0);
    let e = sync(p.streams[1]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    destroy(g);
}

#[test]
fn a_lost_device_fails_its_peers_instead_of_leaving_them_waiting() {
    // Lost while its part waits in the queue: the part never runs, and its peer is told.
    let p = Pair::new();
    let g = create(&p.devices, Duration::from_secs(120)).unwrap();
    let gate = Gate::new();
    wait_external(p.streams[1], &gate).unwrap();
    all_reduce(&g, &p.parts(), 16).unwrap();
    inject_fault(p.devices[1], fault::LOST).unwrap();
    gate.open(0);
    let start = Instant::now();
    let e = sync(p.streams[0]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    assert!(e.message().contains("rank 1"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(20));
    // Lost before the run: refused at once, and the peer's part does nothing.
    let before = read(p.streams[0], p.whole(0)).unwrap();
    let e = all_reduce(&g, &p.parts(), 16).unwrap_err();
    assert_eq!(e.code(), ErrorCode::DeviceLost, "{e}");
    sync(p.streams[0]).unwrap();
    assert_eq!(read(p.streams[0], p.whole(0)).unwrap(), before);
    destroy(g);
}

#[test]
fn bad_arguments_are_refused_before_anything_is_enqueued() {
    let p = Pair::new();
    let e = create(&[p.devices[0], p.devices[0]], Duration::ZERO)
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.message().contains("again"), "{e}");
    let e = create(&[], Duration::ZERO).err().unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    let g = create(&p.devices, Duration::from_secs(30)).unwrap();
    let parts = p.parts();
    let refused = |e: xpu_plugin_sdk::Error, code: ErrorCode, text: &str| {
        assert_eq!(e.code(), code, "{e}");
        assert!(e.message().contains(text), "{text}: {e}");
    };
    // One part for two ranks.
    refused(
        all_reduce(&g, &parts[..1], 16).unwrap_err(),
        ErrorCode::InvalidArgument,
        "one part per rank",
    );
    // The ranks' streams swapped.
    let swapped = vec![parts[1], parts[0]];
    refused(
        all_reduce(&g, &swapped, 16).unwrap_err(),
        ErrorCode::InvalidArgument,
        "another device",
    );
    // More elements than the ranges hold.
    refused(
        all_reduce(&g, &parts, 17).unwrap_err(),
        ErrorCode::InvalidArgument,
        "needs 68",
    );
    // A root out of range, an unknown operation, an unknown reduction.
    refused(
        run(&g, &parts, collective::BROADCAST, 64, |a| a.root = 2).unwrap_err(),
        ErrorCode::InvalidArgument,
        "root is 2",
    );
    refused(
        run(&g, &parts, 99, 16, |_| {}).unwrap_err(),
        ErrorCode::Unsupported,
        "collective is 99",
    );
    refused(
        run(&g, &parts, collective::ALL_REDUCE, 16, |a| a.op = 9).unwrap_err(),
        ErrorCode::Unsupported,
        "op is 9",
    );
    // Partly overlapping send and receive ranges.
    let overlapping = vec![
        part(
            p.streams[0],
            range(p.buffers[0], 0, 32),
            range(p.buffers[0], 16, 32),
        ),
        part(
            p.streams[1],
            range(p.buffers[1], 0, 32),
            range(p.buffers[1], 32, 32),
        ),
    ];
    refused(
        all_reduce(&g, &overlapping, 8).unwrap_err(),
        ErrorCode::InvalidArgument,
        "overlap",
    );
    // Nothing ran: the data is as written.
    for r in 0..2 {
        sync(p.streams[r]).unwrap();
        let got = to_floats(&read(p.streams[r], p.whole(r)).unwrap());
        let want: Vec<f32> = (0..16).map(|i| (i + 100 * r) as f32).collect();
        assert_eq!(got, want, "rank {r}");
    }
    destroy(g);
}
