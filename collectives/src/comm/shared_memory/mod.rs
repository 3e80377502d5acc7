//! Shared-memory execution: the ranks' own threads move the bytes.
//!
//! When every rank's buffers are directly addressable by the CPU
//! ([`xpu_hal::Allocation::host_view`]: host memory, or a device that shares memory with
//! the host) and every rank's stream is idle when the rank arrives, the data is ready and
//! nothing needs to be enqueued: the threads that called the operation are waiting for
//! each other anyway. The last rank to arrive plans the operation as one share of work
//! per rank; every rank's thread runs its own share, reading the other ranks' inputs and
//! writing their outputs in place, and the call returns when all shares are done. The
//! operation is then complete, so it is ordered after the work each stream had finished
//! and before anything enqueued later, exactly as on the enqueued path.
//!
//! Shares are balanced and touch disjoint bytes. For an all-reduce, rank `r` reduces
//! part `r` of every input and writes the result into part `r` of every output: each
//! rank reads and writes as many bytes as one copy of the buffer — the least any
//! algorithm can move — in one pass, with no staging and no scratch device memory. Parts
//! start on cache-line boundaries, so no two ranks write one line, and a message smaller
//! than a line is one rank's alone. Reductions run tile by tile through a small scratch
//! that stays in L1, with the HAL's reference arithmetic ([`xpu_hal::reference`]),
//! so results equal the enqueued path's bit for bit.
//!
//! The planner refuses (and the operation is enqueued instead) when buffers of different
//! ranks overlap or are not aligned to their dtype.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use xpu_hal::reference::{self as ops, Element};
use xpu_hal::with_dtype;
use xpu_hal::{BinaryOp, DType, Error, HostView, Result, Scalar};

use super::algorithms::RankBuffers;
use super::op::{avg_factor, Collective, OpDesc, ReduceOp};
use super::transport::Slice;
use super::wait::{Spinner, Waited};

mod stream;

/// Parts of a buffer start on multiples of this many bytes (a cache line).
const LINE: u64 = 64;
/// Elements per reduction tile: 16 KiB of `f64`, less of narrower types.
const TILE: usize = 2048;
/// Bytes per step of a copy to several destinations, so the source is read from cache.
const COPY_TILE: usize = 256 << 10;
/// A share writing at least this many bytes writes its results with streaming stores.
const STREAM_BYTES: usize = 8 << 20;
/// How long a rank that finished its share spins for the others before yielding.
const SHARE_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// A rank's buffer as the CPU sees it: its own memory through a host view (which keeps
/// it alive), or a host staging copy its rank keeps alive until the operation is over.
#[derive(Clone, Debug)]
pub(crate) struct HostRange {
    base: *mut u8,
    len: u64,
    view: Option<HostView>,
}

// SAFETY: the address points into memory kept alive by `view`, or by the arriving rank
// until every share of the operation is done; ranges are only dereferenced by shares,
// under the planner's rules.
unsafe impl Send for HostRange {}
// SAFETY: as above; shared references expose no references into the memory.
unsafe impl Sync for HostRange {}

impl HostRange {
    /// The CPU's view of `len` bytes at `offset` of `alloc`, if its memory has one.
    pub fn of(alloc: &xpu_hal::Allocation, offset: u64, len: u64) -> Option<HostRange> {
        let view = alloc.host_view()?;
        let end = offset.checked_add(len)?;
        (end <= view.len()).then(|| HostRange {
            base: view.as_ptr().wrapping_add(offset as usize),
            len,
            view: Some(view),
        })
    }

    /// `len` bytes of host memory at `base`, which the caller keeps alive and otherwise
    /// untouched until the operation that uses the range is over.
    pub fn staged(base: *mut u8, len: u64) -> HostRange {
        HostRange {
            base,
            len,
            view: None,
        }
    }

    /// The address of byte `at` of the range.
    pub(crate) fn at(&self, at: u64) -> *mut u8 {
        self.base.wrapping_add(at.min(self.len) as usize)
    }
}

/// A rank's buffers as the CPU sees them, brought by its arrival.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostBuffers {
    pub send: Option<HostRange>,
    pub recv: Option<HostRange>,
}

/// One step of a share: the reduction of its sources (or a copy of the only one)
/// written to every destination. Addresses live in [`Work::addresses`].
struct Task {
    /// The rank whose thread runs it.
    rank: usize,
    /// `addresses[sources.0..sources.1]`.
    sources: (usize, usize),
    /// `addresses[dests.0..dests.1]`.
    dests: (usize, usize),
    len: usize,
}

/// How a reduction combines and finishes.
#[derive(Clone, Copy)]
struct Reduction {
    op: BinaryOp,
    dtype: DType,
    /// For averages, the factor the sum is multiplied by ([`avg_factor`]).
    avg: Option<Scalar>,
}

/// A planned operation: every rank's share, and the rendezvous that ends it.
pub(crate) struct Work {
    ranks: usize,
    tasks: Vec<Task>,
    /// Every task's source and destination addresses, flat (few allocations per
    /// operation: small collectives are dominated by fixed costs).
    addresses: Vec<*mut u8>,
    reduce: Option<Reduction>,
    /// Keep every rank's memory alive until the last share is done.
    _views: Vec<HostView>,
    done: AtomicUsize,
    /// For shares run on the ranks' streams: how many have reached the operation, and
    /// whether it started (every rank there) or was abandoned (one gave up waiting).
    arrived: AtomicUsize,
    start: AtomicU8,
    error: Mutex<Option<Error>>,
}

/// `Work::start` values.
const WAITING: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

// SAFETY: the raw addresses point into memory the views keep alive. Shares touch
// disjoint bytes (the planner checks that the ranks' buffers do not overlap), and each
// is run by exactly one thread, so sharing the plan between the ranks' threads creates
// no data race.
unsafe impl Send for Work {}
// SAFETY: as above; the only state written through `&Work` is atomic or locked.
unsafe impl Sync for Work {}

/// Part `i` of `n` of `bytes`, starting on a cache line, as (offset, length).
fn part(bytes: u64, n: usize, i: usize) -> (u64, u64) {
    let lines = bytes.div_ceil(LINE);
    let (n, i) = (n as u64, i as u64);
    let start = (lines * i / n * LINE).min(bytes);
    let end = (lines * (i + 1) / n * LINE).min(bytes);
    (start, end - start)
}

fn overlap(a: &Option<Slice>, b: &Option<Slice>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a.overlaps(b))
}

/// Builds the task list.
struct Planner {
    tasks: Vec<Task>,
    addresses: Vec<*mut u8>,
}

impl Planner {
    /// Adds a task of `rank` from `sources` to `dests` (destinations equal to the only
    /// source are dropped: copying bytes onto themselves).
    fn task(
        &mut self,
        rank: usize,
        sources: impl IntoIterator<Item = Option<*mut u8>>,
        dests: impl IntoIterator<Item = Option<*mut u8>>,
        len: u64,
    ) -> Option<()> {
        let s0 = self.addresses.len();
        for a in sources {
            self.addresses.push(a?);
        }
        let d0 = self.addresses.len();
        let single = (d0 - s0 == 1).then(|| self.addresses[s0]);
        for a in dests {
            let a = a?;
            if Some(a) != single {
                self.addresses.push(a);
            }
        }
        self.tasks.push(Task {
            rank,
            sources: (s0, d0),
            dests: (d0, self.addresses.len()),
            len: usize::try_from(len).ok()?,
        });
        Some(())
    }
}

impl Work {
    /// Plans `desc` over the ranks' buffers, or `None` when it cannot run this way.
    pub fn plan(desc: &OpDesc, buffers: &[RankBuffers], host: &[HostBuffers]) -> Option<Work> {
        let n = buffers.len();
        // Shares may only race on bytes nobody writes: no rank's buffer may overlap
        // another rank's receive buffer.
        for p in 0..n {
            for q in (0..n).filter(|&q| q != p) {
                if overlap(&buffers[p].recv, &buffers[q].recv)
                    || overlap(&buffers[p].send, &buffers[q].recv)
                {
                    return None;
                }
            }
        }
        let send = |r: usize, at: u64| host[r].send.as_ref().map(|h| h.at(at));
        let recv = |r: usize, at: u64| host[r].recv.as_ref().map(|h| h.at(at));
        let mut p = Planner {
            tasks: Vec::with_capacity(n),
            addresses: Vec::with_capacity(2 * n * n),
        };
        let reduces = matches!(
            desc.kind,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        );
        let root = desc.root.unwrap_or(0);
        let bytes = desc.bytes;
        for r in 0..n {
            let block = r as u64 * bytes;
            match desc.kind {
                Collective::AllReduce => {
                    let (off, len) = part(bytes, n, r);
                    p.task(
                        r,
                        (0..n).map(|q| send(q, off)),
                        (0..n).map(|q| recv(q, off)),
                        len,
                    )?
                }
                Collective::Reduce => {
                    let (off, len) = part(bytes, n, r);
                    p.task(r, (0..n).map(|q| send(q, off)), [recv(root, off)], len)?
                }
                Collective::ReduceScatter => {
                    p.task(r, (0..n).map(|q| send(q, block)), [recv(r, 0)], bytes)?
                }
                Collective::Broadcast => {
                    let (off, len) = part(bytes, n, r);
                    let from = send(root, off).or(recv(root, off));
                    p.task(r, [from], (0..n).map(|q| recv(q, off)), len)?
                }
                Collective::AllGather => {
                    p.task(r, [send(r, 0)], (0..n).map(|q| recv(q, block)), bytes)?
                }
                Collective::AllToAll => {
                    for q in 0..n {
                        p.task(r, [send(q, block)], [recv(r, q as u64 * bytes)], bytes)?;
                    }
                }
                Collective::Barrier => {}
                Collective::SendRecv => return None,
            }
        }
        let reduce = if reduces {
            let (dtype, op) = (desc.dtype?, desc.op?);
            Some(Reduction {
                op: op.combine(),
                dtype,
                avg: (op == ReduceOp::Avg).then(|| avg_factor(dtype, n)),
            })
        } else {
            None
        };
        // Typed access needs every address aligned to the element.
        let align = reduce.map_or(1, |r| r.dtype.size());
        if !p
            .addresses
            .iter()
            .all(|a| (*a as usize).is_multiple_of(align))
        {
            return None;
        }
        let views = host
            .iter()
            .flat_map(|h| [h.send.as_ref(), h.recv.as_ref()])
            .flatten()
            .filter_map(|r| r.view.clone())
            .collect();
        Some(Work {
            ranks: n,
            tasks: p.tasks,
            addresses: p.addresses,
            reduce,
            _views: views,
            done: AtomicUsize::new(0),
            arrived: AtomicUsize::new(0),
            start: AtomicU8::new(WAITING),
            error: Mutex::new(None),
        })
    }

    /// Runs `rank`'s share, then waits until every rank has run its own. A panic in the
    /// share becomes the operation's error on every rank.
    pub fn participate(&self, rank: usize, spinner: Spinner) -> Result<()> {
        let ran = catch_unwind(AssertUnwindSafe(|| self.run_share(rank)));
        if let Err(panic) = ran {
            let e = Error::from_panic("a shared-memory collective", &*panic);
            self.error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
        self.done.fetch_add(1, Ordering::AcqRel);
        // Shares are plain CPU work on threads that are already running, so this wait
        // is short and bounded: spin, then yield.
        let all = || self.done.load(Ordering::Acquire) >= self.ranks;
        while !spinner.spin(SHARE_SPIN, all) {
            std::thread::yield_now();
        }
        match &*self.error.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// [`Work::participate`] for a share run on `rank`'s stream, when the stream reaches
    /// the operation: the ranks' inputs are ready only once every rank's stream is there,
    /// so it first waits for all of them. If they do not all come by `deadline`, the
    /// operation is abandoned: no share runs, and every rank's returns the timeout.
    pub fn participate_queued(
        &self,
        rank: usize,
        spinner: Spinner,
        deadline: Instant,
    ) -> Result<()> {
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.ranks {
            // The last to arrive starts the operation, unless a rank gave up already.
            let _ =
                self.start
                    .compare_exchange(WAITING, STARTED, Ordering::AcqRel, Ordering::Acquire);
        }
        let decided = || self.start.load(Ordering::Acquire) != WAITING;
        if spinner.wait_until(SHARE_SPIN, || deadline, decided, || false) == Waited::TimedOut {
            // Unless the last rank started it meanwhile.
            self.abandon();
        }
        if self.start.load(Ordering::Acquire) == ABANDONED {
            let missing = self.ranks - self.arrived.load(Ordering::Acquire).min(self.ranks);
            return Err(Error::Timeout {
                message: format!(
                    "{missing} rank(s) did not reach the operation on their streams in time; the operation was abandoned"
                ),
            });
        }
        self.participate(rank, spinner)
    }

    /// Gives the operation up before it started (a rank could not enqueue its share):
    /// the shares waiting on streams return a timeout instead of waiting for it.
    pub fn abandon(&self) {
        let _ =
            self.start
                .compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
    }

    fn run_share(&self, rank: usize) {
        for task in self.tasks.iter().filter(|t| t.rank == rank && t.len > 0) {
            let sources = &self.addresses[task.sources.0..task.sources.1];
            let dests = &self.addresses[task.dests.0..task.dests.1];
            match self.reduce {
                None => copy_task(sources, dests, task.len),
                Some(r) => with_dtype!(DType, r.dtype, T => {
                    reduce_task::<T>(sources, dests, task.len, r)
                }),
            }
        }
    }
}

/// `dest` (`len` bytes) becomes the reduction of `sources` (each `len` bytes) by
/// `desc`'s operation, averages included, with the arithmetic of the shares.
///
/// # Safety
///
/// Every address must be valid for `len` bytes, aligned to `desc`'s dtype, and not
/// written by anyone else meanwhile; `dest` may equal a source but not partly overlap
/// one.
pub(crate) unsafe fn reduce_into(
    desc: &OpDesc,
    ranks: usize,
    sources: &[*mut u8],
    dest: *mut u8,
    len: usize,
) -> Result<()> {
    let (Some(dtype), Some(op)) = (desc.dtype, desc.op) else {
        return Err(Error::backend_message(
            "collectives",
            "internal error: a reduction without a dtype or an operation",
        ));
    };
    let r = Reduction {
        op: op.combine(),
        dtype,
        avg: (op == ReduceOp::Avg).then(|| avg_factor(dtype, ranks)),
    };
    with_dtype!(DType, dtype, T => reduce_task::<T>(sources, &[dest], len, r));
    Ok(())
}

/// Copies the task's only source to every destination.
fn copy_task(sources: &[*mut u8], dests: &[*mut u8], len: usize) {
    let Some(&from) = sources.first() else {
        return;
    };
    let step = if dests.len() > 1 { COPY_TILE } else { len };
    let mut at = 0;
    while at < len {
        let k = step.min(len - at);
        for &d in dests {
            // SAFETY: the planner made `from` and every destination address `len` valid
            // bytes of live memory (the views keep it alive); destinations differ from
            // the source and from each other's ranges, and no other share touches them.
            unsafe { std::ptr::copy_nonoverlapping(from.add(at), d.add(at), k) };
        }
        at += k;
    }
}

thread_local! {
    /// The reduction tile and, for integer averages, its `f64` copy.
    static SCRATCH: RefCell<(Vec<u64>, Vec<f64>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Reduces the task's sources tile by tile and writes each tile to every destination.
fn reduce_task<T: Element>(sources: &[*mut u8], dests: &[*mut u8], len: usize, r: Reduction) {
    let size = std::mem::size_of::<T>();
    let count = len / size;
    let avg = r.avg.map(|f| (T::from_scalar(f), f));
    // Results too large to stay in cache bypass it, so that writing them does not first
    // read every destination line (a third more memory traffic).
    let streaming = len.saturating_mul(dests.len()) >= STREAM_BYTES;
    if let ([dest], None, false, 2..) = (dests, avg, streaming, sources.len()) {
        if !sources.contains(dest) {
            // SAFETY: as below; the one destination is disjoint from every source (the
            // caller's contract: equal or disjoint, and it equals none), so it can be
            // reduced into directly, without a tile in between.
            unsafe { reduce_direct::<T>(sources, *dest, count, r.op) };
            return;
        }
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (words, wide) = &mut *s;
        if words.len() < TILE {
            words.resize(TILE, 0);
            wide.resize(TILE, 0.0);
        }
        // u64 storage is aligned for every element type, and every bit pattern is valid.
        let acc: &mut [T] = &mut bytemuck::cast_slice_mut::<u64, T>(&mut words[..])[..TILE];
        let mut i = 0;
        while i < count {
            let k = TILE.min(count - i);
            let tile = &mut acc[..k];
            {
                // SAFETY: each source spans `count` aligned elements of live memory that
                // nobody writes while this share reads it (a source that is also a
                // destination is this share's alone, and is written below only after
                // these references are last used).
                let source = |q: usize| unsafe {
                    std::slice::from_raw_parts(sources[q].cast::<T>().add(i).cast_const(), k)
                };
                match sources.len() {
                    0 => return,
                    1 => tile.copy_from_slice(source(0)),
                    m => {
                        ops::binary(r.op, source(0), source(1), tile);
                        for q in 2..m {
                            ops::accumulate(r.op, tile, source(q));
                        }
                    }
                }
            }
            match avg {
                Some((Some(alpha), _)) => ops::scale_in_place(alpha, tile),
                Some((None, Scalar::F64(f))) => {
                    let w = &mut wide[..k];
                    ops::cast(tile, w);
                    ops::scale_in_place(f, w);
                    ops::cast(w, tile);
                }
                _ => {}
            }
            for &d in dests {
                // SAFETY: each destination spans `count` aligned elements of live memory
                // that only this share writes; the scratch is disjoint from it.
                unsafe {
                    let to = d.cast::<T>().add(i).cast::<u8>();
                    let from = tile.as_ptr().cast::<u8>();
                    if streaming {
                        stream::copy(from, to, k * size);
                    } else {
                        std::ptr::copy_nonoverlapping(from, to, k * size);
                    }
                }
            }
            i += k;
        }
        if streaming {
            stream::fence();
        }
    });
}

/// Reduces two or more sources straight into `dest`: for one destination that no
/// source shares, in cache (the tiled path's copy from its scratch tile is then work
/// for nothing).
///
/// # Safety
///
/// Every address must be valid for `count` elements of `T`, aligned, and not written by
/// anyone else meanwhile; `dest` must be disjoint from every source.
unsafe fn reduce_direct<T: Element>(
    sources: &[*mut u8],
    dest: *mut u8,
    count: usize,
    op: BinaryOp,
) {
    // SAFETY: the caller's contract: every source is `count` live, aligned elements
    // that nobody writes meanwhile.
    let source = |q: usize| unsafe {
        std::slice::from_raw_parts(sources[q].cast::<T>().cast_const(), count)
    };
    // SAFETY: as above for `dest`, which no source shares, so this is its only reference.
    let out = unsafe { std::slice::from_raw_parts_mut(dest.cast::<T>(), count) };
    ops::binary(op, source(0), source(1), out);
    for q in 2..sources.len() {
        ops::accumulate(op, out, source(q));
    }
}

#[cfg(test)]
mod tests {
    use super::part;

    fn parts(bytes: u64, n: usize) -> Vec<(u64, u64)> {
        (0..n).map(|i| part(bytes, n, i)).collect()
    }

    #[test]
    fn parts_cover_the_buffer_on_cache_lines() {
        for bytes in [0u64, 1, 8, 63, 64, 65, 4099, 1 << 20] {
            for n in 1..6 {
                let p = parts(bytes, n);
                assert_eq!(p.len(), n);
                let mut next = 0;
                for &(off, len) in &p {
                    assert_eq!(off, next, "{bytes} over {n}");
                    assert!(off % 64 == 0 || len == 0);
                    next = off + len;
                }
                assert_eq!(next, bytes);
            }
        }
        // A message below a cache line is one rank's.
        assert_eq!(parts(8, 2).iter().filter(|p| p.1 > 0).count(), 1);
    }
}
