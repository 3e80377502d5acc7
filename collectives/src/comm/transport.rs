//! Moving and reducing bytes between two ranks, enqueued on the ranks' own streams.
//!
//! Every algorithm is written with two primitives, [`Transport::copy`] and
//! [`Transport::reduce`], from a range of one rank to a range of another. Each picks the
//! path the pair supports:
//!
//! - **local**: the same device — a device copy, or an accumulate straight from the source;
//! - **peer**: the destination device reads the source's memory
//!   ([`xpu_hal::Stream::copy_peer`]), after waiting for an event of the source's stream;
//! - **staged**: the source stream copies a piece into a host buffer, records an event,
//!   and the destination stream waits for it and copies the piece in. The buffers come
//!   from the process's staging pool ([`xpu_memory::host_staging`]), pinned for both
//!   devices where they pin host memory (so both copies are direct transfers), released with an
//!   event recorded behind the upload: the next user of a buffer makes its stream wait
//!   for that event, and consecutive pieces get different buffers while the pool is
//!   under its limit, so one piece's upload overlaps the next one's download.
//!
//! Reductions bring the source into a per-rank scratch piece first, then accumulate it
//! into the destination with the device's builtin operation; pieces are small enough to
//! stay in cache on CPU devices.
//!
//! Ordering: every call leaves the source's stream waiting for the destination's work on
//! the transfer, so a later write to the source range cannot overtake the read. Algorithms
//! may therefore reuse any range once its transfer has been enqueued.

use xpu_hal::{Allocation, BinaryOp, BufferSlice, DType, Device, Error, Result, Stream};
use xpu_memory::StagingPool;

use super::args::Range;

/// A byte range of one rank's memory, owned (clones of the handle), so it can be held
/// across the rendezvous.
#[derive(Clone, Debug)]
pub(crate) struct Slice {
    pub alloc: Allocation,
    pub offset: u64,
    pub len: u64,
}

impl Slice {
    pub fn from_buffer(b: &BufferSlice<'_>) -> Self {
        Slice {
            alloc: b.allocation.clone(),
            offset: b.offset,
            len: b.len,
        }
    }

    pub fn whole(alloc: &Allocation) -> Self {
        Slice {
            alloc: alloc.clone(),
            offset: 0,
            len: alloc.size(),
        }
    }

    /// `[offset, offset + len)` of this range.
    pub fn sub(&self, offset: u64, len: u64) -> Slice {
        Slice {
            alloc: self.alloc.clone(),
            offset: self.offset + offset,
            len,
        }
    }

    pub fn buf(&self) -> BufferSlice<'_> {
        self.alloc.slice(self.offset, self.len)
    }

    /// Whether both name exactly the same bytes.
    pub fn same_as(&self, other: &Slice) -> bool {
        self.buf().same_as(&other.buf())
    }

    /// Whether the two ranges share a byte.
    pub fn overlaps(&self, other: &Slice) -> bool {
        self.buf().overlaps(&other.buf())
    }
}

/// A rank's device and the stream its part of the current operation is enqueued on.
#[derive(Clone)]
pub(crate) struct RankIo {
    pub device: Device,
    pub stream: Stream,
}

/// How bytes go from one rank to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Local,
    Peer,
    Staged,
}

/// The communicator's reusable resources: scratch device memory per rank, and the
/// staging pool that host-staged pieces go through.
pub(crate) struct Transport {
    paths: Vec<Vec<Path>>,
    staging: &'static StagingPool,
    scratch: Vec<Option<Allocation>>,
    temp: Vec<Option<Allocation>>,
    /// Bytes per staged piece.
    pub staged_piece: u64,
    /// Bytes per reduction piece on peer and local paths.
    pub reduce_piece: u64,
}

impl Transport {
    pub fn new(devices: &[Device]) -> Self {
        let paths = devices
            .iter()
            .map(|from| {
                devices
                    .iter()
                    .map(|to| {
                        if from == to {
                            Path::Local
                        } else if from.backend() == to.backend() && to.capabilities().peer_access {
                            Path::Peer
                        } else {
                            Path::Staged
                        }
                    })
                    .collect()
            })
            .collect();
        Transport {
            paths,
            staging: xpu_memory::host_staging(),
            scratch: vec![None; devices.len()],
            temp: vec![None; devices.len()],
            staged_piece: 4 << 20,
            reduce_piece: 256 << 10,
        }
    }

    pub fn path(&self, from: usize, to: usize) -> Path {
        self.paths[from][to]
    }

    /// A device buffer of at least `bytes` on `rank`, reused across calls (the caller's
    /// stream orders its uses).
    fn scratch(&mut self, ranks: &[RankIo], rank: usize, bytes: u64) -> Result<Allocation> {
        grow(&mut self.scratch[rank], &ranks[rank].device, bytes)
    }

    /// A second per-rank device buffer for algorithms that need a working copy of a whole
    /// buffer (in-place direct reductions, reduce-scatter rings).
    pub fn temp(&mut self, ranks: &[RankIo], rank: usize, bytes: u64) -> Result<Slice> {
        let a = grow(&mut self.temp[rank], &ranks[rank].device, bytes)?;
        Ok(Slice {
            alloc: a,
            offset: 0,
            len: bytes,
        })
    }

    /// Copies `src` (on rank `from`) to `dst` (on rank `to`); equal lengths.
    pub fn copy(
        &mut self,
        ranks: &[RankIo],
        from: usize,
        src: &Slice,
        to: usize,
        dst: &Slice,
    ) -> Result<()> {
        if src.len == 0 {
            return Ok(());
        }
        let (sf, st) = (&ranks[from].stream, &ranks[to].stream);
        match self.path(from, to) {
            Path::Local if from == to => {
                if !src.same_as(dst) {
                    sf.copy(src.buf(), dst.buf())?;
                }
                Ok(())
            }
            Path::Local => {
                // Two ranks on one device: their streams are ordered by events, as on a
                // peer path.
                let ready = sf.record_event()?;
                st.wait_event(&ready)?;
                st.copy(src.buf(), dst.buf())?;
                let read = st.record_event()?;
                sf.wait_event(&read)
            }
            Path::Peer => {
                let ready = sf.record_event()?;
                st.wait_event(&ready)?;
                st.copy_peer(src.buf(), dst.buf())?;
                let read = st.record_event()?;
                sf.wait_event(&read)
            }
            Path::Staged => {
                let piece = self.staged_piece.max(1);
                let mut off = 0;
                while off < src.len {
                    let n = piece.min(src.len - off);
                    self.staged_piece_to(ranks, from, &src.sub(off, n), to, &dst.sub(off, n))?;
                    off += n;
                }
                Ok(())
            }
        }
    }

    /// One staged piece: download on `from`'s stream, upload on `to`'s.
    fn staged_piece_to(
        &mut self,
        ranks: &[RankIo],
        from: usize,
        src: &Slice,
        to: usize,
        dst: &Slice,
    ) -> Result<()> {
        let (sf, st) = (&ranks[from].stream, &ranks[to].stream);
        let len = usize::try_from(src.len)
            .map_err(|_| Error::invalid("a staged piece does not fit in host memory"))?;
        let devices = [&ranks[from].device, &ranks[to].device];
        let staging = self.staging.acquire_for(len, &devices)?;
        let enqueue = || -> Result<xpu_hal::Event> {
            if let Some(previous) = staging.ready_after() {
                sf.wait_event(previous)?;
            }
            sf.copy_to_host(src.buf(), staging.buffer(), 0)?;
            let staged = sf.record_event()?;
            st.wait_event(&staged)?;
            st.copy_from_host(staging.buffer(), 0, dst.buf())?;
            st.record_event()
        };
        match enqueue() {
            Ok(done) => {
                self.staging.release(staging, done);
                Ok(())
            }
            Err(e) => {
                // Operations already enqueued keep the memory alive until they finish.
                self.staging.discard(staging);
                Err(e)
            }
        }
    }

    /// `dst[i] = dst[i] op src[i]`, `src` on rank `from`, `dst` on rank `to`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &mut self,
        ranks: &[RankIo],
        from: usize,
        src: &Slice,
        to: usize,
        dst: &Slice,
        op: BinaryOp,
        dtype: DType,
    ) -> Result<()> {
        self.reduce_onto(ranks, from, src, to, dst, dst, op, dtype)
    }

    /// `dst[i] = base[i] op src[i]`, `src` on rank `from`, `base` and `dst` on rank `to`
    /// (identical or disjoint): a reduction that also moves the result, so an
    /// out-of-place operation needs no separate copy of its input.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_onto(
        &mut self,
        ranks: &[RankIo],
        from: usize,
        src: &Slice,
        to: usize,
        base: &Slice,
        dst: &Slice,
        op: BinaryOp,
        dtype: DType,
    ) -> Result<()> {
        if src.len == 0 {
            return Ok(());
        }
        let st = ranks[to].stream.clone();
        match self.path(from, to) {
            Path::Local => {
                // Two ranks on one device have two streams: order them by events.
                let sf = ranks[from].stream.clone();
                if from != to {
                    let ready = sf.record_event()?;
                    st.wait_event(&ready)?;
                }
                if base.same_as(dst) {
                    st.accumulate(op, dtype, dst.buf(), src.buf())?;
                } else {
                    st.binary(op, dtype, base.buf(), src.buf(), dst.buf())?;
                }
                if from != to {
                    let read = st.record_event()?;
                    sf.wait_event(&read)?;
                }
                Ok(())
            }
            path => {
                let elem = dtype.size() as u64;
                let unit = if path == Path::Staged {
                    self.staged_piece
                } else {
                    self.reduce_piece
                };
                let piece = (unit / elem).max(1) * elem;
                let scratch = self.scratch(ranks, to, piece.min(src.len))?;
                let sf = ranks[from].stream.clone();
                if path == Path::Peer {
                    let ready = sf.record_event()?;
                    st.wait_event(&ready)?;
                }
                let mut off = 0;
                while off < src.len {
                    let n = piece.min(src.len - off);
                    let tmp = Slice {
                        alloc: scratch.clone(),
                        offset: 0,
                        len: n,
                    };
                    if path == Path::Peer {
                        st.copy_peer(src.sub(off, n).buf(), tmp.buf())?;
                    } else {
                        self.staged_piece_to(ranks, from, &src.sub(off, n), to, &tmp)?;
                    }
                    let d = dst.sub(off, n);
                    if base.same_as(dst) {
                        st.accumulate(op, dtype, d.buf(), tmp.buf())?;
                    } else {
                        st.binary(op, dtype, base.sub(off, n).buf(), tmp.buf(), d.buf())?;
                    }
                    off += n;
                }
                if path == Path::Peer {
                    let read = st.record_event()?;
                    sf.wait_event(&read)?;
                }
                Ok(())
            }
        }
    }
}

fn grow(slot: &mut Option<Allocation>, device: &Device, bytes: u64) -> Result<Allocation> {
    match slot {
        Some(a) if a.size() >= bytes => Ok(a.clone()),
        _ => {
            // Work already enqueued on the old buffer keeps it alive until it completes.
            let a = device.allocate(bytes.max(1))?;
            *slot = Some(a.clone());
            Ok(a)
        }
    }
}
