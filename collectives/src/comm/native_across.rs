//! The devices' own collective library across processes: when every process's devices
//! belong to one backend whose library spans processes (NCCL for CUDA; a plugin's
//! native collectives of ABI 1.4, such as HCCL's), the communicator makes one group over
//! all of them and hands it whole operations, instead of combining at a leader and
//! exchanging through host memory and MPI.
//!
//! **Forming** ([`NativeAcross::form`], while the communicator forms): each process has
//! said whether its devices offer such a library; when all do, with the same backend,
//! the first process makes the group's identifier (`ncclGetUniqueId`) and sends it to
//! the others over the communicator's transport, every process joins with its devices
//! at their ranks, and the processes then tell each other whether they joined and with
//! which library and figures. Only when every process joined with the same ones is the
//! group used; otherwise every process drops it and the communicator runs its own
//! algorithms — a library missing in one process costs at most the timeout, never a
//! hang.
//!
//! **Choosing**: an operation goes to the library where `XPU_COLL_ALGO` forces `native`
//! for it, and where no override names it, when the library's stated figures beat the
//! model of the exchange between processes over the slowest link between them (a
//! library that states none is preferred). Every process decides from the same agreed
//! figures and the same shared topology, so all choose alike.
//!
//! **Running**: every rank checks its arguments against the whole communicator; the
//! process's ranks meet (the last to arrive hands all their parts to the group in one
//! call), and each rank's work is then on its stream as with any other operation. A
//! rank that refuses its arguments fails the communicator in every process: the group
//! is aborted, so the other processes' parts fail instead of waiting.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use xpu_hal::group::{CollectiveGroup, GroupAcross, GroupConfig, GroupOp, GroupPart};
use xpu_hal::{Device, Error, Result, Stream};

use super::op::Collective;
use super::select::NativeFigures;
use super::transport::Slice;
use crate::process::{share_from_first, swap_with_all, Incomplete, Peers};
use crate::topology::Topology;

/// The tags of the exchanges that form the group (the identifier's length and bytes
/// take two).
const ID_TAG: u32 = (1 << 21) + 12;
const AGREE_TAG: u32 = (1 << 21) + 14;

/// A group of the devices' own library over every process's ranks.
pub(crate) struct NativeAcross {
    group: Box<dyn CollectiveGroup>,
    /// Its figures, the same in every process.
    pub figures: NativeFigures,
    /// This process's ranks.
    local: usize,
    meet: Mutex<HashMap<u64, Meeting>>,
    met: Condvar,
}

/// One rank's part as it waits to be handed over: its stream and ranges.
type HeldPart = (Stream, Option<Slice>, Option<Slice>);

/// One operation's parts from this process's ranks, until the last hands them over.
#[derive(Default)]
struct Meeting {
    op: Option<GroupOp>,
    parts: Vec<Option<HeldPart>>,
    arrived: usize,
    /// The group's answer, once it was called (or why it was not).
    result: Option<Result<()>>,
    /// Ranks that took the answer.
    taken: usize,
}

/// What a process offers: its devices' backend when its library spans processes.
pub(crate) fn offer(devices: &[Device]) -> Option<String> {
    xpu_hal::group::spans_processes(devices).then(|| devices[0].backend().to_string())
}

impl NativeAcross {
    /// The group over every process's devices, when every process offers the same
    /// library (`offers`, per process) and all join; `None` otherwise. Fails only when
    /// the exchanges with the other processes fail.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn form(
        peers: &dyn Peers,
        offers: &[Option<String>],
        devices: &[Device],
        first_rank: usize,
        size: usize,
        timeout: Duration,
        failed: &dyn Fn(&str, Incomplete) -> Error,
    ) -> Result<Option<NativeAcross>> {
        let me = peers.index();
        let n = peers.count();
        let Some(Some(backend)) = offers.first() else {
            return Ok(None);
        };
        if size < 2
            || offers
                .iter()
                .any(|o| o.as_deref() != Some(backend.as_str()))
        {
            return Ok(None);
        }
        let deadline = Instant::now() + timeout;
        // The first process makes the identifier; an empty one means it could not.
        let id = if me == 0 {
            xpu_hal::group::group_id(&devices[0]).unwrap_or_else(|e| {
                tracing::debug!(error = %e, "no identifier for the devices' own library across processes; the xpu algorithms run");
                Vec::new()
            })
        } else {
            Vec::new()
        };
        let id = share_from_first(peers, ID_TAG, id, deadline)
            .map_err(|e| failed("the library's identifier", e))?;
        if id.is_empty() {
            return Ok(None);
        }
        if id.len() > GroupAcross::MAX_ID {
            return Err(Error::invalid(format!(
                "process 0 sent a library identifier of {} bytes; is it running the same program?",
                id.len()
            )));
        }
        let across = GroupAcross {
            id,
            size,
            ranks: (first_rank..first_rank + devices.len()).collect(),
        };
        let joined =
            xpu_hal::group::collective_group_across(devices, &across, GroupConfig { timeout });
        // Every process says whether it joined, and with which library and figures:
        // the group is used only when all agree.
        let mine = match &joined {
            Ok(g) => {
                let f = NativeFigures::of(g.as_ref());
                format!("ok {} {:?}", f.library, f.cost)
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not join the devices' own library across processes; the xpu algorithms run");
                "failed".to_string()
            }
        };
        let mine = mine.into_bytes();
        let mut padded = mine.clone();
        padded.resize(256, 0);
        let all = swap_with_all(
            peers,
            AGREE_TAG,
            padded.clone(),
            vec![256; n],
            Instant::now() + timeout,
        )
        .map_err(|e| failed("whether they joined the library's group", e))?;
        let agreed = all
            .iter()
            .enumerate()
            .all(|(q, theirs)| q == me || *theirs == padded)
            && mine.starts_with(b"ok ");
        match joined {
            Ok(group) if agreed => {
                let figures = NativeFigures::of(group.as_ref());
                tracing::info!(library = %figures.library, "the devices' own library spans the communicator's processes");
                Ok(Some(NativeAcross {
                    local: devices.len(),
                    figures,
                    group,
                    meet: Mutex::new(HashMap::new()),
                    met: Condvar::new(),
                }))
            }
            Ok(group) => {
                tracing::debug!("the processes did not all join the devices' own library alike; the xpu algorithms run");
                group.abort();
                Ok(None)
            }
            Err(_) => Ok(None),
        }
    }

    /// The library's name and version.
    pub(crate) fn library(&self) -> String {
        self.figures.library.clone()
    }

    /// Fails every part of the group that waits or has not run, in this process.
    pub(crate) fn abort(&self) {
        self.group.abort();
        self.met.notify_all();
    }

    /// Whether `kind` on `bytes` per rank goes to the library rather than the exchange
    /// between processes over `topology` (every process's ranks, `firsts` the first
    /// rank of each process). `forced`: the algorithm `XPU_COLL_ALGO` names for it.
    pub(crate) fn chosen(
        &self,
        kind: Collective,
        bytes: u64,
        size: usize,
        forced: Option<super::Algorithm>,
        topology: &Topology,
        firsts: &[usize],
    ) -> bool {
        if matches!(kind, Collective::Barrier | Collective::SendRecv) {
            return false;
        }
        if let Some(a) = forced {
            return a == super::Algorithm::Native;
        }
        let Some((alpha, beta)) = self.figures.cost else {
            return true;
        };
        let (s, n) = (bytes as f64, size as f64);
        let whole = match kind {
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => n * s,
            _ => s,
        };
        let native = alpha + whole * kind.bus_factor(size) * beta;
        native <= own_estimate(kind, bytes, topology, firsts)
    }

    /// This rank's part of operation `seq` (the `index`-th of this process's ranks):
    /// handed to the group with the others' once all of this process's ranks have
    /// arrived, waiting at most `timeout` for them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        index: usize,
        seq: u64,
        op: GroupOp,
        stream: &Stream,
        send: Option<xpu_hal::BufferSlice<'_>>,
        recv: Option<xpu_hal::BufferSlice<'_>>,
        timeout: Duration,
    ) -> Result<()> {
        if self.local == 1 {
            let part = GroupPart { stream, send, recv };
            return self.group.run(op, std::slice::from_ref(&part));
        }
        let mut meet = self.meet.lock().unwrap_or_else(|p| p.into_inner());
        let m = meet.entry(seq).or_default();
        if m.parts.is_empty() {
            m.parts = (0..self.local).map(|_| None).collect();
        }
        match m.op {
            Some(theirs) if theirs != op => {
                m.result.get_or_insert_with(|| {
                    Err(Error::invalid(format!(
                        "the ranks of this process called different operations as operation {seq} ({theirs:?} and {op:?}); every rank must make the same calls in the same order"
                    )))
                });
            }
            _ => m.op = Some(op),
        }
        m.parts[index] = Some((
            stream.clone(),
            send.as_ref().map(Slice::from_buffer),
            recv.as_ref().map(Slice::from_buffer),
        ));
        m.arrived += 1;
        if m.arrived == self.local && m.result.is_none() {
            let parts: Vec<GroupPart<'_>> = m
                .parts
                .iter()
                .flatten()
                .map(|(stream, send, recv)| GroupPart {
                    stream,
                    send: send.as_ref().map(Slice::buf),
                    recv: recv.as_ref().map(Slice::buf),
                })
                .collect();
            let result = if parts.len() == self.local {
                self.group.run(op, &parts)
            } else {
                Err(Error::backend_message(
                    "collectives",
                    "internal error: a rank's part went missing",
                ))
            };
            drop(parts);
            m.result = Some(result);
            self.met.notify_all();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let m = meet.get_mut(&seq).ok_or_else(|| {
                Error::backend_message("collectives", "internal error: an operation vanished")
            })?;
            if let Some(result) = &m.result {
                let result = result.clone();
                m.taken += 1;
                if m.taken >= self.local {
                    meet.remove(&seq);
                }
                return result;
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> =
                    (0..self.local).filter(|&i| m.parts[i].is_none()).collect();
                let error = Error::Timeout {
                    message: format!(
                        "waited {:.1} s for this process's ranks {missing:?} (by place among its devices) to call operation {seq}; every rank must make the same calls",
                        timeout.as_secs_f64()
                    ),
                };
                m.result = Some(Err(error.clone()));
                m.taken += 1;
                self.met.notify_all();
                return Err(error);
            }
            meet = self
                .met
                .wait_timeout(meet, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// The model of the communicator's own exchange between processes, in µs: the leaders'
/// steps over the slowest link between consecutive processes (α latency, β µs per
/// byte), `p` processes. The steps within each process come on top and are left out,
/// which favours the own algorithms slightly.
fn own_estimate(kind: Collective, bytes: u64, topology: &Topology, firsts: &[usize]) -> f64 {
    let p = firsts.len().max(1);
    let (mut alpha, mut beta) = (0.0f64, 0.0f64);
    for w in firsts.windows(2) {
        for (a, b) in [(w[0], w[1]), (w[1], w[0])] {
            if let Ok(l) = topology.link(a, b) {
                alpha = alpha.max(l.latency_us);
                beta = beta.max(1.0 / (l.bandwidth_gbps.max(1e-9) * 1e3));
            }
        }
    }
    let (s, pf) = (bytes as f64, p as f64);
    let rounds = (p as f64).log2().ceil().max(1.0);
    match kind {
        Collective::AllReduce => 2.0 * rounds * alpha + 2.0 * (pf - 1.0) / pf * s * beta,
        Collective::Reduce | Collective::Broadcast => rounds * (alpha + s * beta),
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            (pf - 1.0) * (alpha + s * beta)
        }
        Collective::Barrier | Collective::SendRecv => rounds * alpha,
    }
}
