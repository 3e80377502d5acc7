//! The fixed order in which a step's micro-batch gradients are summed, and what the
//! replicas exchange to follow it.
//!
//! The sum over `M` micro-batches is a fixed binary tree: node `(level, start)`, with
//! `start` a multiple of `2^level`, covers micro-batches `[start, min(start + 2^level,
//! M))`; a node is its left child plus its right child, or just its left child when the
//! right one would start past `M`. The tree does not depend on the split, so neither do
//! the bits of the sum.
//!
//! A replica computes a contiguous range of micro-batches. It sums them up to the
//! largest nodes that lie wholly inside its range (its *blocks*: at most about
//! `2·log₂ M` of them, usually one or two) and the replicas exchange only the blocks'
//! sums: each writes its blocks into its own rows of a `[K, elements]` buffer that is
//! zero elsewhere, the buffers are all-reduced (adding zeros is exact), and every
//! replica finishes the tree above the blocks. Exchanging `K` rows instead of all `M`
//! micro-batches' gradients is what keeps the all-reduce small; a single replica has
//! one or two blocks and exchanges nothing.

/// A node of the summation tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    /// Its height: 0 for one micro-batch.
    pub(crate) level: u32,
    /// Its first micro-batch.
    pub(crate) start: u64,
}

impl Node {
    /// The micro-batches it covers, of `m`.
    pub(crate) fn range(self, m: u64) -> std::ops::Range<u64> {
        self.start..(self.start + (1u64 << self.level)).min(m)
    }

    /// Its children, the right one only when it starts before `m`.
    pub(crate) fn children(self, m: u64) -> Option<(Node, Option<Node>)> {
        if self.level == 0 {
            return None;
        }
        let left = Node {
            level: self.level - 1,
            start: self.start,
        };
        let right_start = self.start + (1u64 << (self.level - 1));
        let right = (right_start < m).then_some(Node {
            level: self.level - 1,
            start: right_start,
        });
        Some((left, right))
    }
}

/// The root of the tree over `m` micro-batches (`m` at least 1).
pub(crate) fn root(m: u64) -> Node {
    Node {
        level: m.max(1).next_power_of_two().trailing_zeros(),
        start: 0,
    }
}

/// The largest nodes wholly inside `range`, in order (the canonical decomposition).
pub(crate) fn blocks(m: u64, range: std::ops::Range<u64>) -> Vec<Node> {
    fn walk(node: Node, m: u64, range: &std::ops::Range<u64>, out: &mut Vec<Node>) {
        let r = node.range(m);
        if r.start >= range.end || r.end <= range.start {
            return;
        }
        if range.start <= r.start && r.end <= range.end {
            out.push(node);
            return;
        }
        if let Some((left, right)) = node.children(m) {
            walk(left, m, range, out);
            if let Some(right) = right {
                walk(right, m, range, out);
            }
        }
    }
    let mut out = Vec::new();
    if m > 0 && range.start < range.end {
        walk(root(m), m, &range, &mut out);
    }
    out
}

/// How one step's sum is shared: every replica's blocks and their rows in the
/// exchange buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Micro-batches per step.
    pub(crate) m: u64,
    /// Per replica, its blocks with their rows in the exchange buffer.
    pub(crate) blocks: Vec<Vec<(Node, u64)>>,
    /// Rows of the exchange buffer: the blocks of all replicas.
    pub(crate) rows: u64,
}

impl Plan {
    /// The plan for `shares` (micro-batches per replica, in rank order, over
    /// contiguous ranges).
    pub(crate) fn new(shares: &[u64]) -> Plan {
        let m: u64 = shares.iter().sum();
        let mut rows = 0;
        let blocks = crate::split::ranges(shares)
            .into_iter()
            .map(|range| {
                blocks(m, range)
                    .into_iter()
                    .map(|node| {
                        rows += 1;
                        (node, rows - 1)
                    })
                    .collect()
            })
            .collect();
        Plan { m, blocks, rows }
    }

    /// The block (of any replica) that is `node`, with its owner and row. (Walking down
    /// from the root meets a block before the nodes below it that cover the same
    /// micro-batches.)
    pub(crate) fn block(&self, node: Node) -> Option<(usize, u64)> {
        self.blocks.iter().enumerate().find_map(|(owner, bs)| {
            bs.iter()
                .find(|(b, _)| *b == node)
                .map(|&(_, row)| (owner, row))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sum of `values` by the tree, as a string of its additions.
    fn order(node: Node, m: u64) -> String {
        match node.children(m) {
            None => node.start.to_string(),
            Some((left, None)) => order(left, m),
            Some((left, Some(right))) => format!("({}+{})", order(left, m), order(right, m)),
        }
    }

    #[test]
    fn the_tree_is_fixed_by_the_number_of_micro_batches() {
        assert_eq!(order(root(8), 8), "(((0+1)+(2+3))+((4+5)+(6+7)))");
        assert_eq!(order(root(6), 6), "(((0+1)+(2+3))+(4+5))");
        assert_eq!(order(root(5), 5), "(((0+1)+(2+3))+4)");
        assert_eq!(order(root(1), 1), "0");
    }

    #[test]
    fn blocks_are_the_largest_nodes_inside_a_range() {
        let starts =
            |m, r| -> Vec<(u32, u64)> { blocks(m, r).iter().map(|n| (n.level, n.start)).collect() };
        assert_eq!(starts(8, 0..8), [(3, 0)]);
        assert_eq!(starts(8, 0..4), [(2, 0)]);
        assert_eq!(starts(8, 0..3), [(1, 0), (0, 2)]);
        assert_eq!(starts(8, 3..8), [(0, 3), (2, 4)]);
        assert_eq!(starts(8, 3..3), []);
        // A node cut short by M covers the same micro-batches as its left child: the
        // higher one is the block.
        assert_eq!(starts(5, 4..5), [(2, 4)]);
        assert_eq!(starts(6, 0..6), [(3, 0)]);
        for m in 1..40u64 {
            for a in 0..=m {
                for c in a..=m {
                    let bs = blocks(m, a..c);
                    // They tile the range, in order.
                    let mut at = a;
                    for b in &bs {
                        assert_eq!(b.range(m).start, at, "{m} {a}..{c}");
                        at = b.range(m).end;
                    }
                    assert_eq!(at, if bs.is_empty() { a } else { c }, "{m} {a}..{c}");
                    assert!(bs.len() as u32 <= 2 * (64 - m.leading_zeros()), "{m}");
                }
            }
        }
    }

    #[test]
    fn a_plan_gives_every_block_one_row() {
        let p = Plan::new(&[3, 5]);
        assert_eq!(p.rows, 4);
        assert_eq!(p.blocks[0].iter().map(|b| b.1).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(
            p.blocks[1],
            [
                (Node { level: 0, start: 3 }, 2),
                (Node { level: 2, start: 4 }, 3)
            ]
        );
        assert_eq!(Plan::new(&[4, 4]).rows, 2);
        assert_eq!(Plan::new(&[8, 0]).rows, 1);
        assert_eq!(
            Plan::new(&[4, 4]).block(Node { level: 2, start: 4 }),
            Some((1, 1))
        );
        assert_eq!(Plan::new(&[4, 4]).block(root(8)), None);
    }
}
