//! What the communicator tests share: one operation on every rank of this process,
//! checked element by element.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xpu_collectives::check;
use xpu_collectives::comm::select::Selector;
use xpu_collectives::{Collective, CommOptions, Communicator, Rank, ReduceOp, Topology};
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

/// One operation as every rank runs it.
#[derive(Clone, Copy)]
struct Case {
    kind: Collective,
    dtype: DType,
    op: ReduceOp,
    elems: usize,
    in_place: bool,
    n: usize,
    root: usize,
}

/// A rank's stream and buffers for a [`Case`], its input written.
struct Prepared {
    stream: xpu_hal::Stream,
    send: xpu_hal::Allocation,
    recv: xpu_hal::Allocation,
    input: Vec<u8>,
}

impl Case {
    fn new(
        comm: &Communicator,
        kind: Collective,
        dtype: DType,
        op: ReduceOp,
        elems: usize,
        in_place: bool,
    ) -> Case {
        let n = comm.size();
        Case {
            kind,
            dtype,
            op,
            elems,
            in_place,
            n,
            root: n - 1,
        }
    }

    fn reducing(&self) -> bool {
        matches!(
            self.kind,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        )
    }

    /// Rank `r`'s stream and buffers, its input written on the stream.
    fn prepare(&self, rank: &Rank) -> Prepared {
        let (n, elems) = (self.n, self.elems);
        let device = rank.device().clone();
        let stream = device.create_stream().unwrap();
        let (send_elems, recv_elems) = match self.kind {
            Collective::AllGather => (elems, elems * n),
            Collective::ReduceScatter => (elems * n, elems),
            Collective::AllToAll => (elems * n, elems * n),
            _ => (elems, elems),
        };
        let op_in = self.reducing().then_some(self.op);
        let input = check::input(self.dtype, op_in, rank.rank(), n, send_elems);
        let send = device.allocate(input.len() as u64).unwrap();
        stream.write(&send, &input).unwrap();
        let recv = device
            .allocate((recv_elems * self.dtype.size()) as u64)
            .unwrap();
        if self.kind == Collective::AllGather && self.in_place {
            let bytes = (elems * self.dtype.size()) as u64;
            stream
                .write(recv.slice(rank.rank() as u64 * bytes, bytes), &input)
                .unwrap();
        }
        Prepared {
            stream,
            send,
            recv,
            input,
        }
    }

    /// Rank `rank`'s call of the operation.
    fn call(&self, rank: &Rank, p: &Prepared) -> xpu_hal::Result<()> {
        let (r, root, dtype, op) = (rank.rank(), self.root, self.dtype, self.op);
        let bytes = (self.elems * dtype.size()) as u64;
        let (send, recv, stream) = (&p.send, &p.recv, &p.stream);
        match self.kind {
            Collective::AllReduce if self.in_place => {
                rank.all_reduce(send, send, dtype, op, stream)
            }
            Collective::AllReduce => rank.all_reduce(send, recv, dtype, op, stream),
            Collective::Reduce => {
                let target = if self.in_place {
                    send.whole()
                } else {
                    recv.whole()
                };
                rank.reduce(send, (r == root).then_some(target), dtype, op, root, stream)
            }
            Collective::Broadcast if self.in_place => rank.broadcast(None, send, root, stream),
            Collective::Broadcast => {
                rank.broadcast((r == root).then(|| send.whole()), recv, root, stream)
            }
            Collective::AllGather if self.in_place => {
                // The send buffer is this rank's block of the receive buffer (written
                // by `prepare`).
                rank.all_gather(recv.slice(r as u64 * bytes, bytes), recv, stream)
            }
            Collective::AllGather => rank.all_gather(send, recv, stream),
            Collective::ReduceScatter if self.in_place => {
                rank.reduce_scatter(send, send.slice(r as u64 * bytes, bytes), dtype, op, stream)
            }
            Collective::ReduceScatter => rank.reduce_scatter(send, recv, dtype, op, stream),
            Collective::AllToAll => rank.all_to_all(send, recv, stream),
            other => panic!("not tested here: {other}"),
        }
    }

    /// Waits for rank `rank`'s stream and counts its wrong elements.
    fn check(&self, rank: &Rank, p: &Prepared) -> usize {
        let (r, n, elems, dtype, op) = (rank.rank(), self.n, self.elems, self.dtype, self.op);
        let size = dtype.size();
        let bytes = (elems * size) as u64;
        let stream = &p.stream;
        stream.synchronize().unwrap();
        let out = if self.in_place { &p.send } else { &p.recv };
        let (got, want): (Vec<u8>, Vec<u8>) = match self.kind {
            Collective::AllReduce => (
                stream.read(out).unwrap(),
                check::reduced(dtype, op, n, elems),
            ),
            Collective::Reduce if r != self.root => return 0,
            Collective::Reduce => (
                stream.read(out).unwrap(),
                check::reduced(dtype, op, n, elems),
            ),
            Collective::Broadcast => (
                stream.read(out).unwrap(),
                check::input(dtype, None, self.root, n, elems),
            ),
            Collective::AllGather => (
                stream.read(&p.recv).unwrap(),
                (0..n)
                    .flat_map(|q| check::input(dtype, None, q, n, elems))
                    .collect(),
            ),
            Collective::ReduceScatter => {
                let all = check::reduced(dtype, op, n, elems * n);
                let got = if self.in_place {
                    stream.read(p.send.slice(r as u64 * bytes, bytes)).unwrap()
                } else {
                    stream.read(&p.recv).unwrap()
                };
                (got, all[r * elems * size..(r + 1) * elems * size].to_vec())
            }
            Collective::AllToAll => (
                stream.read(&p.recv).unwrap(),
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
    }
}

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
    run_rooted(comm, kind, dtype, op, elems, in_place, comm.size() - 1)
}

/// [`run`] with `root` the root of a reduce or broadcast (the last rank in `run`).
pub fn run_rooted(
    comm: &Communicator,
    kind: Collective,
    dtype: DType,
    op: ReduceOp,
    elems: usize,
    in_place: bool,
    root: usize,
) -> Vec<usize> {
    let mut case = Case::new(comm, kind, dtype, op, elems, in_place);
    case.root = root;
    std::thread::scope(|s| {
        let handles: Vec<_> = comm
            .ranks()
            .into_iter()
            .map(|rank| {
                s.spawn(move || {
                    let p = case.prepare(&rank);
                    case.call(&rank, &p)
                        .unwrap_or_else(|e| panic!("rank {} {kind}: {e}", rank.rank()));
                    case.check(&rank, &p)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs `kind` with every rank called in turn from this thread, in a group
/// ([`Communicator::grouped`]); with `busy`, each rank's stream is held by a gate until
/// every call has returned (so no call could have waited for the operation to run).
/// Returns the number of wrong elements per rank.
pub fn run_grouped(
    comm: &Communicator,
    kind: Collective,
    dtype: DType,
    op: ReduceOp,
    elems: usize,
    in_place: bool,
    busy: bool,
) -> Vec<usize> {
    let case = Case::new(comm, kind, dtype, op, elems, in_place);
    let ranks = comm.ranks();
    let prepared: Vec<Prepared> = ranks.iter().map(|r| case.prepare(r)).collect();
    let release = Arc::new(AtomicBool::new(!busy));
    if busy {
        for (r, p) in ranks.iter().zip(&prepared) {
            let gate = gate(r.device(), release.clone());
            p.stream
                .launch(&gate, xpu_hal::LaunchDims::linear(1, 1), &[])
                .unwrap();
        }
    }
    comm.grouped(|| {
        for (r, p) in ranks.iter().zip(&prepared) {
            case.call(r, p)?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("grouped {kind}: {e}"));
    release.store(true, Ordering::Release);
    ranks
        .iter()
        .zip(&prepared)
        .map(|(r, p)| case.check(r, p))
        .collect()
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
