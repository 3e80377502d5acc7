//! `simccl`: the simulated NPU's own collective library (ABI 1.3 native collectives),
//! standing in for HCCL, CNCL or BKCL so that the host's provider path runs on a real
//! plugin.
//!
//! An operation is one [`Exchange`] shared by its ranks' parts. Each part is a job on
//! its rank's stream, so it runs in order with the stream's other work. When it runs,
//! it copies what it contributes (its send range, or for a broadcast the root's data)
//! into the exchange, waits until every rank it needs has contributed, and then writes
//! its own result, computed from those copies in rank order with the HAL's reference
//! arithmetic (`xpu_hal::reference`), so every rank receives the same bits and in-place
//! operations need no care. Its stream's cost is the device's copy time for the bytes
//! it writes.
//!
//! Failures: a part that waits longer than the group's timeout fails with `Timeout`
//! naming the ranks it waited for; a part that never runs (its stream had failed, its
//! device was lost, its stream was destroyed) marks the exchange failed when it is
//! dropped, and its peers fail with `Aborted` naming its rank; [`Group::abort`] fails
//! every part that waits or has not run yet, now and later.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xpu_hal::reference::{self as reference, Element};
use xpu_hal::BinaryOp;
use xpu_plugin_sdk::{
    BufferRange, CollectiveOp, DType, Error, Group, GroupCall, GroupConfig, GroupPart, NewGroup,
    Result,
};

use crate::arena::Buffer;
use crate::config::SimConfig;
use crate::ops::{view, view_mut};
use crate::std_ops::hal_dtype;
use crate::SimNpu;

/// How long a part waits for its peers when the host gives no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A group over simulated devices.
pub struct SimGroup {
    shared: Arc<Shared>,
    config: SimConfig,
}

struct Shared {
    size: usize,
    timeout: Duration,
    /// `plugin.simnpu:0,1`, for messages.
    name: String,
    state: Mutex<State>,
    /// Signalled when a part contributes, fails or finishes, and on abort.
    changed: Condvar,
    /// Word buffers of finished operations, for the next ones' copies.
    pool: Mutex<Vec<Vec<u64>>>,
}

#[derive(Default)]
struct State {
    /// The number the next operation gets.
    next: u64,
    /// Operations some rank has not finished, by number.
    exchanges: HashMap<u64, Exchange>,
    /// Why the group was aborted, once it was.
    aborted: Option<String>,
    /// Parts running now (between their start and their end on their stream).
    running: usize,
}

/// One operation's meeting point.
struct Exchange {
    /// What each rank contributed, once it has.
    copies: Vec<Option<Arc<Words>>>,
    /// The first rank whose part failed or never ran, and why.
    failed: Option<(usize, String)>,
    /// Ranks done with the operation (finished, failed or dropped).
    finished: usize,
    /// Set once every rank's part is enqueued; parts wait for it before they start,
    /// so that a failure to enqueue a later part can still cancel them.
    enqueued: bool,
    /// Set when enqueueing failed part-way: the parts already enqueued do nothing.
    cancelled: bool,
}

/// Bytes in 8-byte words, so that any element type can be read from them in place.
struct Words {
    words: Vec<u64>,
    len: usize,
}

/// Word buffers kept for reuse, so that large operations do not fault fresh pages in
/// every time.
const POOLED: usize = 8;

impl Words {
    /// A copy of `bytes`, in a buffer from `pool` when one is large enough.
    fn of(bytes: &[u8], pool: &Mutex<Vec<Vec<u64>>>) -> Words {
        let need = bytes.len().div_ceil(8);
        let reused = {
            let mut pool = pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.iter()
                .position(|w| w.len() >= need)
                .map(|i| pool.swap_remove(i))
        };
        let mut words = reused.unwrap_or_else(|| vec![0u64; need]);
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Words {
            words,
            len: bytes.len(),
        }
    }

    /// Gives the buffer back to `pool`, which keeps the largest few.
    fn recycle(self, pool: &Mutex<Vec<Vec<u64>>>) {
        let mut pool = pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.push(self.words);
        if pool.len() > POOLED {
            pool.sort_by_key(|w| std::cmp::Reverse(w.len()));
            pool.truncate(POOLED);
        }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SimGroup {
    /// A group over `devices` (checked by the SDK: distinct open devices).
    pub(crate) fn create(
        devices: &[&crate::SimDevice],
        config: SimConfig,
        group: GroupConfig,
    ) -> Result<NewGroup<SimNpu>> {
        if !config.ccl {
            return Err(Error::unsupported(
                "simccl is turned off (XPU_SIMNPU_CCL=off); the host's own algorithms run",
            ));
        }
        let name = devices
            .iter()
            .map(|d| d.index().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let shared = Arc::new(Shared {
            size: devices.len(),
            timeout: group.timeout.unwrap_or(DEFAULT_TIMEOUT),
            name: format!("simccl over plugin.simnpu:{name}"),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            pool: Mutex::new(Vec::new()),
        });
        Ok(described(Box::new(SimGroup { shared, config }), &config))
    }
}

/// The library's name and version, as the host reports it.
const LIBRARY: &std::ffi::CStr = c"simccl 1.0";

/// `group` as the host is told of it: simccl, with the figures `config` states.
pub(crate) fn described(group: Box<dyn Group<SimNpu>>, config: &SimConfig) -> NewGroup<SimNpu> {
    NewGroup {
        group,
        library: LIBRARY,
        latency: config.ccl_cost.map(|(l, _)| l),
        bus_bytes_per_s: config.ccl_cost.map(|(_, b)| b as u64),
    }
}

impl Group<SimNpu> for SimGroup {
    fn run(&self, call: GroupCall, parts: Vec<GroupPart<'_, SimNpu>>) -> Result<()> {
        let seq = {
            let mut st = lock(&self.shared.state);
            if let Some(why) = &st.aborted {
                return Err(Error::aborted(format!("{}: {why}", self.shared.name)));
            }
            let seq = st.next;
            st.next += 1;
            st.exchanges.insert(
                seq,
                Exchange {
                    copies: vec![None; self.shared.size],
                    failed: None,
                    finished: 0,
                    enqueued: false,
                    cancelled: false,
                },
            );
            seq
        };
        // Until every part is enqueued, leaving early (a refused part, or a panic)
        // cancels the operation: see `Enqueueing`.
        let mut enqueueing = Enqueueing {
            shared: &self.shared,
            seq,
            made: 0,
            done: false,
        };
        for (rank, p) in parts.into_iter().enumerate() {
            let written = p.recv.as_ref().map_or(0, |r| r.length);
            let part = Part {
                shared: self.shared.clone(),
                seq,
                rank,
                call,
                send: p.send,
                recv: p.recv,
                done: false,
            };
            enqueueing.made += 1;
            p.stream
                .run(self.config.copy_time(written), move || part.run())?;
        }
        enqueueing.done = true;
        if let Some(x) = lock(&self.shared.state).exchanges.get_mut(&seq) {
            x.enqueued = true;
        }
        self.shared.changed.notify_all();
        Ok(())
    }

    fn abort(&self) {
        let mut st = lock(&self.shared.state);
        st.aborted
            .get_or_insert_with(|| "the group was aborted".to_string());
        self.shared.changed.notify_all();
    }
}

impl Drop for SimGroup {
    /// `group_destroy`: lets the operations already enqueued finish (for at most the
    /// group's timeout, and not at all after an abort), fails the parts that still have
    /// not started, as an abort would, and returns once no part runs any more.
    fn drop(&mut self) {
        let shared = &self.shared;
        let mut st = lock(&shared.state);
        let deadline = Instant::now() + shared.timeout;
        while st.aborted.is_none() && !st.exchanges.is_empty() && Instant::now() < deadline {
            st = shared
                .changed
                .wait_timeout(st, Duration::from_millis(20))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        st.aborted
            .get_or_insert_with(|| "the group was destroyed".to_string());
        shared.changed.notify_all();
        while st.running > 0 {
            st = shared
                .changed
                .wait_timeout(st, Duration::from_millis(20))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// An operation whose parts are being enqueued. Dropped before `done`, it cancels the
/// operation: the parts already enqueued find it cancelled and do nothing; every part
/// made counts itself finished (when it runs, or when it is dropped unrun), and the
/// ones never made are counted here.
struct Enqueueing<'a> {
    shared: &'a Shared,
    seq: u64,
    made: usize,
    done: bool,
}

impl Drop for Enqueueing<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let size = self.shared.size;
        let mut st = lock(&self.shared.state);
        if let Some(x) = st.exchanges.get_mut(&self.seq) {
            x.cancelled = true;
            x.finished += size.saturating_sub(self.made);
            if x.finished >= size {
                st.exchanges.remove(&self.seq);
            }
        }
        self.shared.changed.notify_all();
    }
}

/// One rank's part of one operation: the job on its stream.
struct Part {
    shared: Arc<Shared>,
    seq: u64,
    rank: usize,
    call: GroupCall,
    send: Option<BufferRange<Buffer>>,
    recv: Option<BufferRange<Buffer>>,
    /// Set once the part has finished one way or the other; a part dropped without it
    /// never ran, and fails its peers.
    done: bool,
}

/// Counts a part as running while it lives.
struct Running<'a>(&'a Shared);

impl<'a> Running<'a> {
    fn start(shared: &'a Shared) -> Self {
        lock(&shared.state).running += 1;
        Running(shared)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).running -= 1;
        self.0.changed.notify_all();
    }
}

impl Part {
    /// The ranks whose contributions this part needs, and whether it contributes.
    fn needs(&self) -> (Vec<usize>, bool) {
        let all: Vec<usize> = (0..self.shared.size).collect();
        match self.call {
            GroupCall::Reduce { root, .. } if self.rank == root => (all, true),
            GroupCall::Reduce { .. } => (Vec::new(), true),
            GroupCall::Broadcast { root, .. } if self.rank == root => (Vec::new(), false),
            GroupCall::Broadcast { root, .. } => (vec![root], false),
            _ => (all, true),
        }
    }

    fn run(mut self) -> xpu_plugin_sdk::Result<()> {
        let shared = self.shared.clone();
        let _running = Running::start(&shared);
        let outcome = self.exchange();
        self.finish(outcome.as_ref().err());
        outcome
    }

    /// Contributes, waits for the peers this part needs, and writes the result.
    fn exchange(&self) -> Result<()> {
        let shared = &self.shared;
        let (needs, contributes) = self.needs();
        let root_broadcast =
            matches!(self.call, GroupCall::Broadcast { root, .. } if root == self.rank);
        let from = if contributes {
            self.send.as_ref()
        } else if root_broadcast {
            self.send.as_ref().or(self.recv.as_ref())
        } else {
            None
        };
        // SAFETY: the SDK checked that the range lies in a live buffer of this rank's
        // device with the length the operation implies; this job runs on the rank's
        // stream, which the host orders against every other use of it.
        let mine = from.map(|s| Arc::new(Words::of(unsafe { view::<u8>(s) }, &shared.pool)));
        let copies = {
            let mut st = lock(&shared.state);
            if let Some(why) = &st.aborted {
                return Err(Error::aborted(format!("{}: {why}", shared.name)));
            }
            // Wait until every part is enqueued (at once, unless the caller is still
            // enqueueing the others), or the operation is cancelled.
            loop {
                let Some(x) = st.exchanges.get(&self.seq) else {
                    return Err(Error::internal(format!(
                        "{}: operation {} is unknown to rank {}",
                        shared.name, self.seq, self.rank
                    )));
                };
                if x.cancelled {
                    return Ok(());
                }
                if x.enqueued {
                    break;
                }
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            let Some(x) = st.exchanges.get_mut(&self.seq) else {
                return Err(Error::internal(format!(
                    "{}: operation {} vanished",
                    shared.name, self.seq
                )));
            };
            x.copies[self.rank] = mine.clone();
            shared.changed.notify_all();
            let deadline = Instant::now() + shared.timeout;
            loop {
                if let Some(why) = &st.aborted {
                    return Err(Error::aborted(format!("{}: {why}", shared.name)));
                }
                let x = st.exchanges.get(&self.seq).ok_or_else(|| {
                    Error::internal(format!("{}: operation {} vanished", shared.name, self.seq))
                })?;
                if let Some((rank, why)) = &x.failed {
                    return Err(Error::aborted(format!(
                        "{}: rank {rank}'s part of operation {} failed: {why}",
                        shared.name, self.seq
                    )));
                }
                let missing: Vec<usize> = needs
                    .iter()
                    .copied()
                    .filter(|&q| x.copies[q].is_none())
                    .collect();
                if missing.is_empty() {
                    break needs
                        .iter()
                        .map(|&q| x.copies[q].clone())
                        .collect::<Option<Vec<Arc<Words>>>>()
                        .unwrap_or_default();
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::timeout(format!(
                        "{}: rank {} waited {:?} in operation {} for rank(s) {missing:?}, whose parts did not start (is their stream blocked?)",
                        shared.name, self.rank, shared.timeout, self.seq
                    )));
                }
                st = shared
                    .changed
                    .wait_timeout(st, deadline - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        };
        let Some(recv) = &self.recv else {
            return Ok(());
        };
        if root_broadcast {
            // The root keeps its data; it copies it over only when it sent from elsewhere
            // (its contribution is that copy).
            return match (&self.send, &mine) {
                (Some(s), Some(data)) if !s.same_as(recv) => {
                    // SAFETY: as for the contribution; `recv` is disjoint from `send`
                    // (checked by the SDK) and only this job writes it.
                    unsafe { view_mut::<u8>(recv) }.copy_from_slice(data.bytes());
                    Ok(())
                }
                _ => Ok(()),
            };
        }
        // SAFETY: as for the contribution; only this job writes `recv`, and it reads the
        // others' data from their copies, so an in-place `recv` is safe to overwrite.
        let out = unsafe { view_mut::<u8>(recv) };
        let copies: Vec<&[u8]> = copies.iter().map(|c| c.bytes()).collect();
        write_result(self.call, self.rank, self.shared.size, &copies, out);
        Ok(())
    }

    /// Counts this rank done; the last one forgets the operation.
    fn finish(&mut self, failure: Option<&Error>) {
        self.done = true;
        let mut st = lock(&self.shared.state);
        let size = self.shared.size;
        if let Some(x) = st.exchanges.get_mut(&self.seq) {
            // A part dropped while its operation was still being enqueued was refused
            // by its stream; the caller cancels the operation instead.
            if let Some(e) = failure.filter(|_| x.enqueued) {
                x.failed.get_or_insert((self.rank, e.to_string()));
            }
            x.finished += 1;
            if x.finished >= size {
                if let Some(x) = st.exchanges.remove(&self.seq) {
                    for copy in x.copies.into_iter().flatten() {
                        if let Ok(words) = Arc::try_unwrap(copy) {
                            words.recycle(&self.shared.pool);
                        }
                    }
                }
            }
        }
        self.shared.changed.notify_all();
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if !self.done {
            let why = Error::aborted(format!(
                "its part never ran: its stream had failed before it, or its device (rank {}) was lost",
                self.rank
            ));
            self.finish(Some(&why));
        }
    }
}

fn hal_op(op: CollectiveOp) -> BinaryOp {
    match op {
        CollectiveOp::Sum | CollectiveOp::Avg => BinaryOp::Sum,
        CollectiveOp::Prod => BinaryOp::Prod,
        CollectiveOp::Min => BinaryOp::Min,
        CollectiveOp::Max => BinaryOp::Max,
    }
}

/// Rank `rank`'s result of `call` from the contributions `copies` (of the ranks it
/// needs, in rank order), into `out`. Contributions 8-byte aligned are read in place.
pub(crate) fn write_result(
    call: GroupCall,
    rank: usize,
    n: usize,
    copies: &[&[u8]],
    out: &mut [u8],
) {
    match call {
        GroupCall::AllReduce { dtype, op, .. }
        | GroupCall::Reduce { dtype, op, .. }
        | GroupCall::ReduceScatter { dtype, op, .. } => {
            // A reduce-scatter's rank reduces its own block of the copies.
            let at = match call {
                GroupCall::ReduceScatter { .. } => rank * out.len(),
                _ => 0,
            };
            xpu_hal::with_dtype!(DType, dtype, T => reduce::<T>(dtype, op, n, copies, at, out));
        }
        GroupCall::Broadcast { .. } => {
            if let Some(root) = copies.first() {
                out.copy_from_slice(root);
            }
        }
        GroupCall::AllGather { bytes } => {
            let b = bytes as usize;
            for (q, c) in copies.iter().enumerate() {
                out[q * b..(q + 1) * b].copy_from_slice(c);
            }
        }
        GroupCall::AllToAll { bytes } => {
            let b = bytes as usize;
            for (q, c) in copies.iter().enumerate() {
                out[q * b..(q + 1) * b].copy_from_slice(&c[rank * b..(rank + 1) * b]);
            }
        }
    }
}

/// `out` = `op` over the ranks' bytes `at .. at + out.len()`, combined in rank order.
fn reduce<T: Element>(
    dtype: DType,
    op: CollectiveOp,
    n: usize,
    copies: &[&[u8]],
    at: usize,
    out: &mut [u8],
) {
    let len = out.len();
    // The copies are 8-byte aligned and `at` is a whole number of elements, so their
    // blocks are read in place; a block that is not aligned is read through a copy.
    fn block<T: Element>(c: &[u8], at: usize, len: usize) -> std::borrow::Cow<'_, [T]> {
        let bytes = &c[at..at + len];
        match bytemuck::try_cast_slice(bytes) {
            Ok(b) => std::borrow::Cow::Borrowed(b),
            Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
        }
    }
    let combine = hal_op(op);
    let into = |acc: &mut [T]| {
        match copies {
            [] => return,
            [only] => acc.copy_from_slice(&block(only, at, len)),
            [a, b, rest @ ..] => {
                reference::binary(combine, &block(a, at, len), &block(b, at, len), acc);
                for c in rest {
                    reference::accumulate(combine, acc, &block(c, at, len));
                }
            }
        }
        if op == CollectiveOp::Avg {
            reference::average(hal_dtype(dtype), n, acc);
        }
    };
    // The result goes straight into `out` where it is aligned for `T` (arena buffers
    // are, at whole-element offsets); otherwise through an aligned copy.
    match bytemuck::try_cast_slice_mut::<u8, T>(out) {
        Ok(acc) => into(acc),
        Err(_) => {
            let mut acc = vec![T::zeroed(); len / std::mem::size_of::<T>()];
            into(&mut acc);
            out.copy_from_slice(bytemuck::cast_slice(&acc));
        }
    }
}
