//! Task Bench's dependency patterns (Slaughter et al., SC'20; `core/core.cc` of
//! github.com/StanfordLegion/task-bench), as a pure function of the graph's shape.
//!
//! A graph is `steps` rows of at most `width` points; task `(step, point)` depends on
//! some points of row `step - 1` ([`Graph::deps`]). Row 0 depends on nothing. Most
//! patterns use every point of every row; `dom` and `tree` use a range of points per
//! row ([`Graph::points`]), and a dependency on a point outside the previous row's range
//! is dropped, as Task Bench drops it.
//!
//! | pattern | row `t` | task `(t, p)` depends on, in row `t - 1` |
//! |---|---|---|
//! | `trivial` | every point | nothing (and the task touches no data) |
//! | `no_comm` | every point | `p` |
//! | `stencil_1d` | every point | `p-1, p, p+1` (those that exist) |
//! | `stencil_1d_periodic` | every point | `p-1, p, p+1`, wrapping around |
//! | `dom` | a diamond: `min(W, t+1, S-t)` points from `max(0, t+W-S)` | `p-1, p` |
//! | `tree` | points `0 .. min(W, 2^t)` | `p / 2` (each point fans out to two) |
//! | `fft` | every point | `p - 2^k, p, p + 2^k` (those that exist), `k = (t + L - 1) mod L`, `L = ⌈log2 W⌉` |
//! | `all_to_all` | every point | every point |
//! | `nearest` | every point | `p - ⌊r/2⌋ ..= p + ⌊(r-1)/2⌋` clipped to the row, `r` = radix |
//! | `spread` | every point | `(p + i·W/r + (i > 0 ? t mod period : 0)) mod W` for `i < r` |
//! | `random_nearest` | every point | `p`, and each other point of `nearest`'s range with probability `fraction`, drawn from a hash of (seed, radix, `t mod period`, dependency, `p`) |
//!
//! Two departures from Task Bench, both where Task Bench would abort: dependencies are
//! returned sorted and without duplicates (Task Bench's `spread` with a radix above the
//! width, or `stencil_1d_periodic` on one or two points, lists a point twice), and `fft`
//! on a width of 1 uses `L = 1`. `random_nearest` draws with its own hash (splitmix64,
//! which `benches/starpu/taskbench.c` repeats), not Task Bench's SipHash, so its graphs
//! are Task Bench's in distribution, not edge for edge.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// The dependency patterns (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// No dependencies and no data.
    Trivial,
    /// Each point depends on itself.
    NoComm,
    /// Each point depends on its neighbours and itself.
    Stencil1d,
    /// [`Kind::Stencil1d`], wrapping around at the ends.
    Stencil1dPeriodic,
    /// Dominance: a diamond of rows; each point depends on itself and its left neighbour.
    Dom,
    /// A binary tree: row `t` has `2^t` points (up to the width), each depending on its
    /// parent `p / 2`.
    Tree,
    /// Butterflies: each point depends on itself and the points `2^k` away.
    Fft,
    /// Each point depends on every point.
    AllToAll,
    /// Each point depends on the `radix` points around it.
    Nearest,
    /// Each point depends on `radix` points spread over the row.
    Spread,
    /// Each point depends on itself and a random subset of the `radix` points around it.
    RandomNearest,
}

impl Kind {
    /// Every pattern, in Task Bench's order.
    pub const ALL: [Kind; 11] = [
        Kind::Trivial,
        Kind::NoComm,
        Kind::Stencil1d,
        Kind::Stencil1dPeriodic,
        Kind::Dom,
        Kind::Tree,
        Kind::Fft,
        Kind::AllToAll,
        Kind::Nearest,
        Kind::Spread,
        Kind::RandomNearest,
    ];

    /// Its name, as Task Bench spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Trivial => "trivial",
            Kind::NoComm => "no_comm",
            Kind::Stencil1d => "stencil_1d",
            Kind::Stencil1dPeriodic => "stencil_1d_periodic",
            Kind::Dom => "dom",
            Kind::Tree => "tree",
            Kind::Fft => "fft",
            Kind::AllToAll => "all_to_all",
            Kind::Nearest => "nearest",
            Kind::Spread => "spread",
            Kind::RandomNearest => "random_nearest",
        }
    }

    /// Whether the pattern repeats with a period of rows (`spread`, `random_nearest`).
    pub const fn needs_period(self) -> bool {
        matches!(self, Kind::Spread | Kind::RandomNearest)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown pattern `{s}`; use one of {}", names.join(", "))
            })
    }
}

/// A pattern with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pattern {
    /// Which pattern.
    pub kind: Kind,
    /// Points in a neighbourhood (`nearest`, `random_nearest`) or dependencies per point
    /// (`spread`); Task Bench's `-radix`, default 3.
    pub radix: u64,
    /// Rows after which `spread` and `random_nearest` repeat; Task Bench's `-period`,
    /// default 3 (at least 1).
    pub period: u64,
    /// Probability that `random_nearest` keeps a dependency other than the point itself;
    /// Task Bench's `-fraction`, default 0.25.
    pub fraction: f64,
    /// Seed of `random_nearest`'s draws (Task Bench's graph index plays this part).
    pub seed: u64,
}

impl Pattern {
    /// `kind` with Task Bench's default parameters.
    pub const fn new(kind: Kind) -> Pattern {
        Pattern {
            kind,
            radix: 3,
            period: 3,
            fraction: 0.25,
            seed: 0,
        }
    }
}

/// The largest width and number of steps (points and steps are encoded in 32 bits).
pub const MAX_EXTENT: u64 = u32::MAX as u64;

/// A task graph: a pattern over `width` points and `steps` rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// The pattern.
    pub pattern: Pattern,
    /// Points per row (at most).
    pub width: u64,
    /// Rows.
    pub steps: u64,
}

impl Graph {
    /// The graph, or why its shape or parameters are invalid.
    pub fn new(pattern: Pattern, width: u64, steps: u64) -> Result<Graph, String> {
        if width == 0 || width > MAX_EXTENT {
            return Err(format!(
                "the width must be between 1 and {MAX_EXTENT}, not {width}"
            ));
        }
        if steps == 0 || steps > MAX_EXTENT {
            return Err(format!(
                "the number of steps must be between 1 and {MAX_EXTENT}, not {steps}"
            ));
        }
        if pattern.kind.needs_period() && pattern.period == 0 {
            return Err(format!(
                "the pattern {} needs a period of at least 1",
                pattern.kind
            ));
        }
        if !(0.0..=1.0).contains(&pattern.fraction) {
            return Err(format!(
                "the fraction must be between 0 and 1, not {}",
                pattern.fraction
            ));
        }
        Ok(Graph {
            pattern,
            width,
            steps,
        })
    }

    /// The points of row `step` (empty past the last row).
    pub fn points(&self, step: u64) -> Range<u64> {
        if step >= self.steps {
            return 0..0;
        }
        let w = self.width;
        match self.pattern.kind {
            Kind::Dom => {
                let width = w.min(step + 1).min(self.steps - step);
                let offset = (step + w).saturating_sub(self.steps);
                offset..offset + width
            }
            Kind::Tree => {
                let width = if step >= 63 { w } else { w.min(1 << step) };
                0..width
            }
            _ => 0..w,
        }
    }

    /// `fft`'s number of butterfly distances, `⌈log2 W⌉` (at least 1).
    fn fft_levels(&self) -> u64 {
        u64::from(64 - (self.width - 1).leading_zeros()).max(1)
    }

    /// The points of row `step - 1` that task `(step, point)` depends on, ascending and
    /// without duplicates (see the module docs). Empty for row 0 and for a point that is
    /// not in row `step`.
    pub fn deps(&self, step: u64, point: u64) -> Vec<u64> {
        if step == 0 || !self.points(step).contains(&point) {
            return Vec::new();
        }
        let w = self.width;
        let p = point;
        let Pattern {
            kind,
            radix,
            period,
            fraction,
            seed,
        } = self.pattern;
        let mut deps: Vec<u64> = match kind {
            Kind::Trivial => Vec::new(),
            Kind::NoComm => vec![p],
            Kind::Stencil1d => (p.saturating_sub(1)..=(p + 1).min(w - 1)).collect(),
            Kind::Stencil1dPeriodic => {
                let mut v: Vec<u64> = (p.saturating_sub(1)..=(p + 1).min(w - 1)).collect();
                if p == 0 {
                    v.push(w - 1);
                }
                if p + 1 >= w {
                    v.push(0);
                }
                v
            }
            Kind::Dom => vec![p.saturating_sub(1), p],
            Kind::Tree => vec![p / 2],
            Kind::Fft => {
                let k = (step + self.fft_levels() - 1) % self.fft_levels();
                let d = 1u64.checked_shl(k as u32).unwrap_or(u64::MAX);
                let mut v = Vec::with_capacity(3);
                if let Some(lo) = p.checked_sub(d) {
                    v.push(lo);
                }
                v.push(p);
                if p.checked_add(d).is_some_and(|hi| hi < w) {
                    v.push(p + d);
                }
                v
            }
            Kind::AllToAll => (0..w).collect(),
            Kind::Nearest => match nearest_range(p, w, radix) {
                Some(r) => r.collect(),
                None => Vec::new(),
            },
            Kind::Spread => {
                let dset = step % period;
                (0..radix)
                    .map(|i| {
                        let shift = if i > 0 { dset } else { 0 };
                        let spread = ((u128::from(i) * u128::from(w)) / u128::from(radix)) as u64;
                        ((u128::from(p) + u128::from(spread) + u128::from(shift)) % u128::from(w))
                            as u64
                    })
                    .collect()
            }
            Kind::RandomNearest => {
                let dset = step % period;
                match nearest_range(p, w, radix) {
                    Some(r) => r
                        .filter(|&i| i == p || uniform(seed, radix, dset, i, p) < fraction)
                        .collect(),
                    None => Vec::new(),
                }
            }
        };
        let previous = self.points(step - 1);
        deps.retain(|d| previous.contains(d));
        deps.sort_unstable();
        deps.dedup();
        deps
    }

    /// Tasks in the graph: the points of every row.
    pub fn tasks(&self) -> u64 {
        (0..self.steps)
            .map(|t| {
                let r = self.points(t);
                r.end - r.start
            })
            .sum()
    }

    /// Dependencies in the graph (edges between tasks), and a digest of the whole graph:
    /// FNV-1a over `step, point, count, deps…` of every task in order, as 64-bit
    /// little-endian words, which `benches/starpu/taskbench.c` computes the same way, so
    /// that the two programs can show they ran the same graph.
    pub fn edges_and_digest(&self) -> (u64, u64) {
        let mut edges = 0;
        let mut digest = Fnv::new();
        for t in 0..self.steps {
            for p in self.points(t) {
                let deps = self.deps(t, p);
                edges += deps.len() as u64;
                digest.word(t);
                digest.word(p);
                digest.word(deps.len() as u64);
                for d in deps {
                    digest.word(d);
                }
            }
        }
        (edges, digest.0)
    }

    /// The most dependencies any task of the graph can have (a bound, for sizing).
    pub fn max_deps(&self) -> u64 {
        let r = self.pattern.radix;
        match self.pattern.kind {
            Kind::Trivial => 0,
            Kind::NoComm | Kind::Tree => 1,
            Kind::Dom => 2,
            Kind::Stencil1d | Kind::Stencil1dPeriodic | Kind::Fft => 3,
            Kind::AllToAll => self.width,
            Kind::Nearest | Kind::Spread | Kind::RandomNearest => r,
        }
        .min(self.width)
    }
}

/// `nearest`'s neighbourhood of `p`: `p - ⌊r/2⌋ ..= p + ⌊(r-1)/2⌋` within `0..w`
/// (none for radix 0).
fn nearest_range(p: u64, w: u64, radix: u64) -> Option<std::ops::RangeInclusive<u64>> {
    if radix == 0 {
        return None;
    }
    let lo = p.saturating_sub(radix / 2);
    let hi = p.saturating_add((radix - 1) / 2).min(w - 1);
    Some(lo..=hi)
}

/// splitmix64's finaliser.
pub const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `random_nearest`'s draw for dependency `dep` of `point`, uniform in `[0, 1)`.
fn uniform(seed: u64, radix: u64, dset: u64, dep: u64, point: u64) -> f64 {
    let mut h = mix(seed);
    for v in [radix, dset, dep, point] {
        h = mix(h ^ v);
    }
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// 64-bit FNV-1a.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xCBF2_9CE4_8422_2325)
    }

    fn word(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(kind: Kind, width: u64, steps: u64) -> Graph {
        Graph::new(Pattern::new(kind), width, steps).unwrap()
    }

    /// Row `step`'s dependencies, one list per point of the row.
    fn row(g: &Graph, step: u64) -> Vec<Vec<u64>> {
        g.points(step).map(|p| g.deps(step, p)).collect()
    }

    #[test]
    fn trivial_no_comm_and_all_to_all() {
        let g = graph(Kind::Trivial, 4, 3);
        assert_eq!(row(&g, 1), vec![Vec::<u64>::new(); 4]);
        assert_eq!(g.edges_and_digest().0, 0);
        let g = graph(Kind::NoComm, 4, 3);
        assert_eq!(row(&g, 0), vec![Vec::<u64>::new(); 4]);
        assert_eq!(row(&g, 2), vec![vec![0], vec![1], vec![2], vec![3]]);
        let g = graph(Kind::AllToAll, 3, 2);
        assert_eq!(row(&g, 1), vec![vec![0, 1, 2]; 3]);
        assert_eq!(g.edges_and_digest().0, 9);
    }

    #[test]
    fn stencils() {
        let g = graph(Kind::Stencil1d, 4, 5);
        assert_eq!(
            row(&g, 1),
            vec![vec![0, 1], vec![0, 1, 2], vec![1, 2, 3], vec![2, 3]]
        );
        assert_eq!((g.tasks(), g.edges_and_digest().0), (20, 40));
        let g = graph(Kind::Stencil1d, 1, 2);
        assert_eq!(row(&g, 1), vec![vec![0]]);

        let g = graph(Kind::Stencil1dPeriodic, 4, 2);
        assert_eq!(
            row(&g, 1),
            vec![vec![0, 1, 3], vec![0, 1, 2], vec![1, 2, 3], vec![0, 2, 3]]
        );
        // Where Task Bench would list a point twice.
        assert_eq!(
            row(&graph(Kind::Stencil1dPeriodic, 2, 2), 1),
            vec![vec![0, 1]; 2]
        );
        assert_eq!(row(&graph(Kind::Stencil1dPeriodic, 1, 2), 1), vec![vec![0]]);
    }

    #[test]
    fn dom_is_a_diamond() {
        // Width 3, 5 steps: rows {0}, {0,1}, {0,1,2}, {1,2}, {2}.
        let g = graph(Kind::Dom, 3, 5);
        let rows: Vec<Range<u64>> = (0..5).map(|t| g.points(t)).collect();
        assert_eq!(rows, vec![0..1, 0..2, 0..3, 1..3, 2..3]);
        assert_eq!(row(&g, 1), vec![vec![0], vec![0]]);
        assert_eq!(row(&g, 2), vec![vec![0], vec![0, 1], vec![1]]);
        assert_eq!(row(&g, 3), vec![vec![0, 1], vec![1, 2]]);
        assert_eq!(row(&g, 4), vec![vec![1, 2]]);
        assert_eq!((g.tasks(), g.edges_and_digest().0), (9, 12));
        // A point outside its row has no dependencies.
        assert!(g.deps(4, 0).is_empty());
    }

    #[test]
    fn tree_fans_out_from_one_point() {
        let g = graph(Kind::Tree, 4, 4);
        let rows: Vec<Range<u64>> = (0..4).map(|t| g.points(t)).collect();
        assert_eq!(rows, vec![0..1, 0..2, 0..4, 0..4]);
        assert_eq!(row(&g, 1), vec![vec![0], vec![0]]);
        assert_eq!(row(&g, 2), vec![vec![0], vec![0], vec![1], vec![1]]);
        assert_eq!(row(&g, 3), vec![vec![0], vec![0], vec![1], vec![1]]);
        assert_eq!((g.tasks(), g.edges_and_digest().0), (11, 10));
        // Steps past 63 do not overflow.
        assert_eq!(graph(Kind::Tree, 5, 100).points(99), 0..5);
    }

    #[test]
    fn fft_butterflies_cycle_through_the_distances() {
        // Width 8: L = 3; row t uses distance 2^((t + 2) mod 3): 1, 2, 4, 1, …
        let g = graph(Kind::Fft, 8, 5);
        assert_eq!(g.deps(1, 0), vec![0, 1]);
        assert_eq!(g.deps(1, 3), vec![2, 3, 4]);
        assert_eq!(g.deps(1, 7), vec![6, 7]);
        assert_eq!(g.deps(2, 3), vec![1, 3, 5]);
        assert_eq!(g.deps(3, 3), vec![3, 7]);
        assert_eq!(g.deps(3, 5), vec![1, 5]);
        assert_eq!(g.deps(4, 3), vec![2, 3, 4]);
        // Width 5: L = 3 as well; width 1: only the point itself.
        assert_eq!(graph(Kind::Fft, 5, 4).deps(3, 1), vec![1]);
        assert_eq!(graph(Kind::Fft, 1, 3).deps(2, 0), vec![0]);
    }

    #[test]
    fn nearest_takes_the_radix_around_the_point() {
        let g = graph(Kind::Nearest, 5, 2);
        assert_eq!(
            row(&g, 1),
            vec![
                vec![0, 1],
                vec![0, 1, 2],
                vec![1, 2, 3],
                vec![2, 3, 4],
                vec![3, 4]
            ]
        );
        let with = |radix| {
            let mut p = Pattern::new(Kind::Nearest);
            p.radix = radix;
            Graph::new(p, 5, 2).unwrap()
        };
        // Even radix: one more on the left, as in Task Bench.
        assert_eq!(with(4).deps(1, 2), vec![0, 1, 2, 3]);
        assert_eq!(with(1).deps(1, 2), vec![2]);
        assert!(with(0).deps(1, 2).is_empty());
        assert_eq!(with(9).deps(1, 2), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn spread_spreads_and_shifts_with_the_period() {
        // Width 9, radix 3, period 3: i·W/r = 0, 3, 6, shifted by t mod 3 for i > 0.
        let g = graph(Kind::Spread, 9, 4);
        assert_eq!(g.deps(1, 0), vec![0, 4, 7]);
        assert_eq!(g.deps(2, 8), vec![4, 7, 8]);
        assert_eq!(g.deps(3, 0), vec![0, 3, 6]);
        // A radix above the width lists points once.
        let mut p = Pattern::new(Kind::Spread);
        p.radix = 5;
        let g = Graph::new(p, 2, 2).unwrap();
        assert_eq!(g.deps(1, 0), vec![0, 1]);
    }

    #[test]
    fn random_nearest_keeps_the_point_and_draws_the_rest() {
        let mut p = Pattern::new(Kind::RandomNearest);
        p.radix = 5;
        let g = Graph::new(p, 64, 7).unwrap();
        let mut kept_others = 0;
        for t in 1..7 {
            for q in 0..64 {
                let deps = g.deps(t, q);
                assert!(deps.contains(&q), "({t}, {q}): {deps:?}");
                let near: Vec<u64> = (q.saturating_sub(2)..=(q + 2).min(63)).collect();
                assert!(deps.iter().all(|d| near.contains(d)), "{deps:?}");
                kept_others += deps.len() - 1;
                // Deterministic, and periodic in the step.
                assert_eq!(deps, g.deps(t, q));
                if t + 3 < 7 {
                    assert_eq!(deps, g.deps(t + 3, q));
                }
            }
        }
        // About a quarter of the 6·(4·64 - 6) others.
        assert!((250..520).contains(&kept_others), "{kept_others}");
        // Fraction 1 is nearest; fraction 0 is no_comm.
        p.fraction = 1.0;
        assert_eq!(
            Graph::new(p, 64, 2).unwrap().deps(1, 10),
            vec![8, 9, 10, 11, 12]
        );
        p.fraction = 0.0;
        assert_eq!(Graph::new(p, 64, 2).unwrap().deps(1, 10), vec![10]);
        // Another seed, another graph.
        let mut q = Pattern::new(Kind::RandomNearest);
        q.radix = 5;
        q.seed = 1;
        let other = Graph::new(q, 64, 7).unwrap();
        assert_ne!(g.edges_and_digest(), other.edges_and_digest());
    }

    #[test]
    fn random_draws_are_the_ones_the_c_program_makes() {
        // The same values benches/starpu/taskbench.c computes (mix and uniform there).
        assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
        let u = uniform(0, 3, 1, 4, 5);
        assert!((0.0..1.0).contains(&u));
    }

    #[test]
    fn every_dependency_is_a_distinct_point_of_the_previous_row() {
        for kind in Kind::ALL {
            for width in [1, 2, 3, 5, 8, 13] {
                for steps in [1, 2, 6, 11] {
                    let mut pattern = Pattern::new(kind);
                    for radix in [0, 1, 3, 4, 20] {
                        pattern.radix = radix;
                        let g = Graph::new(pattern, width, steps).unwrap();
                        let mut edges = 0;
                        for t in 0..steps {
                            let points = g.points(t);
                            assert!(points.end <= width && !points.is_empty(), "{kind} {t}");
                            for p in points {
                                let deps = g.deps(t, p);
                                if t == 0 {
                                    assert!(deps.is_empty());
                                }
                                assert!(
                                    deps.windows(2).all(|w| w[0] < w[1]),
                                    "{kind} w{width} r{radix} ({t}, {p}): {deps:?}"
                                );
                                let previous = if t == 0 { 0..0 } else { g.points(t - 1) };
                                assert!(
                                    deps.iter().all(|d| previous.contains(d)),
                                    "{kind} w{width} ({t}, {p}): {deps:?} not in {previous:?}"
                                );
                                assert!(deps.len() as u64 <= g.max_deps());
                                edges += deps.len() as u64;
                            }
                        }
                        assert_eq!(edges, g.edges_and_digest().0);
                    }
                }
            }
        }
    }

    #[test]
    fn names_parse_and_bad_shapes_are_refused() {
        for kind in Kind::ALL {
            assert_eq!(kind.name().parse::<Kind>().unwrap(), kind);
        }
        let e = "stencil".parse::<Kind>().unwrap_err();
        assert!(e.contains("stencil_1d, stencil_1d_periodic"), "{e}");
        assert!(Graph::new(Pattern::new(Kind::Dom), 0, 3).is_err());
        assert!(Graph::new(Pattern::new(Kind::Dom), 3, 0).is_err());
        let mut p = Pattern::new(Kind::Spread);
        p.period = 0;
        assert!(Graph::new(p, 3, 3).unwrap_err().contains("period"));
        let mut p = Pattern::new(Kind::RandomNearest);
        p.fraction = 1.5;
        assert!(Graph::new(p, 3, 3).is_err());
    }
}
