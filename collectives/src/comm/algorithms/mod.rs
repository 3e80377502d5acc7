//! The algorithms, written with the two primitives of the transport (`comm/transport.rs`).
//!
//! - **ring** (`ring.rs`): ranks pass chunks to their successor. All-reduce is a
//!   reduce-scatter ring (n−1 steps, each rank reducing the chunk it receives) followed by
//!   an all-gather ring (n−1 steps, each forwarding the finished chunk): every rank sends
//!   2(n−1)/n of the buffer, the bandwidth-optimal amount. Broadcast and reduce run as
//!   pipelined chains.
//! - **direct** (this module): every rank reads what it needs straight from every other
//!   rank — one step, the latency-optimal choice for small messages.
//! - **halving-doubling** (`halving.rs`): Rabenseifner's all-reduce, a reduce-scatter by
//!   recursive halving and an all-gather by recursive doubling, log₂ n steps each; also
//!   reduce-scatter and all-gather on their own. Rank counts that are not a power of two
//!   fold their extra ranks into partners first, as MPICH does.
//! - **tree** (`tree.rs`): NCCL's double binary tree for all-reduce (two complementary
//!   trees, each reducing half of the buffer up and broadcasting it down, in pieces), and
//!   one binary tree rooted at the root for reduce and broadcast.
//! - **hierarchical** (`hierarchical.rs`): all-reduce within the topology's groups of
//!   well-connected devices to each group's leader, a ring among the leaders, and a
//!   broadcast within each group; reduce, broadcast, all-gather and reduce-scatter
//!   likewise cross the slow links between groups only among the leaders.
//!
//! All enqueueing happens on the ranks' own streams, in an order that only waits on
//! events already recorded, so the dependency graph has no cycles.

mod halving;
mod hierarchical;
mod native;
mod ring;
mod tree;

pub(crate) use hierarchical::is_hierarchical;
pub(crate) use native::group_reduce;
pub(crate) use tree::double_tree_depth;

use xpu_hal::{BinaryOp, DType, Error, Result};

use super::op::{avg_factor, Collective, ReduceOp};
use super::transport::{RankIo, Slice, Transport};

/// Which algorithm runs an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Chunks passed around a ring (pipelined chains for rooted operations).
    Ring,
    /// Every rank exchanges with every other directly, in one step.
    Direct,
    /// Recursive halving and doubling between pairs of ranks (Rabenseifner).
    HalvingDoubling,
    /// Binary trees: two complementary ones for all-reduce, one for rooted operations.
    Tree,
    /// Within groups of well-connected devices, then among the groups' leaders.
    Hierarchical,
    /// The ranks' own threads read and write each other's memory directly
    /// (`shared_memory/`); only when every buffer is host addressable and every stream
    /// idle.
    SharedMemory,
    /// The devices' own collective library, when their backend offers one over the
    /// communicator's devices: NCCL for CUDA devices, a plugin's native collectives
    /// (ABI 1.3) for its NPUs (`native.rs`).
    Native,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 7] = [
        Algorithm::Ring,
        Algorithm::Direct,
        Algorithm::HalvingDoubling,
        Algorithm::Tree,
        Algorithm::Hierarchical,
        Algorithm::SharedMemory,
        Algorithm::Native,
    ];

    /// The lowercase name (`ring`, `direct`, `halving-doubling`, `tree`, `hierarchical`,
    /// `shared-memory`, `native`).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Direct => "direct",
            Algorithm::HalvingDoubling => "halving-doubling",
            Algorithm::Tree => "tree",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::SharedMemory => "shared-memory",
            Algorithm::Native => "native",
        }
    }

    /// The algorithm named `name` (`nccl` is also taken for `native`, its name when
    /// NCCL was the only library).
    pub fn from_name(name: &str) -> Option<Algorithm> {
        let name = name.trim();
        if name.eq_ignore_ascii_case("nccl") {
            return Some(Algorithm::Native);
        }
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// Whether the algorithm implements `kind` (all-to-all, barriers and send/receive
    /// are direct only).
    pub const fn implements(self, kind: Collective) -> bool {
        match self {
            Algorithm::Direct => true,
            // Hierarchical runs rings and chains within and among groups.
            Algorithm::Ring | Algorithm::Hierarchical => matches!(
                kind,
                Collective::AllReduce
                    | Collective::Reduce
                    | Collective::Broadcast
                    | Collective::AllGather
                    | Collective::ReduceScatter
            ),
            Algorithm::HalvingDoubling => matches!(
                kind,
                Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
            ),
            Algorithm::Tree => matches!(
                kind,
                Collective::AllReduce | Collective::Reduce | Collective::Broadcast
            ),
            Algorithm::SharedMemory => !matches!(kind, Collective::SendRecv),
            Algorithm::Native => !matches!(kind, Collective::SendRecv | Collective::Barrier),
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One rank's buffers for the operation being run.
#[derive(Clone, Debug)]
pub(crate) struct RankBuffers {
    pub send: Option<Slice>,
    pub recv: Option<Slice>,
}

/// Everything an algorithm needs.
pub(crate) struct Run<'a> {
    pub ranks: &'a [RankIo],
    pub buffers: &'a [RankBuffers],
    pub transport: &'a mut Transport,
    pub algorithm: Algorithm,
    pub kind: Collective,
    pub bytes: u64,
    pub dtype: Option<DType>,
    pub op: Option<ReduceOp>,
    pub root: usize,
    /// The topology's groups of well-connected ranks, for hierarchical algorithms.
    pub groups: &'a [Vec<usize>],
    /// The devices' own collective library, when the communicator has one.
    pub native: Option<&'a dyn xpu_hal::group::CollectiveGroup>,
}

/// Shared-memory execution runs in the ranks' threads (`shared_memory/`), never here.
fn not_enqueued() -> Error {
    Error::backend_message(
        "collectives",
        "internal error: shared-memory execution reached the enqueueing path",
    )
}

fn missing(what: &str, rank: usize) -> Error {
    Error::backend_message(
        "collectives",
        format!("internal error: rank {rank} has no {what} buffer"),
    )
}

impl Run<'_> {
    fn n(&self) -> usize {
        self.ranks.len()
    }

    fn send(&self, r: usize) -> Result<Slice> {
        self.buffers[r]
            .send
            .clone()
            .ok_or_else(|| missing("send", r))
    }

    fn recv(&self, r: usize) -> Result<Slice> {
        self.buffers[r]
            .recv
            .clone()
            .ok_or_else(|| missing("receive", r))
    }

    fn elem(&self) -> u64 {
        self.dtype.map_or(1, |d| d.size() as u64)
    }

    fn combine(&self) -> BinaryOp {
        self.op.map_or(BinaryOp::Sum, ReduceOp::combine)
    }

    fn dtype(&self) -> Result<DType> {
        self.dtype
            .ok_or_else(|| Error::backend_message("collectives", "internal error: no dtype"))
    }

    /// `parts` element-aligned chunks of `bytes`, as (offset, length).
    fn chunks_of(&self, bytes: u64, parts: usize) -> Vec<(u64, u64)> {
        let elem = self.elem();
        let elems = bytes / elem;
        let n = parts as u64;
        (0..n)
            .map(|i| {
                let start = elems * i / n;
                let end = elems * (i + 1) / n;
                (start * elem, (end - start) * elem)
            })
            .collect()
    }

    /// Runs the operation.
    pub fn execute(&mut self) -> Result<()> {
        if self.algorithm == Algorithm::SharedMemory {
            return Err(not_enqueued());
        }
        if self.algorithm == Algorithm::Native {
            return self.native();
        }
        if !self.algorithm.implements(self.kind) {
            return Err(Error::backend_message(
                "collectives",
                format!(
                    "internal error: {} does not implement {}",
                    self.algorithm, self.kind
                ),
            ));
        }
        match self.kind {
            Collective::AllReduce => self.all_reduce(),
            Collective::Reduce => self.reduce(),
            Collective::Broadcast => self.broadcast(),
            Collective::AllGather => self.all_gather(),
            Collective::ReduceScatter => self.reduce_scatter(),
            Collective::AllToAll => self.all_to_all(),
            Collective::Barrier => self.barrier(),
            Collective::SendRecv => Err(Error::backend_message(
                "collectives",
                "internal error: send/recv is not a collective run",
            )),
        }
    }

    /// Every rank, in order.
    fn everyone(&self) -> Vec<usize> {
        (0..self.n()).collect()
    }

    /// Every rank, in order from the root (wrapping around).
    fn rooted_order(&self) -> Vec<usize> {
        let n = self.n();
        (0..n).map(|k| (self.root + k) % n).collect()
    }

    /// Each rank's send buffer, by rank.
    fn sends(&self, ranks: &[usize]) -> Result<Vec<Slice>> {
        ranks.iter().map(|&r| self.send(r)).collect()
    }

    /// Each rank's receive buffer, by rank.
    fn recvs(&self, ranks: &[usize]) -> Result<Vec<Slice>> {
        ranks.iter().map(|&r| self.recv(r)).collect()
    }

    fn all_reduce(&mut self) -> Result<()> {
        let n = self.n();
        if n == 1 {
            let (s, d) = (self.send(0)?, self.recv(0)?);
            self.transport.copy(self.ranks, 0, &s, 0, &d)?;
        } else {
            match self.algorithm {
                Algorithm::Ring => {
                    let all = self.everyone();
                    let (src, dst) = (self.sends(&all)?, self.recvs(&all)?);
                    self.ring_all_reduce(&all, &src, &dst)?;
                }
                Algorithm::Direct => self.direct_all_reduce()?,
                Algorithm::HalvingDoubling => self.halving_all_reduce()?,
                Algorithm::Tree => self.tree_all_reduce()?,
                Algorithm::Hierarchical => self.hierarchical_all_reduce()?,
                Algorithm::SharedMemory | Algorithm::Native => return Err(not_enqueued()),
            }
        }
        for r in 0..n {
            let d = self.recv(r)?;
            self.finish_avg(r, &d)?;
        }
        Ok(())
    }

    fn direct_all_reduce(&mut self) -> Result<()> {
        let n = self.n();
        let (op, dtype) = (self.combine(), self.dtype()?);
        // Sources must keep their values while every rank reads them: read from the send
        // buffers, or from a copy of them when the operation is in place.
        let sources = self.pristine_sources()?;
        for (r, source) in sources.iter().enumerate() {
            let d = self.recv(r)?;
            self.transport.copy(self.ranks, r, source, r, &d)?;
        }
        for r in 0..n {
            let d = self.recv(r)?;
            for q in (0..n).filter(|&q| q != r) {
                self.transport
                    .reduce(self.ranks, q, &sources[q], r, &d, op, dtype)?;
            }
        }
        Ok(())
    }

    /// The send buffers, or per-rank copies of them where a rank's send and receive
    /// buffers overlap.
    fn pristine_sources(&mut self) -> Result<Vec<Slice>> {
        (0..self.n())
            .map(|r| {
                let s = self.send(r)?;
                match &self.buffers[r].recv {
                    Some(d) if d.overlaps(&s) => {
                        let t = self.transport.temp(self.ranks, r, s.len)?;
                        self.transport.copy(self.ranks, r, &s, r, &t)?;
                        Ok(t)
                    }
                    _ => Ok(s),
                }
            })
            .collect()
    }

    fn reduce(&mut self) -> Result<()> {
        let (n, root) = (self.n(), self.root);
        let (op, dtype) = (self.combine(), self.dtype()?);
        let target = self.recv(root)?;
        match self.algorithm {
            Algorithm::Direct => {
                let s = self.send(root)?;
                let own = if target.overlaps(&s) && !target.same_as(&s) {
                    let t = self.transport.temp(self.ranks, root, s.len)?;
                    self.transport.copy(self.ranks, root, &s, root, &t)?;
                    t
                } else {
                    s
                };
                self.transport.copy(self.ranks, root, &own, root, &target)?;
                for q in (0..n).filter(|&q| q != root) {
                    let s = self.send(q)?;
                    self.transport
                        .reduce(self.ranks, q, &s, root, &target, op, dtype)?;
                }
            }
            Algorithm::Tree => self.tree_reduce(&target)?,
            Algorithm::Hierarchical => self.hierarchical_reduce(&target)?,
            _ => {
                let members = self.rooted_order();
                self.chain_reduce(&members, &target)?;
            }
        }
        self.finish_avg(root, &target)
    }

    fn broadcast(&mut self) -> Result<()> {
        let (n, root) = (self.n(), self.root);
        let dst_root = self.recv(root)?;
        let src = self.buffers[root].send.clone().unwrap_or(dst_root.clone());
        self.transport
            .copy(self.ranks, root, &src, root, &dst_root)?;
        match self.algorithm {
            Algorithm::Direct => {
                for r in (0..n).filter(|&r| r != root) {
                    let d = self.recv(r)?;
                    self.transport.copy(self.ranks, root, &src, r, &d)?;
                }
            }
            Algorithm::Tree => self.tree_broadcast(&src)?,
            Algorithm::Hierarchical => self.hierarchical_broadcast(&src)?,
            _ => {
                let members = self.rooted_order();
                self.chain_broadcast(&members, &src)?;
            }
        }
        Ok(())
    }

    fn all_gather(&mut self) -> Result<()> {
        let n = self.n();
        let block = self.bytes;
        for r in 0..n {
            let s = self.send(r)?;
            let d = self.recv(r)?.sub(r as u64 * block, block);
            self.transport.copy(self.ranks, r, &s, r, &d)?;
        }
        match self.algorithm {
            Algorithm::Direct => {
                for r in 0..n {
                    for q in (0..n).filter(|&q| q != r) {
                        let s = self.recv(q)?.sub(q as u64 * block, block);
                        let d = self.recv(r)?.sub(q as u64 * block, block);
                        self.transport.copy(self.ranks, q, &s, r, &d)?;
                    }
                }
            }
            Algorithm::HalvingDoubling => self.halving_all_gather()?,
            Algorithm::Hierarchical => self.hierarchical_all_gather()?,
            _ => self.ring_all_gather()?,
        }
        Ok(())
    }

    fn reduce_scatter(&mut self) -> Result<()> {
        let n = self.n();
        let block = self.bytes;
        let (op, dtype) = (self.combine(), self.dtype()?);
        match self.algorithm {
            Algorithm::Direct => {
                let sources = self.pristine_sources()?;
                for (r, source) in sources.iter().enumerate() {
                    let d = self.recv(r)?;
                    let own = source.sub(r as u64 * block, block);
                    self.transport.copy(self.ranks, r, &own, r, &d)?;
                }
                for r in 0..n {
                    let d = self.recv(r)?;
                    for q in (0..n).filter(|&q| q != r) {
                        let s = sources[q].sub(r as u64 * block, block);
                        self.transport.reduce(self.ranks, q, &s, r, &d, op, dtype)?;
                    }
                }
            }
            Algorithm::HalvingDoubling => self.halving_reduce_scatter()?,
            Algorithm::Hierarchical => self.hierarchical_reduce_scatter()?,
            _ => self.ring_reduce_scatter()?,
        }
        for r in 0..n {
            let d = self.recv(r)?;
            self.finish_avg(r, &d)?;
        }
        Ok(())
    }

    fn all_to_all(&mut self) -> Result<()> {
        let n = self.n();
        let block = self.bytes;
        for r in 0..n {
            for k in 0..n {
                // Rank r receives from r, r−1, r−2 … so that senders are spread out.
                let q = (r + n - k) % n;
                let s = self.send(q)?.sub(r as u64 * block, block);
                let d = self.recv(r)?.sub(q as u64 * block, block);
                self.transport.copy(self.ranks, q, &s, r, &d)?;
            }
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let events = self
            .ranks
            .iter()
            .map(|r| r.stream.record_event())
            .collect::<Result<Vec<_>>>()?;
        for (r, io) in self.ranks.iter().enumerate() {
            for (q, e) in events.iter().enumerate() {
                if q != r {
                    io.stream.wait_event(e)?;
                }
            }
        }
        Ok(())
    }

    /// Divides a finished sum by the number of ranks, for [`ReduceOp::Avg`].
    fn finish_avg(&mut self, rank: usize, buf: &Slice) -> Result<()> {
        if self.op != Some(ReduceOp::Avg) || buf.len == 0 {
            return Ok(());
        }
        let dtype = self.dtype()?;
        let stream = self.ranks[rank].stream.clone();
        let factor = avg_factor(dtype, self.n());
        if factor.dtype() == dtype {
            return stream.scale(buf.buf(), buf.buf(), factor);
        }
        // Integers: through f64 (see `avg_factor`).
        let device = &self.ranks[rank].device;
        if !device.capabilities().supports_dtype(DType::F64) {
            return Err(Error::unsupported(format!(
                "an integer average on {} is computed through f64, which its builtin operations do not support; reduce with sum and divide",
                device.id()
            )));
        }
        let count = buf.len / dtype.size() as u64;
        let wide = self.transport.temp(self.ranks, rank, count * 8)?;
        stream.cast(buf.buf(), dtype, wide.buf(), DType::F64)?;
        stream.scale(wide.buf(), wide.buf(), factor)?;
        stream.cast(wide.buf(), DType::F64, buf.buf(), dtype)
    }
}
