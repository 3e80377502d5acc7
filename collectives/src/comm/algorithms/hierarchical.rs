//! Hierarchical all-reduce, reduce and broadcast over the topology's groups of
//! well-connected devices ([`crate::topology::Topology::groups`]).
//!
//! All-reduce: each group reduces to its leader (its first rank) along a pipelined chain,
//! the leaders all-reduce among themselves in a ring, and each leader broadcasts the
//! result to its group along a chain. Only the leaders' ring crosses the slow links
//! between groups, and it carries 2(m−1)/m of the buffer for m groups rather than
//! 2(n−1)/n over n ranks with n−1 slow latencies. With a single group, or a group per
//! rank, it is the plain ring.
//!
//! Reduce and broadcast make the root its group's leader: a reduce runs the chains within
//! groups and then one through the leaders to the root; a broadcast runs them the other
//! way round. The slow links carry the buffer once per group instead of once per rank
//! beyond them. Without a hierarchy they are the plain chains.
//!
//! All-gather: the members copy their blocks to their leader, the leaders pass whole
//! groups' blocks around a ring, and each leader broadcasts the gathered buffer to its
//! group along a chain. Reduce-scatter runs the other way: each group reduces the whole
//! input to its leader along a chain, the leaders run a ring reduce-scatter whose chunks
//! are the groups' blocks, and each leader hands its members their blocks. Either way a
//! slow link carries each group's blocks once rather than a block per ring step. Without
//! a hierarchy they are the plain rings.

use xpu_hal::Result;

use super::Run;
use crate::comm::transport::Slice;

/// `ranks` as runs of consecutive ranks, `(first, count)`, so that blocks of
/// neighbouring ranks move in one copy.
fn runs(ranks: &[usize]) -> Vec<(usize, usize)> {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for r in sorted {
        match out.last_mut() {
            Some((first, count)) if *first + *count == r => *count += 1,
            _ => out.push((r, 1)),
        }
    }
    out
}

/// Whether `groups` make the hierarchical algorithm differ from the ring: more than one
/// group, and one of them with more than one rank.
pub(crate) fn is_hierarchical(groups: &[Vec<usize>]) -> bool {
    groups.len() > 1 && groups.iter().any(|g| g.len() > 1)
}

impl Run<'_> {
    /// The topology's groups when they make a hierarchy (see [`is_hierarchical`]) and
    /// cover every rank once; `None` otherwise. With `root`, the root leads its group and
    /// its group comes first.
    fn hierarchy(&self, root: Option<usize>) -> Option<Vec<Vec<usize>>> {
        let mut groups: Vec<Vec<usize>> = self
            .groups
            .iter()
            .filter(|g| !g.is_empty())
            .cloned()
            .collect();
        let mut seen = vec![false; self.n()];
        for &r in groups.iter().flatten() {
            match seen.get_mut(r) {
                Some(s) if !*s => *s = true,
                _ => return None,
            }
        }
        if !seen.iter().all(|s| *s) || !is_hierarchical(&groups) {
            return None;
        }
        if let Some(root) = root {
            let at = groups.iter().position(|g| g.contains(&root))?;
            let mut own = groups.remove(at);
            own.retain(|&r| r != root);
            own.insert(0, root);
            groups.insert(0, own);
        }
        Some(groups)
    }

    /// See the module docs. Needs two ranks or more.
    pub(super) fn hierarchical_all_reduce(&mut self) -> Result<()> {
        let Some(groups) = self.hierarchy(None) else {
            let all = self.everyone();
            let (src, dst) = (self.sends(&all)?, self.recvs(&all)?);
            return self.ring_all_reduce(&all, &src, &dst);
        };
        for g in &groups {
            let target = self.recv(g[0])?;
            self.chain_reduce(g, &target)?;
        }
        let leaders: Vec<usize> = groups.iter().map(|g| g[0]).collect();
        let sums = self.recvs(&leaders)?;
        self.ring_all_reduce(&leaders, &sums, &sums)?;
        for g in &groups {
            let src = self.recv(g[0])?;
            self.chain_broadcast(g, &src)?;
        }
        Ok(())
    }

    /// A reduce to the root: each group reduces to its leader along a chain (the root's
    /// group to the root, into `target`; the others into their leader's working buffer),
    /// then a chain through the leaders ends at the root. Only the leaders' chain
    /// crosses the slow links, once per group. Without a hierarchy, one chain.
    pub(super) fn hierarchical_reduce(&mut self, target: &Slice) -> Result<()> {
        let Some(groups) = self.hierarchy(Some(self.root)) else {
            let members = self.rooted_order();
            return self.chain_reduce(&members, target);
        };
        let mut partials = Vec::with_capacity(groups.len());
        for (i, g) in groups.iter().enumerate() {
            let partial = match i {
                0 => target.clone(),
                _ => self.transport.temp(self.ranks, g[0], self.bytes)?,
            };
            self.chain_reduce(g, &partial)?;
            partials.push(partial);
        }
        let leaders: Vec<usize> = groups.iter().map(|g| g[0]).collect();
        self.chain_reduce_from(&leaders, &partials, target, true)
    }

    /// A broadcast from the root: a chain through the groups' leaders (the root first),
    /// then a chain within each group from its leader. Without a hierarchy, one chain.
    pub(super) fn hierarchical_broadcast(&mut self, src: &Slice) -> Result<()> {
        let Some(groups) = self.hierarchy(Some(self.root)) else {
            let members = self.rooted_order();
            return self.chain_broadcast(&members, src);
        };
        let leaders: Vec<usize> = groups.iter().map(|g| g[0]).collect();
        self.chain_broadcast(&leaders, src)?;
        for (i, g) in groups.iter().enumerate() {
            let from = match i {
                0 => src.clone(),
                _ => self.recv(g[0])?,
            };
            self.chain_broadcast(g, &from)?;
        }
        Ok(())
    }

    /// See the module docs; every rank's own block is already in place.
    pub(super) fn hierarchical_all_gather(&mut self) -> Result<()> {
        let Some(groups) = self.hierarchy(None) else {
            return self.ring_all_gather();
        };
        let block = self.bytes;
        let span = |(first, count): (usize, usize)| (first as u64 * block, count as u64 * block);
        for g in &groups {
            let leader = self.recv(g[0])?;
            for &q in &g[1..] {
                let (off, len) = span((q, 1));
                let s = self.recv(q)?.sub(off, len);
                self.transport
                    .copy(self.ranks, q, &s, g[0], &leader.sub(off, len))?;
            }
        }
        let m = groups.len();
        for step in 0..m - 1 {
            for k in 0..m {
                let next = (k + 1) % m;
                let (a, b) = (groups[k][0], groups[next][0]);
                for run in runs(&groups[(k + m - step) % m]) {
                    let (off, len) = span(run);
                    let s = self.recv(a)?.sub(off, len);
                    let d = self.recv(b)?.sub(off, len);
                    self.transport.copy(self.ranks, a, &s, b, &d)?;
                }
            }
        }
        for g in &groups {
            let all = self.recv(g[0])?;
            self.chain_broadcast(g, &all)?;
        }
        Ok(())
    }

    /// See the module docs.
    pub(super) fn hierarchical_reduce_scatter(&mut self) -> Result<()> {
        let Some(groups) = self.hierarchy(None) else {
            return self.ring_reduce_scatter();
        };
        let (op, dtype) = (self.combine(), self.dtype()?);
        let block = self.bytes;
        let span = |(first, count): (usize, usize)| (first as u64 * block, count as u64 * block);
        let total = block * self.n() as u64;
        let mut partials = Vec::with_capacity(groups.len());
        for g in &groups {
            let partial = self.transport.temp(self.ranks, g[0], total)?;
            let sends = self.sends(g)?;
            self.chain_reduce_from(g, &sends, &partial, false)?;
            partials.push(partial);
        }
        let m = groups.len();
        for step in 0..m - 1 {
            for k in 0..m {
                let next = (k + 1) % m;
                let (a, b) = (groups[k][0], groups[next][0]);
                for run in runs(&groups[(k + 2 * m - step - 1) % m]) {
                    let (off, len) = span(run);
                    let s = partials[k].sub(off, len);
                    let d = partials[next].sub(off, len);
                    self.transport.reduce(self.ranks, a, &s, b, &d, op, dtype)?;
                }
            }
        }
        for (g, partial) in groups.iter().zip(&partials) {
            for &q in g {
                let (off, len) = span((q, 1));
                let d = self.recv(q)?;
                self.transport
                    .copy(self.ranks, g[0], &partial.sub(off, len), q, &d)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_join_consecutive_ranks_in_any_order() {
        assert_eq!(runs(&[3, 0, 1, 5, 4]), vec![(0, 2), (3, 3)]);
        assert_eq!(runs(&[2]), vec![(2, 1)]);
        assert!(runs(&[]).is_empty());
    }
}
