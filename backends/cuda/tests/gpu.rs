//! The CUDA backend on a GPU: CUDA C kernels, growable allocations, and waits on
//! another backend's events that must neither block the driver's callback thread nor
//! the thread that enqueues them. Without a CUDA device every test returns early (and
//! fails when `XPU_REQUIRE` names `cuda`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::mpsc::channel;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use xpu_cuda::CudaBackend;
use xpu_hal::backend::Backend;
use xpu_hal::{
    Access, Device, DeviceSelector, HostBuffer, KernelArg, KernelDesc, KernelParam, KernelSource,
    LaunchDims, Registry, Scalar,
};
use xpu_host::{HostBackend, HostConfig};

/// How long a step may take before the test calls it a deadlock (a hang detector, not
/// a performance bound).
const DEADLOCK: Duration = Duration::from_secs(120);

fn required() -> bool {
    std::env::var("XPU_REQUIRE").is_ok_and(|v| v.split(',').any(|p| p.trim() == "cuda"))
}

/// `cuda:0` and `host:0` of one registry, or `None` without a CUDA device.
fn devices() -> Option<(Device, Device)> {
    if let Err(e) = CudaBackend::new().enumerate() {
        assert!(!required(), "CUDA is required here: {e}");
        eprintln!("skipped: {e}");
        return None;
    }
    let mut r = Registry::new();
    r.register(Arc::new(CudaBackend::new())).unwrap();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 1,
        capacity: 64 << 20,
    })))
    .unwrap();
    let cuda = r
        .devices(&DeviceSelector::parse("cuda:0").unwrap())
        .unwrap()
        .remove(0);
    let host = r
        .devices(&DeviceSelector::parse("host:0").unwrap())
        .unwrap()
        .remove(0);
    Some((cuda, host))
}

#[test]
fn cuda_c_kernels_compile_and_run() {
    let Some((cuda, _)) = devices() else { return };
    let caps = cuda.capabilities();
    if !caps.supports_kernel_format(xpu_hal::KernelFormat::CudaC) {
        eprintln!("skipped: no NVRTC, so no CUDA C kernels");
        return;
    }
    let source = r#"
        extern "C" __global__ void add(unsigned char* p, long long n, long long k) {
            long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
            if (i < n) p[i] = (unsigned char)(p[i] + k);
        }
    "#;
    let kernel = cuda
        .load_kernel(KernelDesc {
            name: "add".into(),
            entry_point: "add".into(),
            source: KernelSource::CudaC(source.into()),
            params: vec![
                KernelParam::Buffer(Access::ReadWrite),
                KernelParam::Scalar(xpu_hal::DType::I64),
                KernelParam::Scalar(xpu_hal::DType::I64),
            ],
        })
        .unwrap();
    let s = cuda.create_stream().unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let a = cuda.allocate(1000).unwrap();
    s.write(&a, &data).unwrap();
    s.launch(
        &kernel,
        LaunchDims::linear(4, 256),
        &[
            KernelArg::Buffer(a.whole()),
            KernelArg::Scalar(Scalar::I64(1000)),
            KernelArg::Scalar(Scalar::I64(3)),
        ],
    )
    .unwrap();
    let want: Vec<u8> = data.iter().map(|b| b.wrapping_add(3)).collect();
    assert_eq!(s.read(&a).unwrap(), want);
    // A compile error is an invalid argument with NVRTC's log.
    let bad = cuda.load_kernel(KernelDesc {
        name: "bad".into(),
        entry_point: "bad".into(),
        source: KernelSource::CudaC("extern \"C\" __global__ void bad() { nope; }".into()),
        params: vec![],
    });
    assert!(
        matches!(bad, Err(xpu_hal::Error::InvalidArgument { .. })),
        "{bad:?}"
    );
}

#[test]
fn growable_allocations_grow_and_shrink_in_place() {
    let Some((cuda, _)) = devices() else { return };
    let Some(g) = cuda.capabilities().virtual_memory_granularity else {
        eprintln!("skipped: no virtual memory management on this device");
        return;
    };
    let s = cuda.create_stream().unwrap();
    let a = cuda.allocate_growable(8 * g, g).unwrap();
    let first: Vec<u8> = (0..g).map(|i| (i % 251) as u8).collect();
    s.write(&a, &first).unwrap();
    a.resize(4 * g).unwrap();
    s.fill(a.slice(g, 3 * g), Scalar::U8(7)).unwrap();
    let all = s.read(&a).unwrap();
    assert_eq!(&all[..g as usize], &first[..]);
    assert!(all[g as usize..].iter().all(|b| *b == 7));
    // Queued work on the tail finishes before the tail is unmapped.
    s.fill(a.slice(g, 3 * g), Scalar::U8(9)).unwrap();
    a.resize(g).unwrap();
    s.synchronize().unwrap();
    assert_eq!(s.read(&a).unwrap(), first);
    a.resize(2 * g).unwrap();
    s.fill(a.slice(g, g), Scalar::U8(1)).unwrap();
    s.synchronize().unwrap();
    drop(a);
    s.synchronize().unwrap();
}

/// A gate a host kernel blocks on until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }
}

#[test]
fn foreign_waits_block_neither_the_caller_nor_other_streams_host_steps() {
    let Some((cuda, host)) = devices() else {
        return;
    };
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let hold = host
        .load_kernel(KernelDesc {
            name: "hold".into(),
            entry_point: String::new(),
            source: KernelSource::host_fn(move |_| {
                g.wait();
                Ok(())
            }),
            params: vec![],
        })
        .unwrap();
    let hs = host.create_stream().unwrap();
    hs.launch(&hold, LaunchDims::linear(1, 1), &[]).unwrap();
    let held = hs.record_event().unwrap();

    // The wait returns at once: the gate is opened by this very thread, later.
    let a = cuda.create_stream().unwrap();
    let buf = cuda.allocate(4096).unwrap();
    a.wait_event(&held).unwrap();
    let after = HostBuffer::from_bytes(&[0xAB; 4096]).unwrap();
    a.copy_from_host(&after, 0, &buf).unwrap();

    // Another stream's host steps (a device-to-host copy drains through a callback)
    // complete while the first stream waits.
    let b = cuda.create_stream().unwrap();
    let other = cuda.allocate(4096).unwrap();
    b.write(&other, &[5; 4096]).unwrap();
    let (tx, rx) = channel();
    let reader = std::thread::spawn(move || {
        let got = b.read(&other);
        let _ = tx.send(got.map(|v| v == vec![5; 4096]));
    });
    let outcome = rx.recv_timeout(DEADLOCK);
    gate.open();
    reader.join().unwrap();
    assert!(
        matches!(outcome, Ok(Ok(true))),
        "a stream's host steps did not run while another stream waited for a host event: {outcome:?}"
    );
    // Stream order held: the copy ran after the foreign event.
    assert_eq!(a.read(&buf).unwrap(), vec![0xAB; 4096]);
    hs.synchronize().unwrap();
}

#[test]
fn nccl_groups_refuse_other_devices_and_run_on_gpus() {
    use xpu_cuda::nccl::NcclGroup;
    use xpu_hal::group::{CollectiveGroup, GroupOp, GroupPart, GroupReduce};
    // Without a GPU: a group of host devices is refused with the reason, not a panic.
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 2,
        capacity: 1 << 20,
    })))
    .unwrap();
    let hosts = r
        .devices(&DeviceSelector::parse("host:0,1").unwrap())
        .unwrap();
    let e = NcclGroup::new(&hosts).unwrap_err();
    assert!(e.to_string().contains("host:0 is not a CUDA device"), "{e}");
    let Some((cuda, _)) = devices() else { return };
    if let Err(reason) = xpu_cuda::nccl::available() {
        eprintln!("skipped: {reason}");
        return;
    }
    let e = NcclGroup::new(&[cuda.clone(), cuda.clone()]).unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
    // One rank: an all-reduce is a copy, and an average divides by one.
    let group = NcclGroup::new(std::slice::from_ref(&cuda)).unwrap();
    let stream = cuda.create_stream().unwrap();
    let values: Vec<u8> = (0..1024u32)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let send = cuda.allocate(values.len() as u64).unwrap();
    let recv = cuda.allocate(values.len() as u64).unwrap();
    stream.write(&send, &values).unwrap();
    let part = GroupPart {
        stream: &stream,
        send: Some(send.whole()),
        recv: Some(recv.whole()),
    };
    group
        .run(
            GroupOp::AllReduce {
                count: 1024,
                dtype: xpu_hal::DType::F32,
                op: GroupReduce::Avg,
            },
            &[part],
        )
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(stream.read(&recv).unwrap(), values);
}

#[test]
fn host_buffers_are_page_locked_and_copied_directly() {
    const MIB: u64 = 1 << 20;
    let Some((cuda, _host)) = devices() else {
        return;
    };
    let mut host = HostBuffer::from_bytes(&vec![7u8; 2 * MIB as usize]).unwrap();
    assert!(cuda.pin_host(&host).unwrap());
    // Through the registration both ways, queued behind a fill.
    let s = cuda.create_stream().unwrap();
    let a = cuda.allocate(2 * MIB).unwrap();
    s.fill(&a, Scalar::U8(1)).unwrap();
    s.copy_from_host(&host, MIB + 5, a.slice(3, MIB - 5))
        .unwrap();
    s.copy_to_host(a.slice(0, MIB), &host, 0).unwrap();
    s.synchronize().unwrap();
    let got = host.as_slice().unwrap();
    let mib = MIB as usize;
    assert_eq!(&got[..3], &[1u8; 3]);
    assert!(got[3..mib - 2].iter().all(|&b| b == 7));
    assert_eq!(&got[mib - 2..mib], &[1u8; 2]);
}

#[test]
fn the_device_says_which_nvrtc_and_nccl_it_uses_and_how_it_waits() {
    let Some((cuda, _)) = devices() else { return };
    let extra = cuda.info().extra.join("\n");
    eprintln!("{extra}");
    let driver = xpu_cuda::driver().unwrap();
    let nvrtc = extra.lines().find(|l| l.starts_with("nvrtc=")).unwrap();
    match &driver.nvrtc {
        Ok(n) => {
            assert!(nvrtc.contains(&n.path), "{nvrtc}");
            // An H100/H200 (sm_90) is known to every NVRTC of CUDA 12 and 13: its
            // builtins are its own machine code, not PTX for the driver to compile.
            if extra.contains("compute_capability=9.0") {
                assert!(nvrtc.contains("machine code for sm_90"), "{nvrtc}");
            }
        }
        Err(reason) => assert!(nvrtc.contains(reason.as_str()), "{nvrtc}"),
    }
    assert!(extra.lines().any(|l| l.starts_with("nccl=")), "{extra}");
    // Waits on other backends' events use cuStreamWaitValue32 wherever the driver
    // exports it: the GEQ comparison needs no device attribute.
    let mode = if driver.stream_wait_value {
        "foreign_event_wait=stream-wait-value"
    } else {
        "foreign_event_wait=spin-kernel"
    };
    assert!(extra.contains(mode), "{extra}");
}

#[test]
fn nccl_work_is_seen_by_synchronize_and_holds_its_buffers() {
    use xpu_cuda::nccl::NcclGroup;
    use xpu_hal::group::{CollectiveGroup, GroupOp, GroupPart, GroupReduce};
    let Some((cuda, _)) = devices() else { return };
    if let Err(reason) = xpu_cuda::nccl::available() {
        eprintln!("skipped: {reason}");
        return;
    }
    let group = NcclGroup::new(std::slice::from_ref(&cuda)).unwrap();
    let stream = cuda.create_stream().unwrap();
    let other = cuda.create_stream().unwrap();
    // Large enough that the all-reduce is still running when synchronize is called.
    let count = 64usize << 20;
    let values: Vec<u8> = (0..count as u32)
        .flat_map(|i| ((i % 1000) as f32).to_le_bytes())
        .collect();
    for _ in 0..3 {
        let send = cuda.allocate(values.len() as u64).unwrap();
        let recv = cuda.allocate(values.len() as u64).unwrap();
        stream.write(&send, &values).unwrap();
        stream.fill(&recv, Scalar::U8(0)).unwrap();
        stream.synchronize().unwrap();
        let part = GroupPart {
            stream: &stream,
            send: Some(send.whole()),
            recv: Some(recv.whole()),
        };
        group
            .run(
                GroupOp::AllReduce {
                    count,
                    dtype: xpu_hal::DType::F32,
                    op: GroupReduce::Sum,
                },
                &[part],
            )
            .unwrap();
        // The stream holds the send buffer until the all-reduce has read it.
        drop(send);
        // Synchronize covers the NCCL work: read on another stream afterwards.
        stream.synchronize().unwrap();
        assert!(
            other.read(&recv).unwrap() == values,
            "synchronize returned before NCCL's all-reduce finished"
        );
    }
}

#[test]
fn nccl_groups_across_processes_join_run_and_time_out() {
    use xpu_hal::group::{self, GroupAcross, GroupConfig, GroupOp, GroupPart, GroupReduce};
    let Some((cuda, _)) = devices() else { return };
    if let Err(reason) = xpu_cuda::nccl::available_across() {
        eprintln!("skipped: {reason}");
        return;
    }
    let devs = std::slice::from_ref(&cuda);
    assert!(group::spans_processes(devs));
    let id = group::group_id(&cuda).unwrap();
    assert_eq!(id.len(), xpu_cuda::nccl::UNIQUE_ID_BYTES);
    // A group of one rank: joining needs no other process.
    let across = GroupAcross {
        id,
        size: 1,
        ranks: vec![0],
    };
    let config = GroupConfig {
        timeout: Duration::from_secs(60),
    };
    let g = group::collective_group_across(devs, &across, config).unwrap();
    assert_eq!((g.size(), g.local_size()), (1, 1));
    assert!(g.library().starts_with("nccl 2."), "{}", g.library());
    let stream = cuda.create_stream().unwrap();
    let values: Vec<u8> = (0..4096u32)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let send = cuda.allocate(values.len() as u64).unwrap();
    let recv = cuda.allocate(values.len() as u64).unwrap();
    stream.write(&send, &values).unwrap();
    let part = || GroupPart {
        stream: &stream,
        send: Some(send.whole()),
        recv: Some(recv.whole()),
    };
    let e = g
        .run(GroupOp::AllGather { bytes: 4 }, &[part(), part()])
        .unwrap_err();
    assert!(e.to_string().contains("1 ranks in this process"), "{e}");
    g.run(
        GroupOp::AllReduce {
            count: 4096,
            dtype: xpu_hal::DType::F32,
            op: GroupReduce::Sum,
        },
        &[part()],
    )
    .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(stream.read(&recv).unwrap(), values);
    // All-to-all (sends and receives: NCCL connects the peers on first use).
    stream.fill(&recv, Scalar::U8(0)).unwrap();
    g.run(
        GroupOp::AllToAll {
            bytes: values.len(),
        },
        &[part()],
    )
    .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(stream.read(&recv).unwrap(), values);
    g.abort();
    let e = g
        .run(GroupOp::AllGather { bytes: 4 }, &[part()])
        .unwrap_err();
    assert!(matches!(e, xpu_hal::Error::Aborted { .. }), "{e}");
    drop(g);

    // A group of two where the other process never comes: a timeout, not a hang.
    let across = GroupAcross {
        id: group::group_id(&cuda).unwrap(),
        size: 2,
        ranks: vec![0],
    };
    let started = std::time::Instant::now();
    let timeout = GroupConfig {
        timeout: Duration::from_secs(2),
    };
    let Err(e) = group::collective_group_across(devs, &across, timeout) else {
        panic!("a group of two was joined by one rank");
    };
    assert!(matches!(e, xpu_hal::Error::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("did not join"), "{e}");
    assert!(started.elapsed() < DEADLOCK, "{:?}", started.elapsed());
}

#[test]
fn staged_device_to_host_copies_keep_their_staging_buffer_across_checkpoints() {
    let Some((cuda, _)) = devices() else { return };
    let (a, b) = (cuda.create_stream().unwrap(), cuda.create_stream().unwrap());
    let len = 1usize << 20;
    let (x, y) = (
        cuda.allocate(len as u64).unwrap(),
        cuda.allocate(len as u64).unwrap(),
    );
    let tiny = cuda.allocate(8).unwrap();
    a.write(&x, &vec![0xA1; len]).unwrap();
    b.write(&y, &vec![0xB2; len]).unwrap();
    // Stream `a` is one operation short of its automatic checkpoint before each staged
    // copy, so the checkpoint falls right after the copy into staging: the staging
    // buffer must stay leased until the drain into the host buffer has run, even while
    // stream `b` asks for staging of the same size.
    for round in 0..20 {
        let (mut ha, mut hb) = (HostBuffer::new(len).unwrap(), HostBuffer::new(len).unwrap());
        for _ in 0..255 {
            a.copy(tiny.slice(0, 4), tiny.slice(4, 4)).unwrap();
        }
        a.copy_to_host(&x, &ha, 0).unwrap();
        b.copy_to_host(&y, &hb, 0).unwrap();
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        assert!(
            ha.as_slice().unwrap().iter().all(|v| *v == 0xA1),
            "round {round}: stream a's copy read a reused staging buffer"
        );
        assert!(hb.as_slice().unwrap().iter().all(|v| *v == 0xB2));
    }
}

#[test]
fn a_pinned_buffers_last_reference_never_drops_inside_a_callback() {
    let Some((cuda, _)) = devices() else { return };
    let s = cuda.create_stream().unwrap();
    let len = 4usize << 20;
    let big = cuda.allocate(1 << 30).unwrap();
    let src = cuda.allocate(len as u64).unwrap();
    s.fill(&src, Scalar::U8(3)).unwrap();
    for _ in 0..5 {
        // Unpinned when enqueued: the copy stages and drains in a host step.
        let host = HostBuffer::new(len).unwrap();
        s.fill(&big, Scalar::U8(1)).unwrap();
        s.copy_to_host(&src, &host, 0).unwrap();
        // Pinned (cuMemHostRegister) while the copy is queued, then the caller lets go:
        // the stream's reference is the last, and unregistering is a driver call that
        // CUDA forbids inside a callback.
        assert!(cuda.pin_host(&host).unwrap());
        drop(host);
        s.synchronize().unwrap();
    }
}
