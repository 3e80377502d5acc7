//! Small operations on host ranks: a lock-free exchange through per-rank slots.
//!
//! For an operation whose input is at most [`SMALL_BYTES`] on a communicator whose every
//! device runs host functions (host devices), each rank copies its input into its own
//! slot of communicator memory, publishes the operation's description beside it, and
//! sets its flag to the operation's sequence number + 1. It then waits until every
//! rank's flag has reached that number, checks that all described the same operation,
//! and computes its own result from the slots. There is no lock and no completion
//! rendezvous: the inputs were copied, and each rank writes only its own output. This is
//! the shape of NCCL's LL protocol and of MPI's shared-memory transports, and it costs a
//! few cache-line transfers per operation.
//!
//! Slots, flags and descriptions are double-buffered by the parity of the sequence
//! number; a parity's flag and description share one cache line. Each rank publishes its
//! operations strictly in order, each only once it is through with the one before (for a
//! small operation: has read the slots; the rank's `through` counter). So a rank that
//! reuses parity `p` at operation `s + 2` — which it reaches only after every rank
//! published `s + 1` — knows every rank is through with `s`, and nothing is overwritten
//! while it is read. Exchanges queued on streams (below) keep this order too, even across
//! streams: each waits for the rank's previous operation before it publishes.
//!
//! The rank's thread runs the exchange when its stream is idle and it is through with its
//! previous operation; otherwise it enqueues a host function that runs it on the stream's
//! worker in stream order, and returns. Likewise a larger operation publishes its
//! description from a host function when an earlier small operation of the rank is still
//! queued on another stream. So no call blocks its caller on work queued elsewhere.
//!
//! Every operation, small or not, publishes its description, so that a rank in a small
//! operation sees a desync with a rank that called something else, and a rank that
//! passed invalid arguments learns which way the others went.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use xpu_hal::{Error, Result};

use super::op::{Collective, OpDesc};
use super::shared_memory::{reduce_into, HostBuffers};
use super::wait::{current_core, Core, Waited, NO_CORE};
use super::{Shared, SPIN};

/// The largest input, in bytes, an operation may have to take the small path.
pub(crate) const SMALL_BYTES: usize = 4096;

const WORDS: usize = SMALL_BYTES / 8;

/// One parity of a rank's slot: the flag, the description and the input, contiguous
/// from the start of a cache line, so that a reader that sees the flag has the
/// description and the first bytes of the input in the same transfer (the whole input,
/// for the smallest messages).
#[repr(C, align(64))]
struct Half {
    /// One more than the sequence number of the latest operation of this parity the rank
    /// published.
    flag: AtomicU64,
    /// What the rank called (`None`: invalid arguments).
    desc: UnsafeCell<Option<OpDesc>>,
    /// The input (8-byte aligned).
    data: UnsafeCell<[u64; WORDS]>,
}

/// One rank's slot.
struct Slot {
    halves: [Half; 2],
    /// The core the rank ran on when it last published ([`NO_CORE`] before), for its
    /// waiters to tell whether it shares theirs (`wait.rs`).
    core: AtomicU32,
}

impl Slot {
    /// Whether the rank has published operation `seq` (or a later one of its parity).
    fn published(&self, seq: u64) -> bool {
        self.halves[(seq % 2) as usize].flag.load(Ordering::Acquire) > seq
    }
}

/// Every rank's slot.
pub(crate) struct Slots {
    slots: Vec<Slot>,
}

// SAFETY: a slot's description and data for parity `p` are written only by its own rank,
// before the release store of its flag, and read by others only after an acquire load
// shows the flag; they are rewritten only two operations later, when every rank has
// left the operation that read them (see the module docs).
unsafe impl Sync for Slots {}
// SAFETY: as above; the cells hold plain data.
unsafe impl Send for Slots {}

impl Slots {
    pub fn new(ranks: usize) -> Self {
        Slots {
            slots: (0..ranks)
                .map(|_| Slot {
                    halves: [0, 1].map(|_| Half {
                        flag: AtomicU64::new(0),
                        desc: UnsafeCell::new(None),
                        data: UnsafeCell::new([0; WORDS]),
                    }),
                    core: AtomicU32::new(NO_CORE),
                })
                .collect(),
        }
    }

    /// Publishes `rank`'s arrival at operation `seq`: its description and, for the
    /// small path, its input (`len` bytes at `input`).
    ///
    /// # Safety
    ///
    /// Only `rank`'s own caller may publish for it, once per sequence number, in order;
    /// `input` must be valid for `len <= SMALL_BYTES` bytes.
    pub unsafe fn publish(
        &self,
        rank: usize,
        seq: u64,
        desc: Option<OpDesc>,
        input: Option<(*const u8, usize)>,
    ) {
        let Some(slot) = self.slots.get(rank) else {
            return;
        };
        let p = (seq % 2) as usize;
        // SAFETY: this rank alone writes its parity-`p` cells, and nobody reads them now
        // (module docs); `input` is valid for `len` bytes, at most the slot's size.
        unsafe {
            *slot.halves[p].desc.get() = desc;
            if let Some((from, len)) = input {
                let to = slot.halves[p].data.get().cast::<u8>();
                std::ptr::copy_nonoverlapping(from, to, len.min(SMALL_BYTES));
            }
        }
        slot.core.store(current_core(), Ordering::Relaxed);
        slot.halves[p].flag.store(seq + 1, Ordering::Release);
    }

    /// Notes that `rank` runs on `core` now.
    pub fn ran_on(&self, rank: usize, core: u32) {
        if let Some(slot) = self.slots.get(rank) {
            slot.core.store(core, Ordering::Relaxed);
        }
    }

    /// Whether a rank that has not published `seq` yet last ran on `core`, where `rank`
    /// runs; of two ranks that share a core, the higher one moves off it.
    pub fn beside(&self, rank: usize, seq: u64, core: u32) -> Core {
        if core == NO_CORE {
            return Core::Unknown;
        }
        let mut sharing = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.published(seq) && s.core.load(Ordering::Relaxed) == core)
            .map(|(q, _)| q)
            .peekable();
        match sharing.peek() {
            None => Core::Own,
            Some(_) => Core::Shared {
                move_off: sharing.all(|q| q < rank),
            },
        }
    }

    /// The ranks whose flag has not reached operation `seq` yet.
    pub fn missing(&self, seq: u64) -> impl Iterator<Item = usize> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(move |(_, s)| !s.published(seq))
            .map(|(r, _)| r)
    }

    /// Whether every rank has published operation `seq`.
    pub fn all_arrived(&self, seq: u64) -> bool {
        self.slots.iter().all(|s| s.published(seq))
    }

    /// What `rank` published for operation `seq`. Call only once
    /// [`Slots::all_arrived`] returned `true` for `seq`, before leaving the operation.
    pub fn desc(&self, rank: usize, seq: u64) -> Option<OpDesc> {
        let slot = self.slots.get(rank)?;
        // SAFETY: the flag showed `seq` (acquire), so the write happened before, and the
        // cell is not rewritten until this rank leaves the operation (module docs).
        unsafe { *slot.halves[(seq % 2) as usize].desc.get() }
    }

    /// The address of `rank`'s input for operation `seq`, under the same rule.
    pub fn data(&self, rank: usize, seq: u64) -> *mut u8 {
        match self.slots.get(rank) {
            Some(slot) => slot.halves[(seq % 2) as usize].data.get().cast::<u8>(),
            None => std::ptr::null_mut(),
        }
    }
}

/// Marks a rank through with an operation when dropped.
struct Through<'a>(&'a AtomicU64, u64);

impl Drop for Through<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

/// The input length of an operation on the small path: what each rank publishes.
pub(crate) fn input_bytes(desc: &OpDesc, ranks: usize) -> u64 {
    match desc.kind {
        Collective::ReduceScatter | Collective::AllToAll => desc.bytes * ranks as u64,
        Collective::Barrier => 0,
        _ => desc.bytes,
    }
}

/// Whether an operation is small enough for the slots.
pub(crate) fn fits(desc: &OpDesc, ranks: usize) -> bool {
    desc.kind != Collective::SendRecv && input_bytes(desc, ranks) <= SMALL_BYTES as u64
}

impl Shared {
    /// Publishes that `rank` refused operation `seq` with `error`, for the others to
    /// report.
    pub(super) fn refuse(&self, slots: &Slots, rank: usize, seq: u64, error: &Error) -> Result<()> {
        if let Some(r) = self.refusals.get(rank) {
            *r.lock().unwrap_or_else(|p| p.into_inner()) = Some((seq, error.clone()));
        }
        self.announce(slots, rank, seq, None)
    }

    /// Publishes `rank`'s description of operation `seq`, which reads no slots, once the
    /// rank is through with the operation before; the rank is then through with this one.
    pub(super) fn announce(
        &self,
        slots: &Slots,
        rank: usize,
        seq: u64,
        desc: Option<OpDesc>,
    ) -> Result<()> {
        self.wait_through(rank, seq)?;
        // SAFETY: this rank's own slot, for `seq`, after its previous operation.
        unsafe { slots.publish(rank, seq, desc, None) };
        self.through[rank].store(seq + 1, Ordering::Release);
        Ok(())
    }

    /// Tells the other ranks that `rank` will not run operation `seq`: its stream skipped
    /// the host function that was to run it, after an earlier operation there failed.
    pub(super) fn skipped(&self, rank: usize, seq: u64) {
        let Some(slots) = self.slots.as_ref() else {
            return;
        };
        let why = Error::aborted(format!(
            "the stream of {} skipped it, because an earlier operation on that stream failed",
            self.rank_name(rank)
        ));
        let _ = self.refuse(slots, rank, seq, &why);
    }

    /// Whether `rank` is through with every operation before `seq`, so that it may
    /// publish `seq` now without waiting.
    pub(super) fn is_through(&self, rank: usize, seq: u64) -> bool {
        self.through[rank].load(Ordering::Acquire) >= seq
    }

    /// Waits until `rank` is through with every operation before `seq` (at once, unless
    /// an earlier small operation of it is still queued on a stream).
    fn wait_through(&self, rank: usize, seq: u64) -> Result<()> {
        let through = &self.through[rank];
        let done = || through.load(Ordering::Acquire) >= seq;
        if done() {
            return Ok(());
        }
        let deadline = || Instant::now() + self.options.timeout;
        match self
            .spinner
            .wait_until(SPIN, deadline, done, || self.stopping())
        {
            Waited::Done => Ok(()),
            Waited::Stopped => Err(self.failure()),
            Waited::TimedOut => {
                let e = Error::Timeout {
                    message: format!(
                        "operation #{} of {} did not finish within {:.1} s, so #{seq} could not start; the communicator is now failed: abort it and make a new one",
                        seq.saturating_sub(1),
                        self.rank_name(rank),
                        self.options.timeout.as_secs_f64()
                    ),
                };
                self.fail(e.clone());
                Err(e)
            }
        }
    }

    /// Runs operation `seq` of `rank` through the slots; `host` are the rank's buffers.
    pub(super) fn exchange(
        &self,
        slots: &Slots,
        rank: usize,
        seq: u64,
        desc: OpDesc,
        host: &HostBuffers,
    ) -> Result<()> {
        let n = self.devices.len();
        let root = desc.root.unwrap_or(0);
        let input = match desc.kind {
            Collective::Barrier => None,
            Collective::Broadcast if rank != root => None,
            Collective::Broadcast => host.send.as_ref().or(host.recv.as_ref()),
            _ => host.send.as_ref(),
        };
        let len = input_bytes(&desc, n) as usize;
        self.wait_through(rank, seq)?;
        // Through with this operation once its slots are read, whatever the outcome.
        let _through = Through(&self.through[rank], seq + 1);
        // SAFETY: this rank publishes its own slot, once for `seq`, after its previous
        // operation; the input range is at least `len` bytes (validated) and at most
        // SMALL_BYTES (`fits`).
        unsafe {
            slots.publish(
                rank,
                seq,
                Some(desc),
                input.map(|h| (h.at(0).cast_const(), len)),
            )
        };
        self.await_slots(slots, rank, seq, &desc)?;
        for q in 0..n {
            match slots.desc(q, seq) {
                Some(d) if d == desc => {}
                None => {
                    let why = self.refusals[q]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_ref()
                        .filter(|(s, _)| *s == seq)
                        .map(|(_, e)| e.clone());
                    return Err(self.refused(seq, q, why.as_ref()));
                }
                Some(d) => {
                    let e = Error::invalid(format!(
                        "desync at operation #{seq}: {} called {desc} but {} called {d}; every rank must call the same operations in the same order",
                        self.rank_name(rank),
                        self.rank_name(q)
                    ));
                    // A rank that went the other way waits in the rendezvous: fail the
                    // communicator so that it returns too.
                    if !fits(&d, n) {
                        self.fail(e.clone());
                    }
                    return Err(e);
                }
            }
        }
        let out = host.recv.as_ref().map_or(std::ptr::null_mut(), |h| h.at(0));
        let bytes = desc.bytes as usize;
        let data = |q: usize| slots.data(q, seq);
        // What this rank's output is made of: a reduction of the ranks' slot ranges at
        // one offset, or copies of slot ranges to places in the output.
        let reduce_at = match desc.kind {
            Collective::AllReduce => Some(0),
            Collective::Reduce if rank == root => Some(0),
            Collective::ReduceScatter => Some(rank * bytes),
            _ => None,
        };
        if let Some(offset) = reduce_at {
            // On the stack for the usual few ranks: this path is all per-call overhead.
            let mut few = [std::ptr::null_mut::<u8>(); 8];
            let mut many = Vec::new();
            let sources: &mut [*mut u8] = if n <= few.len() {
                &mut few[..n]
            } else {
                many.resize(n, std::ptr::null_mut());
                &mut many
            };
            for (q, s) in sources.iter_mut().enumerate() {
                *s = data(q).wrapping_add(offset);
            }
            // SAFETY: the slot data of `seq` stays unchanged until this rank leaves the
            // operation (module docs) and holds each rank's input, validated to cover
            // these ranges; `out` is this rank's own receive buffer of `bytes`, which
            // nothing else writes now; slots and output are disjoint.
            unsafe { reduce_into(&desc, n, sources, out, bytes) }?;
        }
        // Copies (rank, offset in its slot, offset in the output).
        let copy = |(q, from, to): (usize, usize, usize)| {
            if !out.is_null() {
                // SAFETY: as above; each copy stays within rank `q`'s published input and
                // this rank's validated receive buffer.
                unsafe { std::ptr::copy_nonoverlapping(data(q).add(from), out.add(to), bytes) };
            }
        };
        match desc.kind {
            // The root's own receive buffer is already the data when in place.
            Collective::Broadcast if input.is_none_or(|h| h.at(0) != out) => copy((root, 0, 0)),
            Collective::AllGather => (0..n).for_each(|q| copy((q, 0, q * bytes))),
            Collective::AllToAll => (0..n).for_each(|q| copy((q, rank * bytes, q * bytes))),
            _ => {}
        }
        Ok(())
    }

    /// Waits until every rank published `seq`, or fails: the communicator failed or was
    /// aborted meanwhile, or the timeout passed (then it fails, naming the missing ranks).
    pub(super) fn await_slots(
        &self,
        slots: &Slots,
        rank: usize,
        seq: u64,
        what: &dyn std::fmt::Display,
    ) -> Result<()> {
        let deadline = || Instant::now() + self.options.timeout;
        // Where this rank runs, kept current while it waits, for the others' waits.
        let shares_core = || {
            let here = current_core();
            slots.ran_on(rank, here);
            slots.beside(rank, seq, here)
        };
        match self.spinner.wait_until_beside(
            SPIN,
            deadline,
            || slots.all_arrived(seq),
            || self.stopping(),
            shares_core,
        ) {
            Waited::Done => return Ok(()),
            Waited::Stopped => return Err(self.failure()),
            Waited::TimedOut => {}
        }
        let missing: Vec<usize> = slots.missing(seq).collect();
        let e = self.timeout_message(&what.to_string(), seq, &missing);
        self.fail(e.clone());
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_description_and_first_input_bytes_share_a_cache_line() {
        let data = std::mem::offset_of!(Half, data);
        assert!(
            data + 8 <= 64,
            "the input starts at byte {data} of the line"
        );
        assert_eq!(data % 8, 0);
        assert_eq!(std::mem::align_of::<Half>(), 64);
    }
}
