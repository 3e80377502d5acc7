//! The step between processes of one machine through shared memory: when every process
//! of a communicator runs on one machine, they also share a step exchange
//! ([`xpu_hal::shm::Exchange`], one party per process) set up through the transport when
//! the communicator forms.
//!
//! Every operation's step between processes then runs in the exchange, with no message
//! at all, and every step carries the operation's header: processes that called
//! different operations are told at once (a desync), as the headers of MPI messages tell
//! them. An all-reduce copies a chunk of each process's data into its slot, posts, and
//! reduces every process's slot, in process order, into its own data, so every process
//! ends with the same bits. The other operations move their messages through the slots
//! (`between.rs`'s `shm_swap`): a process sending the same bytes to every other writes
//! them once per step, one sending each its own bytes writes each a part of its slot, and
//! steps go on while any process posts that it has more.
//!
//! A process that gives up on the communicator marks itself broken in the exchange, and
//! every wait of every other process ends at once; a process that stalls or dies is
//! named at the deadline. The exchange is formed only when every process could map it;
//! otherwise (or with `XPU_COLL_SHM=off`) everything goes over the transport.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xpu_hal::shm::{Backoff, Exchange, Stopped, Until, Words};
use xpu_hal::{Error, Result};

use super::{share_from_first, swap_with_all, Incomplete, Peers, ProcessInfo};

/// The tags of the exchanges that set it up (the name's length and bytes take two).
const NAME_TAG: u32 = (1 << 21) + 2;
const AGREE_TAG: u32 = (1 << 21) + 4;

/// The first bytes of the segments' names.
const PREFIX: &str = "xpu-coll-";

/// Bytes of each process's slot per step (each slot holds two, for steps by turns): an
/// all-reduce moves at most this much per step.
pub(crate) const SLOT: usize = 256 << 10;

/// The processes' step exchange.
pub(crate) struct NodeShm {
    ex: Exchange,
    /// This process's party, every party, and every other one (what each step waits
    /// for, made once).
    me: usize,
    all: Vec<usize>,
    others: Vec<usize>,
    /// Looks a waiter spins before it yields its core: many when each process can have
    /// a core of its own (as MPI's own waits), few when they cannot
    /// ([`super::cores`]).
    spins: u32,
    /// The next step's number (steps start at 1; every process numbers them alike).
    next: AtomicU64,
}

/// Whether this process would share memory with the others of its machine:
/// `XPU_COLL_SHM` leaves it on (the default).
pub(crate) fn willing() -> bool {
    !std::env::var("XPU_COLL_SHM").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "off" | "0" | "false"
        )
    })
}

impl NodeShm {
    /// The exchange of `procs`, when they all run on one machine, all are `willing`,
    /// and every one of them maps it; `None` otherwise. `fitting`: whether each process
    /// can have a core of its own. Fails only when the set-up's messages fail.
    pub(crate) fn form(
        peers: &dyn Peers,
        procs: &[ProcessInfo],
        willing: &[bool],
        fitting: bool,
        timeout: Duration,
        failed: &dyn Fn(&str, Incomplete) -> Error,
    ) -> Result<Option<NodeShm>> {
        let n = peers.count();
        let me = peers.index();
        if n < 2 || procs.iter().any(|p| p.host != procs[0].host) || !willing.iter().all(|&w| w) {
            return Ok(None);
        }
        let deadline = Instant::now() + timeout;
        let name = if me == 0 {
            Exchange::fresh_name(PREFIX)
                .to_str()
                .map(|p| p.as_bytes().to_vec())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let name = share_from_first(peers, NAME_TAG, name, deadline)
            .map_err(|e| failed("the name of their shared memory", e))?;
        let path = std::str::from_utf8(&name)
            .ok()
            .map(std::path::PathBuf::from)
            .filter(|p| Exchange::is_fresh_name(p, PREFIX));
        let Some(path) = path else {
            return Ok(None);
        };
        // Every process is here already (the description exchange just ended): joining
        // takes milliseconds, and a process that cannot map it costs the others at most
        // this bound.
        // Two halves per slot: a process may fill the next step while the others read one.
        let joined = Exchange::join(
            &path,
            n,
            2 * SLOT,
            &[me],
            timeout.min(Duration::from_secs(30)),
        );
        if let Err(e) = &joined {
            tracing::debug!(error = %e, "no shared memory between the processes; their steps go over the transport");
        }
        let all = swap_with_all(
            peers,
            AGREE_TAG,
            vec![u8::from(joined.is_ok())],
            vec![1; n],
            Instant::now() + timeout,
        )
        .map_err(|e| failed("whether they mapped their shared memory", e))?;
        let agreed = all.iter().enumerate().all(|(q, b)| q == me || b == &[1]);
        match joined {
            Ok(ex) if agreed => Ok(Some(NodeShm {
                ex,
                me,
                all: (0..n).collect(),
                others: (0..n).filter(|&q| q != me).collect(),
                spins: super::cores::spins(fitting),
                next: AtomicU64::new(1),
            })),
            _ => Ok(None),
        }
    }

    /// The processes (parties) of the exchange.
    pub(crate) fn parties(&self) -> usize {
        self.all.len()
    }

    /// Marks this process broken, for `why`: every other process's wait ends.
    pub(crate) fn give_up(&self, why: super::GiveUp) {
        self.ex.set_broken(self.me, why as u64);
    }

    /// One step: waits until this process's half of its slot for the step is free
    /// (every process is done with the step two before: the slots are double-buffered,
    /// so a process may fill a step while the others still read the one before), lets
    /// `fill` write it (`SLOT` bytes), posts `words`, waits for every other process's
    /// post, checks their words (all but the last, the sender and its flags, must equal
    /// this process's), lets `read` use what they posted, and marks the step done.
    pub(crate) fn step(
        &self,
        words: &Words,
        deadline: Instant,
        cancel: &dyn Fn() -> bool,
        fill: impl FnOnce(*mut u8),
        read: impl FnOnce(&Posted<'_>) -> Result<()>,
    ) -> std::result::Result<(), ShmFailure> {
        let (ex, me) = (&self.ex, self.me);
        let step = self.next.fetch_add(1, Ordering::Relaxed);
        let posted = Posted {
            ex,
            step,
            half: SLOT * (step % 2) as usize,
        };
        let patience = || Backoff::spin_then_yield(self.spins);
        ex.wait_with(
            &self.all,
            Until::Done(step.saturating_sub(2)),
            deadline,
            cancel,
            patience(),
        )
        .map_err(ShmFailure::Stopped)?;
        fill(posted.slot(me).cast_mut());
        ex.post(me, step, words);
        ex.wait_with(
            &self.others,
            Until::Posted(step),
            deadline,
            cancel,
            patience(),
        )
        .map_err(ShmFailure::Stopped)?;
        if let Some(q) = self
            .others
            .iter()
            .copied()
            .find(|&q| posted.words(q)[..7] != words[..7])
        {
            return Err(ShmFailure::Differs(q, posted.words(q)));
        }
        let result = read(&posted);
        ex.done(me, step);
        result.map_err(ShmFailure::Failed)
    }
}

/// What the processes posted for one step, as its `read` sees it.
pub(crate) struct Posted<'a> {
    ex: &'a Exchange,
    step: u64,
    /// Where the step's half of each slot starts.
    half: usize,
}

impl Posted<'_> {
    /// The step's half of process `q`'s slot: `SLOT` bytes, 64-byte aligned.
    pub(crate) fn slot(&self, q: usize) -> *const u8 {
        // SAFETY: every slot holds two halves of SLOT bytes (see `form`), and `half` is
        // the offset of one of them.
        unsafe { self.ex.slot_ptr(q).add(self.half) }.cast_const()
    }

    /// The words process `q` posted with the step.
    pub(crate) fn words(&self, q: usize) -> Words {
        self.ex.words(q, self.step)
    }
}

/// Why a step did not finish.
pub(crate) enum ShmFailure {
    /// A wait ended without the other processes.
    Stopped(Stopped),
    /// Process `q` posted other words (it called another operation).
    Differs(usize, Words),
    /// Reading the slots failed.
    Failed(Error),
}
