//! Choosing an algorithm: an α-β cost model over the topology's links, and overrides.
//!
//! Each link has a latency α (µs) and a time per byte β (from its bandwidth). For an
//! operation of `S` bytes per rank on `n` ranks the model estimates:
//!
//! | operation | ring | direct |
//! |---|---|---|
//! | all-reduce | 2(n−1)·(α + S/n·β) | α + (n−1)·S·β |
//! | reduce, broadcast | (n−1)·α + (S + (n−2)·p)·β (a chain in pieces of `p`) | α + (n−1)·S·β |
//! | all-gather, reduce-scatter | (n−1)·(α + S·β) | α + (n−1)·S·β |
//!
//! with the ring's α and β from the slowest link between ring neighbours and the direct
//! ones from the slowest link of all. All-to-all and barriers have one algorithm.
//!
//! `XPU_COLL_ALGO` overrides the model per operation and size range: a comma list of
//! `OPERATION:ALGORITHM[:MIN-MAX]`, sizes in bytes with optional `K`, `M`, `G` (binary)
//! and `max`, e.g. `allreduce:ring:1M-max,broadcast:direct`.

use xpu_hal::{Error, Result};

use super::algorithms::Algorithm;
use super::op::Collective;
use crate::topology::Topology;

/// Pieces of pipelined chains, bytes (the model's `p`).
pub const CHAIN_PIECE: u64 = 4 << 20;

/// The figures the model needs, read once from the topology.
#[derive(Debug, Clone, Copy, PartialEq)]
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
}

impl CostModel {
    /// The model of a communicator over the topology's devices in order.
    pub fn from_topology(t: &Topology) -> Self {
        let n = t.len();
        let beta = |gbps: f64| 1.0 / (gbps.max(1e-6) * 1e3);
        let (mut ring_alpha, mut ring_beta, mut all_alpha, mut all_beta) =
            (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                if let Ok(l) = t.link(a, b) {
                    all_alpha = all_alpha.max(l.latency_us);
                    all_beta = all_beta.max(beta(l.bandwidth_gbps));
                    if b == (a + 1) % n {
                        ring_alpha = ring_alpha.max(l.latency_us);
                        ring_beta = ring_beta.max(beta(l.bandwidth_gbps));
                    }
                }
            }
        }
        CostModel {
            n,
            ring_alpha,
            ring_beta,
            all_alpha,
            all_beta,
        }
    }

    /// The modelled time of `kind` on `bytes` per rank with `algorithm`, µs; `None` when
    /// the algorithm does not implement the operation.
    pub fn estimate(&self, kind: Collective, algorithm: Algorithm, bytes: u64) -> Option<f64> {
        let n = self.n as f64;
        let s = bytes as f64;
        let (ra, rb, da, db) = (
            self.ring_alpha,
            self.ring_beta,
            self.all_alpha,
            self.all_beta,
        );
        let direct = da + (n - 1.0) * s * db;
        match (kind, algorithm) {
            (Collective::AllReduce, Algorithm::Ring) => Some(2.0 * (n - 1.0) * (ra + s / n * rb)),
            (Collective::Reduce | Collective::Broadcast, Algorithm::Ring) => {
                let p = (CHAIN_PIECE as f64).min(s);
                Some((n - 1.0) * ra + (s + (n - 2.0).max(0.0) * p) * rb)
            }
            (Collective::AllGather | Collective::ReduceScatter, Algorithm::Ring) => {
                Some((n - 1.0) * (ra + s * rb))
            }
            (
                Collective::AllReduce
                | Collective::Reduce
                | Collective::Broadcast
                | Collective::AllGather
                | Collective::ReduceScatter
                | Collective::AllToAll,
                Algorithm::Direct,
            ) => Some(direct),
            (Collective::Barrier | Collective::SendRecv, Algorithm::Direct) => Some(da),
            _ => None,
        }
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
    let t = text.trim();
    if t.eq_ignore_ascii_case("max") {
        return Ok(u64::MAX);
    }
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(1u64 << shift))
        .ok_or_else(|| {
            Error::invalid(format!(
                "XPU_COLL_ALGO entry `{spec}`: `{text}` is not a size; write bytes with an optional K, M or G suffix, or max"
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
                    "XPU_COLL_ALGO entry `{spec}`: unknown algorithm `{algo}`; expected ring or direct"
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

    /// The algorithm for `kind` on `bytes` per rank, and why it was chosen.
    pub fn choose(&self, model: &CostModel, kind: Collective, bytes: u64) -> (Algorithm, String) {
        if let Some(o) = self
            .overrides
            .iter()
            .find(|o| o.kind == kind && (o.min..=o.max).contains(&bytes))
        {
            if model.estimate(kind, o.algorithm, bytes).is_some() {
                return (o.algorithm, "XPU_COLL_ALGO".to_string());
            }
        }
        let mut best: Option<(Algorithm, f64)> = None;
        for a in Algorithm::ALL {
            if let Some(t) = model.estimate(kind, a, bytes) {
                // Prefer the ring on near ties: it pipelines and spreads the load.
                let t = if a == Algorithm::Ring { t * 0.99 } else { t };
                if best.is_none_or(|(_, bt)| t < bt) {
                    best = Some((a, t));
                }
            }
        }
        match best {
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
        }
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
            ("allreduce:tree", "unknown algorithm"),
            ("scan:ring", "unknown collective"),
            ("allreduce:ring:1M", "MIN-MAX"),
            ("allreduce:ring:2M-1M", "empty"),
            ("allreduce:ring:1X-2M", "not a size"),
        ] {
            let e = Selector::parse(text).unwrap_err().to_string();
            assert!(e.contains(wanted), "{text}: {e}");
        }
    }
}
