//! Choosing an algorithm: an α-β cost model over the topology's links, and overrides.
//!
//! Each link has a latency α (µs) and a time per byte β (from its bandwidth). For an
//! operation of `S` bytes per rank on `n` ranks the model estimates:
//!
//! | operation | algorithm | modelled time |
//! |---|---|---|
//! | all-reduce | ring | 2(n−1)·(α_r + S/n·β_r) |
//! | all-reduce | direct | max_r Σ_{q≠r} (α_qr + S·β_qr) |
//! | all-reduce | halving-doubling | H(S, S, S, 2) |
//! | all-reduce | tree | 2·(D·α + (S + (D−1)·min(P, S/2))·β) |
//! | all-reduce | hierarchical | 2·((g−1)·α_g + (S + (g−2)·q)·β_g) + 2(m−1)·(α_l + S/m·β_l) |
//! | reduce, broadcast | ring (a chain) | (n−1)·α_r + (S + (n−2)·q)·β_r |
//! | reduce, broadcast | direct | max_r Σ_{q≠r} (α_qr + S·β_qr) |
//! | reduce, broadcast | tree | D_1·α + (2S + (D_1−1)·q)·β |
//! | reduce, broadcast | hierarchical | (g−1)·α_g + (S + (g−2)·q)·β_g + (m−1)·α_l + (S + (m−2)·q)·β_l |
//! | all-gather, reduce-scatter | ring | (n−1)·(α_r + S·β_r) |
//! | all-gather, reduce-scatter | direct | max_r Σ_{q≠r} (α_qr + S·β_qr) |
//! | all-gather, reduce-scatter | halving-doubling | H(nS, nS, S, 1) |
//! | all-gather, reduce-scatter | hierarchical | (g−1)·(α_g + S·β_g) + (g−1)·α_g + (nS + (g−2)·q_n)·β_g + (m−1)·(α_l + g·S·β_l) |
//! | all-reduce | shared memory | α_m + S·β_m |
//! | reduce, broadcast | shared memory | α_m + (n+1)/(2n)·S·β_m |
//! | all-gather, reduce-scatter, all-to-all | shared memory | α_m + (n+1)/2·S·β_m |
//!
//! where α_qr and β_qr are the link from q to r: direct exchanges go one after another on
//! each rank's stream, so the busiest receiver sets the time. H(T, F_in, F_out, k) is
//! halving-doubling over the pairs it uses: the extra ranks' fold (F_in bytes into their
//! partners, F_out back), then log₂ p steps of T/2, T/4 … bytes between participants,
//! each as long as its slowest pair, run k times (halving, then doubling), where `p` is
//! the largest power of two not above n. `P` is the
//! piece of pipelined chains and trees ([`CHAIN_PIECE`]) and `q = min(P, S)` (`q_n =
//! min(P, nS)`), `D` the depth of the double binary tree and `D_1` of one binary tree.
//! The ring's α_r and β_r come from the slowest link between ring neighbours; the tree's
//! α and β from the slowest link of all. Hierarchical uses the topology's groups
//! ([`Topology::groups`]): `m` groups of at most `g` ranks, α_g and β_g from the slowest
//! link within a group, α_l and β_l from the slowest link between neighbouring leaders.
//! With one group, or a group per rank, it runs the ring and costs the same. All-to-all
//! and barriers have one enqueued algorithm (direct); an algorithm has no estimate for an
//! operation it does not implement.
//!
//! Every algorithm that reduces on the devices also pays for its reductions: the busiest
//! rank's reduced bytes times its device's γ (µs per byte of the builtin reduction,
//! measured by calibration, else estimated: [`crate::topology::GPU_REDUCE_GBPS`] for a
//! GPU, two thirds of its own copy speed for other devices), added to the time above. Per rank, with `S` bytes per rank:
//!
//! | operation | algorithm | bytes rank r reduces |
//! |---|---|---|
//! | all-reduce | ring | (n−1)/n·S |
//! | all-reduce | direct | (n−1)·S |
//! | all-reduce | halving-doubling | (p−1)/p·S, + S for a rank an extra one folds into, 0 for the extra |
//! | all-reduce | tree | S |
//! | all-reduce | hierarchical | S unless last in its group's chain, + (m−1)/m·S for a leader |
//! | reduce | ring (a chain), direct, tree | S, (n−1)·S, 2S |
//! | reduce | hierarchical | S unless last in its group's chain, + S for a leader |
//! | reduce-scatter | ring, direct | (n−1)·S |
//! | reduce-scatter | halving-doubling | as for all-reduce, of n·S |
//! | reduce-scatter | hierarchical | n·S unless last in its group's chain, + (m−1)·g·S for a leader |
//!
//! This matters where a device reduces far slower than it copies: lavapipe and the
//! simulated NPU accumulate at about 0.25 GB/s here against 4–9 GB/s for a copy, which
//! makes every rank reducing everyone's buffer (direct) the worst choice there.
//!
//! Shared memory (`shared_memory/`) is chosen whenever it has an estimate, which it has
//! only when every device is host addressable: α_m is two rendezvous of running threads ([`SHARED_MEMORY_ALPHA`]) and
//! β_m the slowest device's copy within its own memory; the factors are the bytes each
//! rank reads and writes, in units of one copy of S. It runs only when every buffer has
//! a host view and every stream is idle; otherwise the best enqueued algorithm runs.
//!
//! `XPU_COLL_ALGO` overrides the model per operation and size range: a comma list of
//! `OPERATION:ALGORITHM[:MIN-MAX]`, sizes in bytes with optional `K`, `M`, `G` (binary)
//! and `max`, e.g. `allreduce:ring:1M-max,allreduce:halving-doubling:4K-1M,broadcast:tree`.
//! An override naming an algorithm that does not implement the operation is ignored.

use xpu_hal::{Error, Result};

use super::algorithms::{double_tree_depth, is_hierarchical, Algorithm};
use super::op::Collective;
use crate::topology::Topology;

/// Pieces of pipelined chains and trees, bytes (the model's `P`).
pub const CHAIN_PIECE: u64 = 4 << 20;

/// The latency of a shared-memory operation, µs (the model's α_m): an arrival and a
/// completion rendezvous of threads that spin.
pub const SHARED_MEMORY_ALPHA: f64 = 1.0;

/// The figures the model needs, read once from the topology.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Ranks.
    pub n: usize,
    /// Latency of the slowest ring link, µs.
    pub ring_alpha: f64,
    /// µs per byte of the slowest ring link.
    pub ring_beta: f64,
    /// Latency of the slowest link of all, µs.
    pub all_alpha: f64,
    /// µs per byte of the slowest link of all.
    pub all_beta: f64,
    /// The depth of the double binary tree (`D`).
    pub tree_depth: usize,
    /// The hierarchical algorithm's groups, when they make it differ from the ring.
    pub groups: Option<GroupFigures>,
    /// µs per byte of the slowest device's copy within its own memory (β_m), when every
    /// device is host addressable and shared-memory execution can run.
    pub shared_memory_beta: Option<f64>,
    /// The devices' own collective library, when the communicator has one (NCCL for
    /// CUDA devices, a plugin's native collectives).
    pub native: Option<NativeFigures>,
    /// Per rank: µs per byte of destination of its device's builtin reduction (γ).
    pub reduce_beta: Vec<f64>,
    /// Every ordered pair's (α µs, β µs per byte), row-major `n × n`, for the algorithms
    /// whose steps use particular pairs (direct, halving-doubling); empty: every pair is
    /// the slowest link (`all_alpha`, `all_beta`).
    pub links: Vec<(f64, f64)>,
    /// The topology's groups, in rank order, when they make the hierarchical algorithm
    /// differ from the ring (else empty).
    pub hierarchy: Vec<Vec<usize>>,
}

/// What the model knows of the devices' own collective library.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeFigures {
    /// Its name and version, for the reasons the selector gives.
    pub library: String,
    /// Its own figures (latency µs, µs per byte of bus traffic), when it states them.
    pub cost: Option<(f64, f64)>,
}

impl NativeFigures {
    /// The figures of `group`.
    pub fn of(group: &dyn xpu_hal::group::CollectiveGroup) -> Self {
        NativeFigures {
            library: group.library(),
            cost: group
                .cost()
                .filter(|c| c.bus_bytes_per_s > 0.0)
                .map(|c| (c.latency.as_secs_f64() * 1e6, 1e6 / c.bus_bytes_per_s)),
        }
    }
}

/// What the model knows of the topology's groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupFigures {
    /// Groups (`m`).
    pub count: usize,
    /// Ranks in the largest group (`g`).
    pub largest: usize,
    /// Latency of the slowest link within a group, µs.
    pub inner_alpha: f64,
    /// µs per byte of the slowest link within a group.
    pub inner_beta: f64,
    /// Latency of the slowest link between neighbouring leaders, µs.
    pub leader_alpha: f64,
    /// µs per byte of the slowest link between neighbouring leaders.
    pub leader_beta: f64,
}

/// µs per byte at `gbps` GB/s.
pub(crate) fn beta(gbps: f64) -> f64 {
    1.0 / (gbps.max(1e-6) * 1e3)
}

/// The slowest (α, β) among `pairs` of positions in `t`.
fn slowest(t: &Topology, pairs: impl Iterator<Item = (usize, usize)>) -> (f64, f64) {
    let (mut a, mut b) = (0.0f64, 0.0f64);
    for (x, y) in pairs.filter(|(x, y)| x != y) {
        if let Ok(l) = t.link(x, y) {
            a = a.max(l.latency_us);
            b = b.max(beta(l.bandwidth_gbps));
        }
    }
    (a, b)
}

impl CostModel {
    /// The model of a communicator over the topology's devices in order.
    pub fn from_topology(t: &Topology) -> Self {
        let n = t.len();
        let all = |n: usize| (0..n).flat_map(move |a| (0..n).map(move |b| (a, b)));
        let (all_alpha, all_beta) = slowest(t, all(n));
        let (ring_alpha, ring_beta) = slowest(t, all(n).filter(|&(a, b)| b == (a + 1) % n));
        let groups = t.groups();
        let figures = is_hierarchical(&groups).then(|| {
            let (inner_alpha, inner_beta) = slowest(
                t,
                groups
                    .iter()
                    .flat_map(|g| g.iter().flat_map(move |&a| g.iter().map(move |&b| (a, b)))),
            );
            let leaders: Vec<usize> = groups.iter().map(|g| g[0]).collect();
            let m = leaders.len();
            let (leader_alpha, leader_beta) = slowest(
                t,
                (0..m).flat_map(|k| {
                    let (a, b) = (leaders[k], leaders[(k + 1) % m]);
                    [(a, b), (b, a)]
                }),
            );
            GroupFigures {
                count: m,
                largest: groups.iter().map(Vec::len).max().unwrap_or(1),
                inner_alpha,
                inner_beta,
                leader_alpha,
                leader_beta,
            }
        });
        CostModel {
            n,
            ring_alpha,
            ring_beta,
            all_alpha,
            all_beta,
            tree_depth: double_tree_depth(n),
            groups: figures,
            shared_memory_beta: None,
            native: None,
            reduce_beta: (0..n).map(|r| t.reduce_beta(r)).collect(),
            links: all(n)
                .map(|(a, b)| {
                    t.link(a, b).map_or((all_alpha, all_beta), |l| {
                        (l.latency_us, beta(l.bandwidth_gbps))
                    })
                })
                .collect(),
            hierarchy: if is_hierarchical(&groups) {
                groups
            } else {
                Vec::new()
            },
        }
    }

    /// The bytes rank `r` reduces in `kind` with `algorithm` on `s` bytes per rank (see
    /// the module docs).
    fn reduced_bytes(&self, kind: Collective, algorithm: Algorithm, r: usize, s: f64) -> f64 {
        let n = self.n as f64;
        if self.n <= 1 {
            return 0.0;
        }
        let p = (1usize << self.n.ilog2()) as f64;
        // Halving-doubling folds the even ranks among the first 2(n − p) into the odd
        // rank after each (`halving.rs`): those reduce nothing, their partners one more
        // buffer.
        let fold = if r < 2 * (self.n - (1usize << self.n.ilog2())) {
            if r.is_multiple_of(2) {
                None
            } else {
                Some(1.0)
            }
        } else {
            Some(0.0)
        };
        let halving = |total: f64| fold.map_or(0.0, |f| f * total + (p - 1.0) / p * total);
        // Within its group: (not the chain's last member, leader, groups, largest group).
        let role = self
            .hierarchy
            .iter()
            .find_map(|g| {
                let k = g.iter().position(|&q| q == r)?;
                Some((k + 1 < g.len(), k == 0))
            })
            .map(|(inner, leader)| {
                let m = self.hierarchy.len() as f64;
                let largest = self.hierarchy.iter().map(Vec::len).max().unwrap_or(1) as f64;
                (
                    f64::from(u8::from(inner)),
                    f64::from(u8::from(leader)),
                    m,
                    largest,
                )
            });
        match (kind, algorithm) {
            (Collective::AllReduce, Algorithm::Ring) => (n - 1.0) / n * s,
            (Collective::AllReduce, Algorithm::Direct) => (n - 1.0) * s,
            (Collective::AllReduce, Algorithm::HalvingDoubling) => halving(s),
            (Collective::AllReduce, Algorithm::Tree) => s,
            (Collective::AllReduce, Algorithm::Hierarchical) => match role {
                Some((inner, leader, m, _)) => inner * s + leader * (m - 1.0) / m * s,
                None => (n - 1.0) / n * s,
            },
            (Collective::Reduce, Algorithm::Ring) => s,
            (Collective::Reduce, Algorithm::Direct) => (n - 1.0) * s,
            (Collective::Reduce, Algorithm::Tree) => 2.0 * s,
            (Collective::Reduce, Algorithm::Hierarchical) => match role {
                Some((inner, leader, _, _)) => (inner + leader) * s,
                None => s,
            },
            (Collective::ReduceScatter, Algorithm::Ring | Algorithm::Direct) => (n - 1.0) * s,
            (Collective::ReduceScatter, Algorithm::HalvingDoubling) => halving(n * s),
            (Collective::ReduceScatter, Algorithm::Hierarchical) => match role {
                Some((inner, leader, m, largest)) => {
                    inner * n * s + leader * (m - 1.0) * largest * s
                }
                None => (n - 1.0) * s,
            },
            _ => 0.0,
        }
    }

    /// The (α, β) of the path from `a` to `b`.
    fn pair(&self, a: usize, b: usize) -> (f64, f64) {
        self.links
            .get(a * self.n + b)
            .copied()
            .unwrap_or((self.all_alpha, self.all_beta))
    }

    /// Direct exchanges of `bytes` between every pair: each rank's stream takes its
    /// transfers one after another, so the busiest receiver sets the time.
    fn direct_us(&self, bytes: f64) -> f64 {
        (0..self.n)
            .map(|r| {
                (0..self.n)
                    .filter(|&q| q != r)
                    .map(|q| {
                        let (a, b) = self.pair(q, r);
                        a + bytes * b
                    })
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
    }

    /// Halving-doubling's link time over its actual pairs (`halving.rs`): the fold of
    /// the extra ranks (`fold` bytes, in and back out), then `log₂ p` steps of `total/2`,
    /// `total/4` … bytes between participants, once (`phases` = 1) or there and back
    /// (2); each step as long as its slowest pair.
    fn halving_us(&self, total: f64, fold: (f64, f64), phases: f64) -> f64 {
        if self.n <= 1 {
            return 0.0;
        }
        let p = 1usize << self.n.ilog2();
        let rem = self.n - p;
        let rank = |i: usize| if i < rem { 2 * i + 1 } else { i + rem };
        let time = |x: usize, y: usize, bytes: f64| {
            let (a, b) = self.pair(x, y);
            a + bytes * b
        };
        let mut fold_in: f64 = 0.0;
        let mut fold_out: f64 = 0.0;
        for i in 0..rem {
            fold_in = fold_in.max(time(2 * i, 2 * i + 1, fold.0));
            fold_out = fold_out.max(time(2 * i + 1, 2 * i, fold.1));
        }
        let mut steps = 0.0;
        let mut bytes = total;
        let mut distance = p / 2;
        while distance >= 1 {
            bytes /= 2.0;
            let mut slowest: f64 = 0.0;
            for i in 0..p {
                slowest = slowest.max(time(rank(i), rank(i ^ distance), bytes));
            }
            steps += slowest;
            distance /= 2;
        }
        fold_in + fold_out + phases * steps
    }

    /// The time the busiest rank spends in builtin reductions, µs.
    fn reduce_us(&self, kind: Collective, algorithm: Algorithm, s: f64) -> f64 {
        self.reduce_beta
            .iter()
            .enumerate()
            .map(|(r, gamma)| self.reduced_bytes(kind, algorithm, r, s) * gamma)
            .fold(0.0, f64::max)
    }

    /// The modelled time of `kind` on `bytes` per rank with `algorithm`, µs; `None` when
    /// the algorithm does not implement the operation.
    pub fn estimate(&self, kind: Collective, algorithm: Algorithm, bytes: u64) -> Option<f64> {
        if !algorithm.implements(kind) {
            return None;
        }
        if algorithm == Algorithm::Native {
            let native = self.native.as_ref()?;
            let (n, s) = (self.n as f64, bytes as f64);
            return Some(match native.cost {
                // The library's own figures, over the bytes nccl-tests' factor counts.
                Some((alpha, beta)) => {
                    let whole = match kind {
                        Collective::AllGather
                        | Collective::ReduceScatter
                        | Collective::AllToAll => n * s,
                        _ => s,
                    };
                    alpha + whole * kind.bus_factor(self.n) * beta
                }
                // No figures: the library picks its own algorithm; the model only says
                // it is there, as the ring it would be at worst.
                None => 2.0 * (n - 1.0) * (self.ring_alpha + s / n.max(1.0) * self.ring_beta),
            });
        }
        if algorithm == Algorithm::SharedMemory {
            let bm = self.shared_memory_beta?;
            let (n, s) = (self.n.max(1) as f64, bytes as f64);
            let copies = match kind {
                Collective::AllReduce => 1.0,
                Collective::Reduce | Collective::Broadcast => (n + 1.0) / (2.0 * n),
                Collective::Barrier => 0.0,
                _ => (n + 1.0) / 2.0,
            };
            return Some(SHARED_MEMORY_ALPHA + copies * s * bm);
        }
        let n = self.n as f64;
        let s = bytes as f64;
        let (ra, rb, a, b) = (
            self.ring_alpha,
            self.ring_beta,
            self.all_alpha,
            self.all_beta,
        );
        let piece = CHAIN_PIECE as f64;
        let q = piece.min(s);
        let chain =
            |g: f64, a: f64, b: f64| (g - 1.0).max(0.0) * a + (s + (g - 2.0).max(0.0) * q) * b;
        let ring_all_reduce = 2.0 * (n - 1.0) * (ra + s / n * rb);
        let links = match (kind, algorithm) {
            (Collective::Barrier | Collective::SendRecv, Algorithm::Direct) => a,
            (_, Algorithm::Direct) => self.direct_us(s),
            (Collective::AllReduce, Algorithm::Ring) => ring_all_reduce,
            (Collective::Reduce | Collective::Broadcast, Algorithm::Ring) => chain(n, ra, rb),
            (_, Algorithm::Ring) => (n - 1.0) * (ra + s * rb),
            (Collective::AllReduce, Algorithm::HalvingDoubling) => self.halving_us(s, (s, s), 2.0),
            (_, Algorithm::HalvingDoubling) => self.halving_us(n * s, (n * s, s), 1.0),
            (Collective::AllReduce, Algorithm::Tree) => {
                let d = self.tree_depth as f64;
                2.0 * (d * a + (s + (d - 1.0).max(0.0) * piece.min(s / 2.0)) * b)
            }
            (_, Algorithm::Tree) => {
                // One binary tree of NCCL's shape: about log₂ n levels below the root.
                let d = if self.n <= 1 {
                    0.0
                } else {
                    (self.n as f64).log2().ceil()
                };
                d * a + (2.0 * s + (d - 1.0).max(0.0) * q) * b
            }
            (_, Algorithm::SharedMemory | Algorithm::Native) => return None,
            (Collective::Reduce | Collective::Broadcast, Algorithm::Hierarchical) => {
                match self.groups {
                    None => chain(n, ra, rb),
                    Some(gf) => {
                        chain(gf.largest as f64, gf.inner_alpha, gf.inner_beta)
                            + chain(gf.count as f64, gf.leader_alpha, gf.leader_beta)
                    }
                }
            }
            (Collective::AllGather | Collective::ReduceScatter, Algorithm::Hierarchical) => {
                match self.groups {
                    None => (n - 1.0) * (ra + s * rb),
                    Some(gf) => {
                        // Blocks to or from the leader, the whole buffer along a chain
                        // within the group, and the leaders' ring over groups' blocks.
                        let (g, m) = (gf.largest as f64, gf.count as f64);
                        let whole = n * s;
                        (g - 1.0) * (gf.inner_alpha + s * gf.inner_beta)
                            + (g - 1.0).max(0.0) * gf.inner_alpha
                            + (whole + (g - 2.0).max(0.0) * piece.min(whole)) * gf.inner_beta
                            + (m - 1.0) * (gf.leader_alpha + g * s * gf.leader_beta)
                    }
                }
            }
            (_, Algorithm::Hierarchical) => match self.groups {
                None => ring_all_reduce,
                Some(gf) => {
                    let m = gf.count as f64;
                    2.0 * chain(gf.largest as f64, gf.inner_alpha, gf.inner_beta)
                        + 2.0 * (m - 1.0) * (gf.leader_alpha + s / m * gf.leader_beta)
                }
            },
        };
        Some(links + self.reduce_us(kind, algorithm, s))
    }
}

/// One override: use `algorithm` for `kind` when the size is in `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Override {
    /// The operation.
    pub kind: Collective,
    /// The algorithm to use.
    pub algorithm: Algorithm,
    /// Smallest size in bytes (inclusive).
    pub min: u64,
    /// Largest size in bytes (inclusive).
    pub max: u64,
}

/// The model plus the user's overrides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    /// Overrides, first match wins.
    pub overrides: Vec<Override>,
}

fn parse_size(text: &str, spec: &str) -> Result<u64> {
    if text.trim().eq_ignore_ascii_case("max") {
        return Ok(u64::MAX);
    }
    xpu_hal::parse_bytes(text).map_err(|e| {
        Error::invalid(format!(
            "XPU_COLL_ALGO entry `{spec}`: `{text}` is not a size ({e}), or max"
        ))
    })
}

impl Selector {
    /// Parses an override list (the syntax of `XPU_COLL_ALGO`; see the module docs).
    pub fn parse(text: &str) -> Result<Self> {
        let mut overrides = Vec::new();
        for spec in text
            .split([',', ';'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let parts: Vec<&str> = spec.split(':').collect();
            let (op, algo, range) = match parts.as_slice() {
                [op, algo] => (*op, *algo, None),
                [op, algo, range] => (*op, *algo, Some(*range)),
                _ => {
                    return Err(Error::invalid(format!(
                        "XPU_COLL_ALGO entry `{spec}` is not OPERATION:ALGORITHM[:MIN-MAX] (e.g. allreduce:ring:1M-max)"
                    )))
                }
            };
            let kind: Collective = op.parse()?;
            let algorithm = Algorithm::from_name(algo).ok_or_else(|| {
                Error::invalid(format!(
                    "XPU_COLL_ALGO entry `{spec}`: unknown algorithm `{algo}`; expected ring, direct, halving-doubling, tree, hierarchical, shared-memory or native (nccl)"
                ))
            })?;
            let (min, max) = match range {
                None => (0, u64::MAX),
                Some(r) => {
                    let (lo, hi) = r.split_once('-').ok_or_else(|| {
                        Error::invalid(format!(
                            "XPU_COLL_ALGO entry `{spec}`: the size range `{r}` is not MIN-MAX"
                        ))
                    })?;
                    (parse_size(lo, spec)?, parse_size(hi, spec)?)
                }
            };
            if min > max {
                return Err(Error::invalid(format!(
                    "XPU_COLL_ALGO entry `{spec}`: the range is empty (minimum above maximum)"
                )));
            }
            overrides.push(Override {
                kind,
                algorithm,
                min,
                max,
            });
        }
        Ok(Selector { overrides })
    }

    /// The overrides in `XPU_COLL_ALGO` (none when it is unset).
    pub fn from_env() -> Result<Self> {
        match std::env::var("XPU_COLL_ALGO") {
            Ok(text) => Self::parse(&text),
            Err(_) => Ok(Selector::default()),
        }
    }

    /// The algorithm an override names for `kind` on `bytes` per rank, if one matches
    /// (whether or not the algorithm implements the operation).
    pub fn forced(&self, kind: Collective, bytes: u64) -> Option<Algorithm> {
        self.overrides
            .iter()
            .find(|o| o.kind == kind && (o.min..=o.max).contains(&bytes))
            .map(|o| o.algorithm)
    }

    /// The algorithm for `kind` on `bytes` per rank, and why it was chosen.
    pub fn choose(&self, model: &CostModel, kind: Collective, bytes: u64) -> (Algorithm, String) {
        self.choose_where(model, kind, bytes, |_| true)
    }

    /// [`Selector::choose`] among the algorithms `allowed` accepts (overrides naming
    /// others are ignored).
    pub fn choose_where(
        &self,
        model: &CostModel,
        kind: Collective,
        bytes: u64,
        allowed: impl Fn(Algorithm) -> bool,
    ) -> (Algorithm, String) {
        if let Some(a) = self.forced(kind, bytes) {
            if allowed(a) && model.estimate(kind, a, bytes).is_some() {
                return (a, "XPU_COLL_ALGO".to_string());
            }
        }
        // The devices' own library: one without figures is tuned for its devices beyond
        // this model, and chosen wherever it implements the operation; one with figures
        // is weighed against the others below.
        let native = model
            .native
            .as_ref()
            .filter(|_| allowed(Algorithm::Native))
            .and_then(|f| Some((f, model.estimate(kind, Algorithm::Native, bytes)?)));
        if let Some((f, _)) = native.filter(|(f, _)| f.cost.is_none()) {
            return (
                Algorithm::Native,
                format!("{}, tuned for these devices", f.library),
            );
        }
        // Shared memory moves the fewest bytes and enqueues nothing: wherever it can run,
        // it is the choice of xpu's own (it falls back to the model's best when a stream
        // is busy), unless the native library's figures beat it.
        if allowed(Algorithm::SharedMemory) {
            if let Some(t) = model.estimate(kind, Algorithm::SharedMemory, bytes) {
                return match native {
                    Some((f, tn)) if tn < t => (
                        Algorithm::Native,
                        format!(
                            "{}: {tn:.1} µs against shared memory's {t:.1} µs",
                            f.library
                        ),
                    ),
                    _ => (
                        Algorithm::SharedMemory,
                        format!("every device is host addressable: {t:.1} µs"),
                    ),
                };
            }
        }
        let mut best: Option<(Algorithm, f64)> = None;
        for a in Algorithm::ALL
            .into_iter()
            .filter(|&a| allowed(a) && a != Algorithm::SharedMemory)
        {
            if let Some(t) = model.estimate(kind, a, bytes) {
                // Prefer the ring on near ties: it pipelines and spreads the load.
                let t = if a == Algorithm::Ring { t * 0.99 } else { t };
                if best.is_none_or(|(_, bt)| t < bt) {
                    best = Some((a, t));
                }
            }
        }
        match best {
            Some((Algorithm::Native, t)) => (
                Algorithm::Native,
                format!(
                    "cost model: {t:.1} µs with {}",
                    native.map_or("the native library", |(f, _)| f.library.as_str())
                ),
            ),
            Some((a, t)) => (a, format!("cost model: {t:.1} µs")),
            None => (Algorithm::Direct, "the only algorithm".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(n: usize) -> CostModel {
        CostModel {
            n,
            ring_alpha: 5.0,
            ring_beta: 1.0 / 10_000.0,
            all_alpha: 5.0,
            all_beta: 1.0 / 10_000.0,
            tree_depth: crate::comm::algorithms::double_tree_depth(n),
            groups: None,
            shared_memory_beta: None,
            native: None,
            reduce_beta: vec![0.0; n],
            links: Vec::new(),
            hierarchy: Vec::new(),
        }
    }

    fn untuned() -> Option<NativeFigures> {
        Some(NativeFigures {
            library: "nccl 2.23.4".to_string(),
            cost: None,
        })
    }

    #[test]
    fn native_is_chosen_exactly_where_the_communicator_has_it() {
        let mut m = model(4);
        let s = Selector::default();
        assert_eq!(
            m.estimate(Collective::AllReduce, Algorithm::Native, 64),
            None
        );
        assert_ne!(s.choose(&m, Collective::AllReduce, 64).0, Algorithm::Native);
        // An override cannot conjure it up, under either name.
        for name in ["native", "nccl"] {
            let forced = Selector::parse(&format!("allreduce:{name}")).unwrap();
            assert_ne!(
                forced.choose(&m, Collective::AllReduce, 64).0,
                Algorithm::Native
            );
        }
        m.native = untuned();
        assert_eq!(s.choose(&m, Collective::AllReduce, 64).0, Algorithm::Native);
        assert_eq!(s.choose(&m, Collective::AllToAll, 64).0, Algorithm::Native);
        // Barriers stay with the enqueued events.
        assert_ne!(s.choose(&m, Collective::Barrier, 0).0, Algorithm::Native);
        // Overrides naming another algorithm still win.
        let ring = Selector::parse("allreduce:ring").unwrap();
        assert_eq!(
            ring.choose(&m, Collective::AllReduce, 64).0,
            Algorithm::Ring
        );
    }

    #[test]
    fn a_native_library_with_figures_is_weighed_against_the_others() {
        // The model's links: 5 µs and 10 GB/s. The library: 50 µs, but 100 GB/s.
        let mut m = model(4);
        m.native = Some(NativeFigures {
            library: "simccl 1.0".to_string(),
            cost: Some((50.0, 1.0 / 100_000.0)),
        });
        let s = Selector::default();
        let (small, why) = s.choose(&m, Collective::AllReduce, 64);
        assert_ne!(small, Algorithm::Native, "{why}");
        let (large, why) = s.choose(&m, Collective::AllReduce, 64 << 20);
        assert_eq!(large, Algorithm::Native);
        assert!(why.contains("simccl 1.0"), "{why}");
        // Its estimate is its figures over nccl-tests' bus bytes: all-reduce moves
        // 2(n−1)/n of the buffer, all-gather (n−1)/n of the gathered one.
        let bytes = 1u64 << 20;
        let ar = m
            .estimate(Collective::AllReduce, Algorithm::Native, bytes)
            .unwrap();
        assert!((ar - (50.0 + 1.5 * bytes as f64 / 100_000.0)).abs() < 1e-6);
        let ag = m
            .estimate(Collective::AllGather, Algorithm::Native, bytes)
            .unwrap();
        assert!((ag - (50.0 + 0.75 * 4.0 * bytes as f64 / 100_000.0)).abs() < 1e-6);
        // Against shared memory too, where that can run.
        m.shared_memory_beta = Some(1.0 / 10_000.0);
        assert_eq!(
            s.choose(&m, Collective::AllReduce, 64).0,
            Algorithm::SharedMemory
        );
        assert_eq!(
            s.choose(&m, Collective::AllReduce, 64 << 20).0,
            Algorithm::Native
        );
        // Forced either way.
        let forced = Selector::parse("allreduce:native").unwrap();
        assert_eq!(
            forced.choose(&m, Collective::AllReduce, 64).0,
            Algorithm::Native
        );
        let own = Selector::parse("allreduce:ring").unwrap();
        assert_eq!(
            own.choose(&m, Collective::AllReduce, 64 << 20).0,
            Algorithm::Ring
        );
    }

    #[test]
    fn shared_memory_is_estimated_only_where_every_device_is_host_addressable() {
        let mut m = model(4);
        assert_eq!(
            m.estimate(Collective::AllReduce, Algorithm::SharedMemory, 1 << 20),
            None
        );
        let s = Selector::default();
        assert_ne!(
            s.choose(&m, Collective::AllReduce, 64).0,
            Algorithm::SharedMemory
        );
        m.shared_memory_beta = Some(1.0 / 10_000.0);
        for bytes in [8, 1 << 20, 256 << 20] {
            assert_eq!(
                s.choose(&m, Collective::AllReduce, bytes).0,
                Algorithm::SharedMemory,
                "{bytes} bytes"
            );
        }
        // The enqueueing path chooses among the others.
        let (a, _) = s.choose_where(&m, Collective::AllReduce, 8, |a| {
            a != Algorithm::SharedMemory
        });
        assert_ne!(a, Algorithm::SharedMemory);
        assert_eq!(
            m.estimate(Collective::SendRecv, Algorithm::SharedMemory, 8),
            None
        );
    }

    #[test]
    fn small_messages_go_direct_and_large_ones_ring() {
        let s = Selector::default();
        assert_eq!(
            s.choose(&model(4), Collective::AllReduce, 64).0,
            Algorithm::Direct
        );
        assert_eq!(
            s.choose(&model(4), Collective::AllReduce, 64 << 20).0,
            Algorithm::Ring
        );
        assert_eq!(
            s.choose(&model(4), Collective::AllToAll, 64 << 20).0,
            Algorithm::Direct
        );
    }

    #[test]
    fn overrides_win_within_their_range() {
        let s = Selector::parse("allreduce:direct:1M-max, broadcast:ring").unwrap();
        assert_eq!(s.overrides.len(), 2);
        assert_eq!(s.overrides[0].min, 1 << 20);
        let (a, why) = s.choose(&model(4), Collective::AllReduce, 64 << 20);
        assert_eq!((a, why.as_str()), (Algorithm::Direct, "XPU_COLL_ALGO"));
        assert_eq!(
            s.choose(&model(4), Collective::AllReduce, 64).0,
            Algorithm::Direct
        );
        assert_eq!(
            s.choose(&model(4), Collective::Broadcast, 8).0,
            Algorithm::Ring
        );
        // An override naming an algorithm the operation lacks is ignored.
        let s = Selector::parse("alltoall:ring").unwrap();
        assert_eq!(
            s.choose(&model(4), Collective::AllToAll, 8).0,
            Algorithm::Direct
        );
    }

    #[test]
    fn bad_overrides_are_refused_with_reasons() {
        for (text, wanted) in [
            ("allreduce", "OPERATION:ALGORITHM"),
            ("allreduce:star", "unknown algorithm"),
            ("scan:ring", "unknown collective"),
            ("allreduce:ring:1M", "MIN-MAX"),
            ("allreduce:ring:2M-1M", "empty"),
            ("allreduce:ring:1X-2M", "not a size"),
        ] {
            let e = Selector::parse(text).unwrap_err().to_string();
            assert!(e.contains(wanted), "{text}: {e}");
        }
    }

    #[test]
    fn medium_messages_go_halving_doubling_or_tree() {
        let s = Selector::default();
        for n in [4, 8, 16] {
            let (a, _) = s.choose(&model(n), Collective::AllReduce, 256 << 10);
            assert!(
                matches!(a, Algorithm::HalvingDoubling | Algorithm::Tree),
                "{n} ranks: {a}"
            );
            assert_eq!(
                s.choose(&model(n), Collective::AllReduce, 256 << 20).0,
                Algorithm::Ring,
                "{n} ranks"
            );
        }
        assert_eq!(
            s.choose(&model(32), Collective::Broadcast, 64 << 10).0,
            Algorithm::Tree
        );
    }

    #[test]
    fn fast_groups_behind_slow_links_go_hierarchical() {
        // Four host ranks sharing memory and one device staged through the host.
        let mut m = model(5);
        m.ring_alpha = 50.0;
        m.ring_beta = 1.0 / 2_000.0;
        m.all_alpha = 50.0;
        m.all_beta = 1.0 / 2_000.0;
        m.groups = Some(GroupFigures {
            count: 2,
            largest: 4,
            inner_alpha: 0.5,
            inner_beta: 1.0 / 10_000.0,
            leader_alpha: 50.0,
            leader_beta: 1.0 / 2_000.0,
        });
        let s = Selector::default();
        assert_eq!(
            s.choose(&m, Collective::AllReduce, 256 << 10).0,
            Algorithm::Hierarchical
        );
        // Even for 8 bytes: direct makes the lone device take four transfers over the
        // slow link one after another, the leaders' ring two.
        assert_eq!(
            s.choose(&m, Collective::AllReduce, 8).0,
            Algorithm::Hierarchical
        );
        // Reduce and broadcast cross the slow link once instead of once per rank.
        for kind in [Collective::Reduce, Collective::Broadcast] {
            assert_eq!(s.choose(&m, kind, 256 << 10).0, Algorithm::Hierarchical);
        }
        // The gathers still move every block through the lone device's slow link, so
        // they gain nothing there; two groups of four behind a link ten times slower
        // than within them carry each group's blocks over it once instead of seven.
        assert_ne!(
            s.choose(&m, Collective::AllGather, 256 << 10).0,
            Algorithm::Hierarchical
        );
        let mut two = m.clone();
        two.n = 8;
        two.groups = Some(GroupFigures {
            count: 2,
            largest: 4,
            inner_alpha: 0.5,
            inner_beta: 1.0 / 10_000.0,
            leader_alpha: 50.0,
            leader_beta: 1.0 / 1_000.0,
        });
        (two.ring_beta, two.all_beta) = (1.0 / 1_000.0, 1.0 / 1_000.0);
        for kind in [Collective::AllGather, Collective::ReduceScatter] {
            assert_eq!(
                s.choose(&two, kind, 256 << 10).0,
                Algorithm::Hierarchical,
                "{kind}"
            );
        }
        // Without groups it is the ring, which wins the tie.
        m.groups = None;
        assert_eq!(
            m.estimate(Collective::AllReduce, Algorithm::Hierarchical, 1 << 20),
            m.estimate(Collective::AllReduce, Algorithm::Ring, 1 << 20)
        );
        assert_ne!(
            s.choose(&m, Collective::AllReduce, 256 << 10).0,
            Algorithm::Hierarchical
        );
    }

    #[test]
    fn a_slow_reducer_is_charged_for_what_it_reduces() {
        // Rank 3 reduces at 0.25 GB/s (a CPU Vulkan driver, a simulator), the others at
        // 10 GB/s; the links are the same for everyone.
        let fast = model(4);
        let mut slow = model(4);
        slow.reduce_beta = vec![1e-4, 1e-4, 1e-4, 1.0 / 250.0];
        let s = 64u64 << 10;
        let extra = |a| {
            slow.estimate(Collective::AllReduce, a, s).unwrap()
                - fast.estimate(Collective::AllReduce, a, s).unwrap()
        };
        let bytes = s as f64;
        // Direct: every rank reduces the three others' buffers; the ring 3/4 of one.
        assert!((extra(Algorithm::Direct) - 3.0 * bytes / 250.0).abs() < 1e-6);
        assert!((extra(Algorithm::Ring) - 0.75 * bytes / 250.0).abs() < 1e-6);
        // Faster than the ring on the links alone, far slower with the reductions.
        let t = |m: &CostModel, a| m.estimate(Collective::AllReduce, a, s).unwrap();
        assert!(t(&fast, Algorithm::Direct) < t(&fast, Algorithm::Ring));
        assert!(t(&slow, Algorithm::Direct) > 3.0 * t(&slow, Algorithm::Ring));
        assert_ne!(
            Selector::default()
                .choose(&slow, Collective::AllReduce, s)
                .0,
            Algorithm::Direct
        );
        // Gathers and broadcasts reduce nothing.
        for kind in [Collective::AllGather, Collective::Broadcast] {
            assert_eq!(
                slow.estimate(kind, Algorithm::Ring, s),
                fast.estimate(kind, Algorithm::Ring, s)
            );
        }
        // Hierarchical with the slow device alone in its group: as its group's only
        // member it reduces just its half in the leaders' ring, where the flat ring has
        // it reduce three quarters.
        let mut grouped = slow.clone();
        grouped.hierarchy = vec![vec![0, 1, 2], vec![3]];
        let reduce = |m: &CostModel, a| m.reduce_us(Collective::AllReduce, a, bytes);
        assert!((reduce(&grouped, Algorithm::Hierarchical) - 0.5 * bytes / 250.0).abs() < 1e-6);
        assert!(reduce(&grouped, Algorithm::Hierarchical) < reduce(&grouped, Algorithm::Ring));
    }

    #[test]
    fn direct_and_halving_doubling_cost_the_pairs_they_use() {
        // Three ranks; everything to and from rank 2 is slow (α 100 µs), the rest fast.
        let mut m = model(3);
        m.links = (0..3)
            .flat_map(|a| (0..3).map(move |b| (a, b)))
            .map(|(a, b)| {
                if a == 2 || b == 2 {
                    (100.0, 0.0)
                } else {
                    (1.0, 0.0)
                }
            })
            .collect();
        // Direct: rank 2 receives from both others, one after the other.
        assert_eq!(
            m.estimate(Collective::AllGather, Algorithm::Direct, 0),
            Some(200.0)
        );
        // Halving-doubling: rank 0 folds into rank 1 (fast, in and back out), then ranks
        // 1 and 2 exchange twice (slow).
        assert_eq!(
            m.estimate(Collective::AllReduce, Algorithm::HalvingDoubling, 0),
            Some(1.0 + 1.0 + 2.0 * 100.0)
        );
    }

    #[test]
    fn algorithms_estimate_exactly_what_they_implement() {
        let mut m = model(4);
        m.shared_memory_beta = Some(1.0 / 10_000.0);
        m.native = untuned();
        for kind in Collective::ALL {
            for a in Algorithm::ALL {
                assert_eq!(
                    m.estimate(kind, a, 1024).is_some(),
                    a.implements(kind),
                    "{a} {kind}"
                );
            }
        }
        assert!(Algorithm::Hierarchical.implements(Collective::Broadcast));
        assert!(Algorithm::Hierarchical.implements(Collective::AllGather));
        assert!(!Algorithm::Hierarchical.implements(Collective::AllToAll));
        // Overrides naming an algorithm the operation lacks are ignored.
        let s = Selector::parse("broadcast:halving-doubling,allgather:tree").unwrap();
        assert_ne!(
            s.choose(&m, Collective::Broadcast, 8).0,
            Algorithm::HalvingDoubling
        );
        assert_ne!(s.choose(&m, Collective::AllGather, 8).0, Algorithm::Tree);
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
        assert_eq!(
            Selector::parse("allreduce:Halving-Doubling")
                .unwrap()
                .overrides[0]
                .algorithm,
            Algorithm::HalvingDoubling
        );
    }
}
