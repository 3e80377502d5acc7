//! What the communicator tests share: one operation on every rank of this process,
//! checked element by element.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xpu_collectives::check;
use xpu_collectives::comm::select::Selector;
use xpu_collectives::{Collective, CommOptions, Communicator, ReduceOp, Topology};
use xpu_hal::{DType, Device, KernelDesc, KernelSource};

/// The operations with data, as the tests sweep them.
pub const KINDS: [Collective; 6] = [
    Collective::AllReduce,
    Collective::Reduce,
    Collective::Broadcast,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
];

/// Runs `kind` on every rank (each on its own thread) and returns the number of wrong
/// elements per rank.
pub fn run(
    comm: &Communicator,
    kind: Collective,
    dtype: DType,
    op: ReduceOp,
    elems: usize,
    in_place: bool,
) -> Vec<usize> {
    let n = comm.size();
    let size = dtype.size();
    let root = n - 1;
    let reducing = matches!(
        kind,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    );
    let op_in = reducing.then_some(op);
    std::thread::scope(|s| {
        let handles: Vec<_> = comm
            .ranks()
            .into_iter()
            .map(|rank| {
                s.spawn(move || {
                    let r = rank.rank();
                    let device = rank.device().clone();
                    let stream = device.create_stream().unwrap();
                    let (send_elems, recv_elems) = match kind {
                        Collective::AllGather => (elems, elems * n),
                        Collective::ReduceScatter => (elems * n, elems),
                        Collective::AllToAll => (elems * n, elems * n),
                        _ => (elems, elems),
                    };
                    let input = check::input(dtype, op_in, r, n, send_elems);
                    let send = device.allocate(input.len() as u64).unwrap();
                    stream.write(&send, &input).unwrap();
                    let recv = device.allocate((recv_elems * size) as u64).unwrap();
                    let bytes = (elems * size) as u64;
                    let result = match kind {
                        Collective::AllReduce if in_place => {
                            rank.all_reduce(&send, &send, dtype, op, &stream)
                        }
                        Collective::AllReduce => rank.all_reduce(&send, &recv, dtype, op, &stream),
                        Collective::Reduce => {
                            let target = if in_place { send.whole() } else { recv.whole() };
                            rank.reduce(
                                &send,
                                (r == root).then_some(target),
                                dtype,
                                op,
                                root,
                                &stream,
                            )
                        }
                        Collective::Broadcast if in_place => {
                            rank.broadcast(None, &send, root, &stream)
                        }
                        Collective::Broadcast => {
                            rank.broadcast((r == root).then(|| send.whole()), &recv, root, &stream)
                        }
                        Collective::AllGather if in_place => {
                            // The send buffer is this rank's block of the receive buffer.
                            stream
                                .write(recv.slice(r as u64 * bytes, bytes), &input)
                                .unwrap();
                            rank.all_gather(recv.slice(r as u64 * bytes, bytes), &recv, &stream)
                        }
                        Collective::AllGather => rank.all_gather(&send, &recv, &stream),
                        Collective::ReduceScatter if in_place => rank.reduce_scatter(
                            &send,
                            send.slice(r as u64 * bytes, bytes),
                            dtype,
                            op,
                            &stream,
                        ),
                        Collective::ReduceScatter => {
                            rank.reduce_scatter(&send, &recv, dtype, op, &stream)
                        }
                        Collective::AllToAll => rank.all_to_all(&send, &recv, &stream),
                        other => panic!("not tested here: {other}"),
                    };
                    result.unwrap_or_else(|e| panic!("rank {r} {kind}: {e}"));
                    stream.synchronize().unwrap();
                    let (got, want): (Vec<u8>, Vec<u8>) = match kind {
                        Collective::AllReduce => {
                            let b = if in_place { &send } else { &recv };
                            (stream.read(b).unwrap(), check::reduced(dtype, op, n, elems))
                        }
                        Collective::Reduce if r != root => return 0,
                        Collective::Reduce => {
                            let b = if in_place { &send } else { &recv };
                            (stream.read(b).unwrap(), check::reduced(dtype, op, n, elems))
                        }
                        Collective::Broadcast => {
                            let b = if in_place { &send } else { &recv };
                            (
                                stream.read(b).unwrap(),
                                check::input(dtype, None, root, n, elems),
                            )
                        }
                        Collective::AllGather => (
                            stream.read(&recv).unwrap(),
                            (0..n)
                                .flat_map(|q| check::input(dtype, None, q, n, elems))
                                .collect(),
                        ),
                        Collective::ReduceScatter => {
                            let all = check::reduced(dtype, op, n, elems * n);
                            let got = if in_place {
                                stream.read(send.slice(r as u64 * bytes, bytes)).unwrap()
                            } else {
                                stream.read(&recv).unwrap()
                            };
                            (got, all[r * elems * size..(r + 1) * elems * size].to_vec())
                        }
                        Collective::AllToAll => (
                            stream.read(&recv).unwrap(),
                            (0..n)
                                .flat_map(|q| {
                                    let theirs = check::input(dtype, None, q, n, elems * n);
                                    theirs[r * elems * size..(r + 1) * elems * size].to_vec()
                                })
                                .collect(),
                        ),
                        _ => unreachable!(),
                    };
                    check::wrong_elements(dtype, &got, &want)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A host kernel that holds its stream until `release` is set.
pub fn gate(device: &Device, release: Arc<AtomicBool>) -> xpu_hal::Kernel {
    device
        .load_kernel(KernelDesc {
            name: "gate".into(),
            entry_point: "gate".into(),
            source: KernelSource::HostFunction(Arc::new(move |_| {
                while !release.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_micros(50));
                }
                Ok(())
            })),
            params: vec![],
        })
        .unwrap()
}

/// A communicator over `devices` with the `XPU_COLL_ALGO`-style `overrides` and
/// `timeout`.
pub fn communicator(devices: Vec<Device>, overrides: &str, timeout: Duration) -> Communicator {
    let topology = Topology::discover(&devices).unwrap();
    Communicator::with_topology(
        devices,
        topology,
        CommOptions {
            timeout,
            selector: Selector::parse(overrides).unwrap(),
        },
    )
    .unwrap()
}

/// `XPU_COLL_ALGO` overrides that force `algorithm` for every operation of [`KINDS`].
pub fn forced(algorithm: &str) -> String {
    KINDS
        .iter()
        .map(|k| format!("{}:{algorithm}", k.name()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs `kind` on `comm` in every dtype of `dtypes`, every reduction it has, at every
/// size of `sizes`, in place and out of place, and fails naming `what` and the case at
/// the first wrong element.
pub fn check_every(
    comm: &Communicator,
    kind: Collective,
    dtypes: &[DType],
    sizes: &[usize],
    what: &str,
) {
    let ops: &[ReduceOp] = match kind {
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter => &ReduceOp::ALL,
        _ => &[ReduceOp::Sum],
    };
    for &dtype in dtypes {
        for &op in ops {
            for &elems in sizes {
                for in_place in [false, true] {
                    if kind == Collective::AllToAll && in_place {
                        continue;
                    }
                    let wrong = run(comm, kind, dtype, op, elems, in_place);
                    assert!(
                        wrong.iter().all(|&w| w == 0),
                        "{what} {kind} {} {op} × {elems} in_place={in_place}: wrong elements per rank {wrong:?}",
                        dtype.name()
                    );
                }
            }
        }
    }
}

/// The sim-npu plugin Cargo built next to the test binary (a dev-dependency).
pub fn sim_npu() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = format!("libxpu_sim_npu.{}", std::env::consts::DLL_EXTENSION);
    [deps.join(&name), deps.join("..").join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .expect("the xpu-sim-npu plugin is built (it is a dev-dependency)")
}
