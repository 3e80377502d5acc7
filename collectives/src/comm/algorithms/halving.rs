//! Recursive halving and doubling (Rabenseifner's all-reduce).
//!
//! Ranks pair up at distances p/2, p/4 … 1 (p a power of two): at each step the two
//! partners split the range they are responsible for, and each reduces the half it keeps
//! with its partner's copy of that half, so after log₂ p steps participant i holds the
//! reduction of the i-th part (recursive halving, a reduce-scatter). Recursive doubling
//! runs the steps backwards, the partners exchanging their finished ranges (an
//! all-gather). Every rank sends (p−1)/p of the buffer in each phase, in log₂ p steps.
//!
//! When the rank count n is not a power of two, the `n − p` extra ranks fold in first,
//! as MPICH does: among the first 2(n − p) ranks every even rank sends its data to the
//! odd rank after it, which reduces it and takes part for both; the even ranks take no
//! further part and receive their result at the end. A participant then covers the
//! contiguous blocks of the ranks it stands for, so reduce-scatter and all-gather keep
//! their rank-ordered layout.

use xpu_hal::Result;

use super::Run;
use crate::comm::transport::Slice;

/// Who takes part in the halving and doubling among `n` ranks.
pub(super) struct Fold {
    /// Participants: the largest power of two not above `n`.
    pub p: usize,
    /// Extra ranks folded into a partner.
    rem: usize,
}

impl Fold {
    pub fn new(n: usize) -> Self {
        let p = if n == 0 {
            0
        } else {
            1usize << (usize::BITS - 1 - n.leading_zeros())
        };
        Fold { p, rem: n - p }
    }

    /// The rank that takes part as participant `i`.
    pub fn rank(&self, i: usize) -> usize {
        if i < self.rem {
            2 * i + 1
        } else {
            i + self.rem
        }
    }

    /// The extra rank folded into participant `i`, if any.
    pub fn extra(&self, i: usize) -> Option<usize> {
        (i < self.rem).then_some(2 * i)
    }

    /// The first rank whose block participant `i` covers (`n` for `i == p`).
    fn first(&self, i: usize) -> usize {
        if i < self.rem {
            2 * i
        } else {
            i + self.rem
        }
    }
}

impl Run<'_> {
    /// Recursive halving among the participants of `fold`: participant i's `work` ends
    /// with the reduction over all participants of `[bound[i], bound[i + 1])`. `init[i]`
    /// holds participant i's data before it writes `work[i]` (identical to `work[i]`, or
    /// disjoint from it).
    fn halving(
        &mut self,
        fold: &Fold,
        bound: &[u64],
        init: &[Slice],
        work: &[Slice],
    ) -> Result<()> {
        let (op, dtype) = (self.combine(), self.dtype()?);
        let p = fold.p;
        let mut cur: Vec<Slice> = init.to_vec();
        let mut range: Vec<(usize, usize)> = vec![(0, p); p];
        let mut mask = p / 2;
        while mask > 0 {
            let next: Vec<(usize, usize)> = (0..p)
                .map(|i| {
                    let (lo, hi) = range[i];
                    let mid = (lo + hi) / 2;
                    if i & mask == 0 {
                        (lo, mid)
                    } else {
                        (mid, hi)
                    }
                })
                .collect();
            for (i, &(lo, hi)) in next.iter().enumerate() {
                // Participant i combines its partner's copy of the half it keeps.
                let j = i ^ mask;
                let (off, len) = (bound[lo], bound[hi] - bound[lo]);
                self.transport.reduce_onto(
                    self.ranks,
                    fold.rank(j),
                    &cur[j].sub(off, len),
                    fold.rank(i),
                    &cur[i].sub(off, len),
                    &work[i].sub(off, len),
                    op,
                    dtype,
                )?;
            }
            cur = work.to_vec();
            range = next;
            mask /= 2;
        }
        Ok(())
    }

    /// Recursive doubling among the participants of `fold`: participant i's `work`
    /// starts with `[bound[i], bound[i + 1])` and ends with everything.
    fn doubling(&mut self, fold: &Fold, bound: &[u64], work: &[Slice]) -> Result<()> {
        let p = fold.p;
        let mut range: Vec<(usize, usize)> = (0..p).map(|i| (i, i + 1)).collect();
        let mut mask = 1;
        while mask < p {
            for i in 0..p {
                let j = i ^ mask;
                let (lo, hi) = range[j];
                let (off, len) = (bound[lo], bound[hi] - bound[lo]);
                self.transport.copy(
                    self.ranks,
                    fold.rank(j),
                    &work[j].sub(off, len),
                    fold.rank(i),
                    &work[i].sub(off, len),
                )?;
            }
            range = (0..p)
                .map(|i| {
                    let (a, b) = (range[i], range[i ^ mask]);
                    (a.0.min(b.0), a.1.max(b.1))
                })
                .collect();
            mask *= 2;
        }
        Ok(())
    }

    /// All-reduce: fold, recursive halving over p equal parts, recursive doubling,
    /// unfold. Participants work in their receive buffers. Needs two ranks or more.
    pub(super) fn halving_all_reduce(&mut self) -> Result<()> {
        let fold = Fold::new(self.n());
        let (op, dtype) = (self.combine(), self.dtype()?);
        let mut bound: Vec<u64> = self
            .chunks_of(self.bytes, fold.p)
            .iter()
            .map(|c| c.0)
            .collect();
        bound.push(self.bytes);
        let (mut init, mut work) = (Vec::with_capacity(fold.p), Vec::with_capacity(fold.p));
        for i in 0..fold.p {
            let r = fold.rank(i);
            let (s, d) = (self.send(r)?, self.recv(r)?);
            match fold.extra(i) {
                Some(e) => {
                    let es = self.send(e)?;
                    self.transport
                        .reduce_onto(self.ranks, e, &es, r, &s, &d, op, dtype)?;
                    init.push(d.clone());
                }
                None => init.push(s),
            }
            work.push(d);
        }
        self.halving(&fold, &bound, &init, &work)?;
        self.doubling(&fold, &bound, &work)?;
        for (i, w) in work.iter().enumerate() {
            if let Some(e) = fold.extra(i) {
                let d = self.recv(e)?;
                self.transport.copy(self.ranks, fold.rank(i), w, e, &d)?;
            }
        }
        Ok(())
    }

    /// Reduce-scatter: participants reduce whole send buffers into working copies;
    /// each ends with the blocks of the ranks it stands for and hands them out.
    pub(super) fn halving_reduce_scatter(&mut self) -> Result<()> {
        let n = self.n();
        let block = self.bytes;
        let (op, dtype) = (self.combine(), self.dtype()?);
        if n == 1 {
            let (s, d) = (self.send(0)?, self.recv(0)?);
            return self.transport.copy(self.ranks, 0, &s.sub(0, block), 0, &d);
        }
        let fold = Fold::new(n);
        let bound: Vec<u64> = (0..=fold.p).map(|i| fold.first(i) as u64 * block).collect();
        let (mut init, mut work) = (Vec::with_capacity(fold.p), Vec::with_capacity(fold.p));
        for i in 0..fold.p {
            let r = fold.rank(i);
            let s = self.send(r)?;
            let t = self.transport.temp(self.ranks, r, s.len)?;
            match fold.extra(i) {
                Some(e) => {
                    let es = self.send(e)?;
                    self.transport
                        .reduce_onto(self.ranks, e, &es, r, &s, &t, op, dtype)?;
                    init.push(t.clone());
                }
                None => init.push(s),
            }
            work.push(t);
        }
        self.halving(&fold, &bound, &init, &work)?;
        for (i, w) in work.iter().enumerate() {
            for q in fold.first(i)..fold.first(i + 1) {
                let d = self.recv(q)?;
                let s = w.sub(q as u64 * block, block);
                self.transport.copy(self.ranks, fold.rank(i), &s, q, &d)?;
            }
        }
        Ok(())
    }

    /// All-gather (every rank's own block already in place): extra ranks hand their
    /// block to their partner, recursive doubling among the participants, and the
    /// partners hand everything else back.
    pub(super) fn halving_all_gather(&mut self) -> Result<()> {
        let n = self.n();
        if n == 1 {
            return Ok(());
        }
        let block = self.bytes;
        let fold = Fold::new(n);
        let bound: Vec<u64> = (0..=fold.p).map(|i| fold.first(i) as u64 * block).collect();
        let mut work = Vec::with_capacity(fold.p);
        for i in 0..fold.p {
            let r = fold.rank(i);
            let d = self.recv(r)?;
            if let Some(e) = fold.extra(i) {
                let s = self.send(e)?;
                let at = d.sub(e as u64 * block, block);
                self.transport.copy(self.ranks, e, &s, r, &at)?;
            }
            work.push(d);
        }
        self.doubling(&fold, &bound, &work)?;
        let total = n as u64 * block;
        for (i, w) in work.iter().enumerate() {
            if let Some(e) = fold.extra(i) {
                // Everything but the extra rank's own block.
                let d = self.recv(e)?;
                let own = e as u64 * block;
                let r = fold.rank(i);
                self.transport
                    .copy(self.ranks, r, &w.sub(0, own), e, &d.sub(0, own))?;
                let rest = own + block;
                self.transport.copy(
                    self.ranks,
                    r,
                    &w.sub(rest, total - rest),
                    e,
                    &d.sub(rest, total - rest),
                )?;
            }
        }
        Ok(())
    }
}
