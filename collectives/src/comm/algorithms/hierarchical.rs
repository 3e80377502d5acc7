//! Hierarchical all-reduce over the topology's groups of well-connected devices
//! ([`crate::topology::Topology::groups`]).
//!
//! Each group reduces to its leader (its first rank) along a pipelined chain, the leaders
//! all-reduce among themselves in a ring, and each leader broadcasts the result to its
//! group along a chain. Only the leaders' ring crosses the slow links between groups, and
//! it carries 2(m−1)/m of the buffer for m groups rather than 2(n−1)/n over n ranks with
//! n−1 slow latencies. With a single group, or a group per rank, it is the plain ring.

use xpu_hal::Result;

use super::Run;

/// Whether `groups` make the hierarchical algorithm differ from the ring: more than one
/// group, and one of them with more than one rank.
pub(crate) fn is_hierarchical(groups: &[Vec<usize>]) -> bool {
    groups.len() > 1 && groups.iter().any(|g| g.len() > 1)
}

impl Run<'_> {
    /// See the module docs. Needs two ranks or more.
    pub(super) fn hierarchical_all_reduce(&mut self) -> Result<()> {
        let groups: Vec<Vec<usize>> = self
            .groups
            .iter()
            .filter(|g| !g.is_empty())
            .cloned()
            .collect();
        let covers_all = {
            let mut seen = vec![false; self.n()];
            for &r in groups.iter().flatten() {
                if let Some(s) = seen.get_mut(r) {
                    *s = true;
                }
            }
            seen.iter().all(|s| *s) && groups.iter().map(Vec::len).sum::<usize>() == self.n()
        };
        if !covers_all || !is_hierarchical(&groups) {
            let all = self.everyone();
            let (src, dst) = (self.sends(&all)?, self.recvs(&all)?);
            return self.ring_all_reduce(&all, &src, &dst);
        }
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
}
