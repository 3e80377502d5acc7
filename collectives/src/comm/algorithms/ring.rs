//! Rings and pipelined chains: the bandwidth-optimal building blocks the other
//! algorithms reuse.
//!
//! - **ring all-reduce**: a reduce-scatter ring (n−1 steps, each member reducing the
//!   chunk it receives into its destination) followed by an all-gather ring (n−1 steps,
//!   each forwarding the finished chunk): every member sends 2(n−1)/n of the buffer.
//! - **ring all-gather** and **reduce-scatter**: n−1 steps of one block each.
//! - **chains**: pipelined in pieces ([`Run::pieces_of`]) from the first member through
//!   the others (broadcast) or from the last to the first (reduce), so a chain of g
//!   members costs about one buffer plus g−2 pieces of time.

use xpu_hal::Result;

use super::Run;
use crate::comm::transport::Slice;

impl Run<'_> {
    /// A ring all-reduce among `members` (ranks, in ring order): `dst[k]` becomes the
    /// reduction of every `src`; each `src[k]` and `dst[k]` are identical or disjoint.
    pub(super) fn ring_all_reduce(
        &mut self,
        members: &[usize],
        src: &[Slice],
        dst: &[Slice],
    ) -> Result<()> {
        let n = members.len();
        let (op, dtype) = (self.combine(), self.dtype()?);
        if n == 1 {
            return self
                .transport
                .copy(self.ranks, members[0], &src[0], members[0], &dst[0]);
        }
        // Reduce-scatter: at step s member k passes chunk k−s on — its own input at the
        // first step, the partial it received at the step before later — and its
        // successor writes `its input op that` into its destination. Every member
        // receives every chunk but its own once here, and its own in the all-gather
        // below, so no initial copy of the input is needed.
        let chunks = self.chunks_of(self.bytes, n);
        for step in 0..n - 1 {
            for k in 0..n {
                let next = (k + 1) % n;
                let (off, len) = chunks[(k + n - step) % n];
                let from = if step == 0 { &src[k] } else { &dst[k] };
                let base = src[next].sub(off, len);
                let d = dst[next].sub(off, len);
                self.transport.reduce_onto(
                    self.ranks,
                    members[k],
                    &from.sub(off, len),
                    members[next],
                    &base,
                    &d,
                    op,
                    dtype,
                )?;
            }
        }
        for step in 0..n - 1 {
            for k in 0..n {
                let next = (k + 1) % n;
                let (off, len) = chunks[(k + 1 + n - step) % n];
                let s = dst[k].sub(off, len);
                let d = dst[next].sub(off, len);
                self.transport
                    .copy(self.ranks, members[k], &s, members[next], &d)?;
            }
        }
        Ok(())
    }

    /// A chain ending at `members[0]`, which ends with the reduction of every member's
    /// send buffer in `target`: the last member starts, each member combines what it
    /// receives with its own input into a working copy and passes that on, piece by piece
    /// so that the links work at once.
    pub(super) fn chain_reduce(&mut self, members: &[usize], target: &Slice) -> Result<()> {
        let sends = self.sends(members)?;
        self.chain_reduce_from(members, &sends, target, false)
    }

    /// [`Run::chain_reduce`] over `sends[k]` as member `k`'s input; with `scratch`, the
    /// inputs are the algorithm's own buffers, which the chain may overwrite.
    pub(super) fn chain_reduce_from(
        &mut self,
        members: &[usize],
        sends: &[Slice],
        target: &Slice,
        scratch: bool,
    ) -> Result<()> {
        let g = members.len();
        let (op, dtype) = (self.combine(), self.dtype()?);
        if g == 1 {
            return self
                .transport
                .copy(self.ranks, members[0], &sends[0], members[0], target);
        }
        let mut work = Vec::with_capacity(g);
        for (k, &r) in members.iter().enumerate() {
            if k == 0 {
                work.push(target.clone());
            } else if k == g - 1 || scratch {
                work.push(sends[k].clone());
            } else {
                work.push(self.transport.temp(self.ranks, r, target.len)?);
            }
        }
        for (off, len) in self.pieces_of(0, target.len) {
            for k in (1..g).rev() {
                self.transport.reduce_onto(
                    self.ranks,
                    members[k],
                    &work[k].sub(off, len),
                    members[k - 1],
                    &sends[k - 1].sub(off, len),
                    &work[k - 1].sub(off, len),
                    op,
                    dtype,
                )?;
            }
        }
        Ok(())
    }

    /// Element-aligned pieces of the buffer for pipelined chains.
    pub(super) fn pieces(&self) -> Vec<(u64, u64)> {
        self.pieces_of(0, self.bytes)
    }

    /// Element-aligned pieces of `[start, start + len)`.
    pub(super) fn pieces_of(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let elem = self.elem();
        let piece = (self.transport.staged_piece.max(elem) / elem) * elem;
        let mut out = Vec::new();
        let mut off = 0;
        while off < len {
            let l = piece.min(len - off);
            out.push((start + off, l));
            off += l;
        }
        out
    }

    /// A pipelined chain from `members[0]`, whose data is `src`, through the others'
    /// receive buffers in order (their first `src.len` bytes).
    pub(super) fn chain_broadcast(&mut self, members: &[usize], src: &Slice) -> Result<()> {
        for (off, len) in self.pieces_of(0, src.len) {
            for k in 0..members.len().saturating_sub(1) {
                let (a, b) = (members[k], members[k + 1]);
                let s = if k == 0 {
                    src.sub(off, len)
                } else {
                    self.recv(a)?.sub(off, len)
                };
                let d = self.recv(b)?.sub(off, len);
                self.transport.copy(self.ranks, a, &s, b, &d)?;
            }
        }
        Ok(())
    }

    /// The ring all-gather, once every rank's own block is in place: at step s each
    /// rank passes on the block it received at the step before.
    pub(super) fn ring_all_gather(&mut self) -> Result<()> {
        let n = self.n();
        let block = self.bytes;
        for step in 0..n - 1 {
            for r in 0..n {
                let next = (r + 1) % n;
                let b = ((r + n - step) % n) as u64;
                let s = self.recv(r)?.sub(b * block, block);
                let d = self.recv(next)?.sub(b * block, block);
                self.transport.copy(self.ranks, r, &s, next, &d)?;
            }
        }
        Ok(())
    }

    /// The ring reduce-scatter: every rank works on a copy of its input; at step s each
    /// rank reduces a block into its successor's copy, and after n−1 steps rank r's
    /// block r is complete.
    pub(super) fn ring_reduce_scatter(&mut self) -> Result<()> {
        let n = self.n();
        let block = self.bytes;
        let (op, dtype) = (self.combine(), self.dtype()?);
        let mut work = Vec::with_capacity(n);
        for r in 0..n {
            let s = self.send(r)?;
            let t = self.transport.temp(self.ranks, r, s.len)?;
            self.transport.copy(self.ranks, r, &s, r, &t)?;
            work.push(t);
        }
        for step in 0..n - 1 {
            for r in 0..n {
                let next = (r + 1) % n;
                let b = ((r + 2 * n - step - 1) % n) as u64;
                let s = work[r].sub(b * block, block);
                let d = work[next].sub(b * block, block);
                self.transport
                    .reduce(self.ranks, r, &s, next, &d, op, dtype)?;
            }
        }
        for (r, w) in work.iter().enumerate() {
            let d = self.recv(r)?;
            self.transport
                .copy(self.ranks, r, &w.sub(r as u64 * block, block), r, &d)?;
        }
        Ok(())
    }
}
