//! Binary trees: NCCL's double binary tree for all-reduce, one tree for reduce and
//! broadcast.
//!
//! The tree is NCCL's: rank r's parent clears r's lowest set bit and sets the next one
//! up (or only clears it, past the last rank), so odd ranks are leaves and the depth is
//! about log₂ n. The second tree of all-reduce mirrors the first (r → n−1−r) when n is
//! even and shifts it by one when n is odd, so every rank is a leaf in one of the trees
//! (with an odd n but rank 0, the first tree's root, which has a single child there).
//! Each tree reduces half of the buffer up to its root and
//! broadcasts it back down, in pieces, so that the levels of the tree work at once.

use xpu_hal::Result;

use super::Run;
use crate::comm::transport::Slice;

/// The parent of rank `r` in NCCL's binary tree over `n` ranks rooted at rank 0.
fn btree_parent(n: usize, r: usize) -> Option<usize> {
    if r == 0 || r >= n {
        return None;
    }
    let bit = 1usize << r.trailing_zeros();
    let up = (r ^ bit) | (bit << 1);
    Some(if up >= n { r ^ bit } else { up })
}

/// A tree over the ranks: each rank's parent.
pub(super) struct Tree {
    parent: Vec<Option<usize>>,
}

impl Tree {
    /// NCCL's binary tree over `n` ranks with rank `root` at its top.
    pub fn rooted(n: usize, root: usize) -> Self {
        Tree {
            parent: (0..n)
                .map(|r| btree_parent(n, (r + n - root) % n).map(|u| (u + root) % n))
                .collect(),
        }
    }

    /// The two complementary trees of all-reduce.
    pub fn double(n: usize) -> [Tree; 2] {
        let second = (0..n)
            .map(|r| {
                if n.is_multiple_of(2) {
                    btree_parent(n, n - 1 - r).map(|u| n - 1 - u)
                } else {
                    btree_parent(n, (r + n - 1) % n).map(|u| (u + 1) % n)
                }
            })
            .collect();
        [Tree::rooted(n, 0), Tree { parent: second }]
    }

    fn depth(&self, mut r: usize) -> usize {
        let mut d = 0;
        while let Some(p) = self.parent[r] {
            r = p;
            d += 1;
            if d > self.parent.len() {
                break;
            }
        }
        d
    }

    /// The edges (child, parent), deepest children first: the order of a reduction,
    /// where every rank has received from its children before it sends up.
    pub fn upward(&self) -> Vec<(usize, usize)> {
        let mut edges: Vec<(usize, usize, usize)> = self
            .parent
            .iter()
            .enumerate()
            .filter_map(|(c, p)| p.map(|p| (self.depth(c), c, p)))
            .collect();
        edges.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        edges.into_iter().map(|(_, c, p)| (c, p)).collect()
    }

    /// Whether `r` has children.
    pub fn interior(&self, r: usize) -> bool {
        self.parent.contains(&Some(r))
    }

    /// The levels below the root, the longest path: what the cost model calls the depth.
    pub fn height(&self) -> usize {
        (0..self.parent.len())
            .map(|r| self.depth(r))
            .max()
            .unwrap_or(0)
    }
}

/// The depth of the double binary tree over `n` ranks (the deeper of the two).
pub(crate) fn double_tree_depth(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    Tree::double(n).iter().map(Tree::height).max().unwrap_or(0)
}

impl Run<'_> {
    /// Reduces `[off, off + len)` up `tree`: every interior rank's `work` becomes its
    /// own `send` combined with its children's `work` (a leaf's `work` is its `send`).
    fn reduce_up(
        &mut self,
        tree: &Tree,
        edges: &[(usize, usize)],
        work: &[Slice],
        (off, len): (u64, u64),
    ) -> Result<()> {
        let (op, dtype) = (self.combine(), self.dtype()?);
        let mut started = vec![false; self.n()];
        for &(c, p) in edges {
            let base = if started[p] {
                work[p].sub(off, len)
            } else {
                self.send(p)?.sub(off, len)
            };
            started[p] = true;
            debug_assert!(tree.interior(p));
            self.transport.reduce_onto(
                self.ranks,
                c,
                &work[c].sub(off, len),
                p,
                &base,
                &work[p].sub(off, len),
                op,
                dtype,
            )?;
        }
        Ok(())
    }

    /// Double binary tree all-reduce: half of the buffer per tree, reduced up in pieces,
    /// then broadcast down in pieces. Needs two ranks or more.
    pub(super) fn tree_all_reduce(&mut self) -> Result<()> {
        let n = self.n();
        let trees = Tree::double(n);
        let halves = self.chunks_of(self.bytes, 2);
        let pieces: Vec<Vec<(u64, u64)>> =
            halves.iter().map(|&(o, l)| self.pieces_of(o, l)).collect();
        let up: Vec<Vec<(usize, usize)>> = trees.iter().map(Tree::upward).collect();
        let mut work: Vec<Vec<Slice>> = Vec::with_capacity(2);
        for tree in &trees {
            work.push(
                (0..n)
                    .map(|r| {
                        if tree.interior(r) {
                            self.recv(r)
                        } else {
                            self.send(r)
                        }
                    })
                    .collect::<Result<_>>()?,
            );
        }
        let count = pieces.iter().map(Vec::len).max().unwrap_or(0);
        for k in 0..count {
            for t in 0..2 {
                if let Some(&piece) = pieces[t].get(k) {
                    self.reduce_up(&trees[t], &up[t], &work[t], piece)?;
                }
            }
        }
        for k in 0..count {
            for t in 0..2 {
                if let Some(&(off, len)) = pieces[t].get(k) {
                    for &(c, p) in up[t].iter().rev() {
                        let s = self.recv(p)?.sub(off, len);
                        let d = self.recv(c)?.sub(off, len);
                        self.transport.copy(self.ranks, p, &s, c, &d)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reduce up one binary tree rooted at the root into `target`; interior ranks other
    /// than the root combine into a working copy.
    pub(super) fn tree_reduce(&mut self, target: &Slice) -> Result<()> {
        let (n, root) = (self.n(), self.root);
        if n == 1 {
            let s = self.send(root)?;
            return self.transport.copy(self.ranks, root, &s, root, target);
        }
        let tree = Tree::rooted(n, root);
        let up = tree.upward();
        let mut work = Vec::with_capacity(n);
        for r in 0..n {
            work.push(if r == root {
                target.clone()
            } else if tree.interior(r) {
                self.transport.temp(self.ranks, r, self.bytes)?
            } else {
                self.send(r)?
            });
        }
        for piece in self.pieces() {
            self.reduce_up(&tree, &up, &work, piece)?;
        }
        Ok(())
    }

    /// Broadcast down one binary tree rooted at the root, whose data is `src` (its own
    /// receive buffer already holds it).
    pub(super) fn tree_broadcast(&mut self, src: &Slice) -> Result<()> {
        let (n, root) = (self.n(), self.root);
        let tree = Tree::rooted(n, root);
        let up = tree.upward();
        for (off, len) in self.pieces() {
            for &(c, p) in up.iter().rev() {
                let s = if p == root {
                    src.sub(off, len)
                } else {
                    self.recv(p)?.sub(off, len)
                };
                let d = self.recv(c)?.sub(off, len);
                self.transport.copy(self.ranks, p, &s, c, &d)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_is_a_leaf_in_one_tree() {
        for n in 2..=33 {
            let [a, b] = Tree::double(n);
            for r in 0..n {
                if a.interior(r) && b.interior(r) {
                    // Only the first root of an odd count, with a single child there.
                    assert!(
                        n % 2 == 1 && r == 0,
                        "n = {n}: rank {r} is interior in both"
                    );
                    assert_eq!(a.parent.iter().filter(|p| **p == Some(0)).count(), 1);
                }
            }
            for t in [&a, &b] {
                // One root, every other rank reaches it.
                assert_eq!(t.parent.iter().filter(|p| p.is_none()).count(), 1);
                assert_eq!(t.upward().len(), n - 1);
                assert!(t.height() <= 2 + n.ilog2() as usize, "n = {n}");
                // Binary: at most two children per rank.
                for r in 0..n {
                    assert!(t.parent.iter().filter(|p| **p == Some(r)).count() <= 2);
                }
            }
        }
    }

    #[test]
    fn rooted_trees_have_their_root_on_top() {
        for n in 1..=9 {
            for root in 0..n {
                let t = Tree::rooted(n, root);
                assert_eq!(t.parent[root], None);
                assert_eq!(t.parent.iter().filter(|p| p.is_none()).count(), 1);
            }
        }
    }
}
