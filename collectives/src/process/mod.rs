//! Communicators across processes: the engine between processes and the arithmetic of
//! the steps that cross them.
//!
//! A communicator that spans processes ([`crate::Communicator::from_mpi`]) runs each
//! operation in up to three steps, as NCCL and MPI libraries do between nodes:
//!
//! 1. **within the process**: the process's own ranks combine their data at one of them,
//!    the *leader* (the root's rank in the root's process, the first local rank
//!    elsewhere), with the in-process algorithms;
//! 2. **between processes**: the leader brings the combined data to host memory and
//!    exchanges it with the other processes' leaders ([`between`]), over [`Peers`]: the
//!    transport between processes (MPI, [`mpi`]) — or, when every process runs on one
//!    machine, through a segment of shared memory they all map ([`node_shm`]);
//! 3. **within the process again**: the leader hands the result to its process's other
//!    ranks with the in-process algorithms.
//!
//! Every message between processes is preceded by a header that names the operation, its
//! number and its size ([`wire`]), so processes that disagree on what they call are told
//! so (a *desync*) instead of exchanging the wrong bytes. Reductions between processes
//! combine the processes' partial results in process order, so every process ends with
//! the same bits. Where every process's devices have a collective library that spans
//! processes, an operation chosen for it skips these steps: each process's ranks hand
//! their parts to one group over all processes (`comm/native_across.rs`). Every wait
//! between processes has a deadline (the communicator's
//! timeout): a process that stalls or dies is named on the others, with its host, its
//! process id and its devices.

pub(crate) mod between;
pub(crate) mod cores;
pub mod links;
#[cfg(test)]
pub(crate) mod loopback;
#[cfg(feature = "mpi")]
pub mod mpi;
pub(crate) mod node_shm;
pub(crate) mod wire;

use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// One process of a communicator that spans processes, as the others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The process's index among the communicator's processes (its MPI rank).
    pub index: usize,
    /// The host it runs on.
    pub host: String,
    /// Its operating-system process id.
    pub pid: u32,
    /// The communicator rank of its first device; its ranks are consecutive.
    pub first_rank: usize,
    /// Its devices, in rank order.
    pub devices: Vec<String>,
}

impl ProcessInfo {
    /// How many ranks the process holds.
    pub fn ranks(&self) -> usize {
        self.devices.len()
    }

    /// A description for messages: "process 1 (host h, pid 42, ranks 2–3: host:0, host:1)".
    pub fn describe(&self) -> String {
        let ranks = match self.devices.len() {
            0 => "no ranks".to_string(),
            1 => format!("rank {}", self.first_rank),
            n => format!("ranks {}–{}", self.first_rank, self.first_rank + n - 1),
        };
        format!(
            "process {} (host {}, pid {}, {ranks}: {})",
            self.index,
            self.host,
            self.pid,
            self.devices.join(", ")
        )
    }
}

/// How messages name process `p` of `procs`: its description, or its index alone when
/// it is not among them.
pub(crate) fn process_name(procs: &[ProcessInfo], p: usize) -> String {
    procs
        .get(p)
        .map_or_else(|| format!("process {p}"), ProcessInfo::describe)
}

/// Why a process gave up on a communicator, as it tells the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GiveUp {
    /// The application aborted it.
    Aborted = 1,
    /// Processes called different operations.
    Desync = 2,
    /// Another process did not come in time.
    Timeout = 3,
    /// A rank of the process passed invalid arguments.
    Refused = 4,
    /// A transfer or a device failed.
    Failed = 5,
}

// Received codes are decoded by the transports (MPI's, behind its feature).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
impl GiveUp {
    /// Every reason, by its code.
    pub const ALL: [GiveUp; 5] = [
        GiveUp::Aborted,
        GiveUp::Desync,
        GiveUp::Timeout,
        GiveUp::Refused,
        GiveUp::Failed,
    ];

    /// The reason of a received code (a failure for an unknown one).
    pub fn from_code(code: u64) -> GiveUp {
        GiveUp::ALL
            .into_iter()
            .find(|g| *g as u64 == code)
            .unwrap_or(GiveUp::Failed)
    }

    /// The reason, in words.
    pub fn says(self) -> &'static str {
        match self {
            GiveUp::Aborted => "the application aborted it",
            GiveUp::Desync => "it found that the processes called different operations (a desync)",
            GiveUp::Timeout => "another process did not come in time",
            GiveUp::Refused => "one of its ranks passed invalid arguments",
            GiveUp::Failed => "a transfer or a device failed there",
        }
    }
}

/// Why an exchange between processes did not complete (made by the transports: MPI's
/// is behind its feature).
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) enum Incomplete {
    /// The deadline passed with transfers to or from these processes unfinished.
    Deadline { peers: Vec<usize> },
    /// Another process gave up on the communicator, for the reason it sent.
    Aborted { by: usize, why: GiveUp },
    /// This process's communicator was aborted while it waited.
    AbortedHere,
    /// The transport reported an error on a transfer with `peer`; `settled` when every
    /// other transfer of the exchange has finished (its buffers are free again).
    Failed {
        peer: usize,
        message: String,
        settled: bool,
    },
}

/// The tag of the exchanges that set a communicator across processes up.
pub(crate) const SETUP_TAG: u32 = (1 << 21) + 1;

/// The first tag of the rounds in which the survivors of a failure agree on who they
/// are (two per shrink of a communicator).
pub(crate) const SHRINK_TAGS: u32 = (1 << 21) + 16;

/// Byte transfers between the processes of a communicator: the engine under
/// [`between`]'s algorithms. Sends never wait for their receive to be posted.
pub(crate) trait Peers: Send + Sync {
    /// This process's index.
    fn index(&self) -> usize;

    /// The number of processes.
    fn count(&self) -> usize;

    /// Posts every send and receive of `tag` and waits for all of them until
    /// `deadline`, or until `abort` is set or another process aborts.
    ///
    /// # Safety
    ///
    /// When it returns an error, the transport may go on reading the sends and writing
    /// the receives: the caller must never free, reuse or read those buffers again.
    unsafe fn exchange(
        &self,
        tag: u32,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<(), Incomplete>;

    /// Sends `data` to process `peer` under `tag` and returns at once; the transport
    /// owns the bytes until they are delivered.
    fn post(&self, tag: u32, peer: usize, data: Vec<u8>) -> Result<(), Incomplete>;

    /// Receives the oldest message of `tag` from process `peer` into `data`, which must
    /// be exactly as long, waiting until `deadline`.
    fn receive(
        &self,
        tag: u32,
        peer: usize,
        data: &mut Vec<u8>,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<(), Incomplete>;

    /// Tells every other process that this process gave up on the communicator, and
    /// why, without waiting.
    fn abort_others(&self, why: GiveUp);

    /// Tells the transport whether this machine's processes can each have a core of
    /// their own ([`cores`]): how long its waits spin before they yield their core.
    fn set_fitting(&self, _fitting: bool) {}

    /// After a failure: sends `mine` to each process of `with` and receives as many
    /// bytes from each, under `tag`, until `deadline`, heeding no abort (the processes of
    /// a failed communicator have aborted it). As each process's bytes arrive,
    /// `arrived(process, bytes)` names the processes of `with` no longer waited for.
    /// Per process of `with`, its bytes, or `None` when they did not come in time (or
    /// were no longer waited for).
    fn swap_after_failure(
        &self,
        tag: u32,
        mine: &[u8],
        with: &[usize],
        deadline: Instant,
        arrived: &mut dyn FnMut(usize, &[u8]) -> Vec<usize>,
    ) -> Vec<Option<Vec<u8>>>;

    /// A fresh transport over the processes `keep` (their indices here, in order, this
    /// one among them), made by those processes alone — the others may be dead — whose
    /// messages never meet this one's. Every process of `keep` calls it with the same
    /// list.
    fn subset(&self, keep: &[usize]) -> xpu_hal::Result<Box<dyn Peers>>;
}

/// Sends `mine` to every other process and receives `sizes[q]` bytes from each process
/// `q`; the result holds each process's bytes (empty for this one). On a failure the
/// buffers are leaked: the transport may still use them.
pub(crate) fn swap_with_all(
    peers: &dyn Peers,
    tag: u32,
    mine: Vec<u8>,
    sizes: Vec<usize>,
    deadline: Instant,
) -> std::result::Result<Vec<Vec<u8>>, Incomplete> {
    let me = peers.index();
    let mut theirs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(q, &len)| if q == me { Vec::new() } else { vec![0; len] })
        .collect();
    let sends: Vec<(usize, &[u8])> = (0..sizes.len())
        .filter(|&q| q != me)
        .map(|q| (q, &mine[..]))
        .collect();
    let mut recvs: Vec<(usize, &mut [u8])> = theirs
        .iter_mut()
        .enumerate()
        .filter(|(q, _)| *q != me)
        .map(|(q, b)| (q, &mut b[..]))
        .collect();
    let never = AtomicBool::new(false);
    // SAFETY: on an error the buffers are leaked below, never freed.
    let done = unsafe { peers.exchange(tag, &sends, &mut recvs, deadline, &never) };
    drop((sends, recvs));
    match done {
        Ok(()) => Ok(theirs),
        Err(e) => {
            std::mem::forget(theirs);
            std::mem::forget(mine);
            Err(e)
        }
    }
}

/// Sends `mine` (from the first process; empty elsewhere) to every other process under
/// `tag`: every process returns the first process's bytes (lengths first, so that any
/// length up to 1 MiB goes).
pub(crate) fn share_from_first(
    peers: &dyn Peers,
    tag: u32,
    mine: Vec<u8>,
    deadline: Instant,
) -> std::result::Result<Vec<u8>, Incomplete> {
    let n = peers.count();
    let me = peers.index();
    let len = (mine.len() as u64).to_le_bytes().to_vec();
    let lens = swap_with_all(peers, tag, len, vec![8; n], deadline)?;
    let first = if me == 0 {
        mine.len()
    } else {
        let bytes: [u8; 8] = lens[0].as_slice().try_into().unwrap_or([0; 8]);
        usize::try_from(u64::from_le_bytes(bytes))
            .unwrap_or(usize::MAX)
            .min(1 << 20)
    };
    let sizes: Vec<usize> = (0..n).map(|q| if q == 0 { first } else { 0 }).collect();
    let mine = if me == 0 { mine } else { Vec::new() };
    let got = swap_with_all(peers, tag + 1, mine.clone(), sizes, deadline)?;
    Ok(if me == 0 {
        mine
    } else {
        got.into_iter().next().unwrap_or_default()
    })
}
