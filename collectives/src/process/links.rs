//! Measuring the path between processes: every pair of a communicator's processes
//! exchanges small and large messages over the communicator's own transport (the real
//! path its operations take: MPI's shared memory within a machine, its network between
//! machines), and every process learns every pair's figures.
//!
//! Pairs are measured one after the other in one order that every process follows, so
//! each process meets its partners in turn and nobody waits in a cycle. An exchange
//! sends both ways at once, so its time is a one-way transfer under load in the other
//! direction, as in the algorithms.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::{Incomplete, Peers};

/// The tag of the calibration's exchanges.
pub(crate) const LINKS_TAG: u32 = (1 << 21) + 24;

/// Small exchanges per pair (the latency is their median).
const SMALL_ROUNDS: usize = 31;
/// Large exchanges per pair (the bandwidth is from their median).
const LARGE_ROUNDS: usize = 5;

/// What a pair of processes measured: one-way latency (µs) and bandwidth (GB/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// The lower-numbered process.
    pub a: usize,
    /// The higher-numbered process.
    pub b: usize,
    /// Latency of an 8-byte message, µs.
    pub latency_us: f64,
    /// Bandwidth of a large message, GB/s.
    pub bandwidth_gbps: f64,
}

/// One exchange of `len` bytes with `peer`, timed. On a failure the buffers are leaked:
/// the transport may still use them.
fn timed(
    peers: &dyn Peers,
    peer: usize,
    out: &[u8],
    back: &mut [u8],
    deadline: Instant,
) -> Result<Duration, Incomplete> {
    let never = AtomicBool::new(false);
    let start = Instant::now();
    // SAFETY: on an error the caller leaks both buffers (see `pair`).
    unsafe {
        peers.exchange(
            LINKS_TAG,
            &[(peer, out)],
            &mut [(peer, back)],
            deadline,
            &never,
        )
    }?;
    Ok(start.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Measures the path to `peer` with `bytes`-byte large messages.
fn pair(
    peers: &dyn Peers,
    peer: usize,
    bytes: usize,
    deadline: Instant,
) -> Result<(f64, f64), Incomplete> {
    let (small, mut small_back) = (vec![0u8; 8], vec![0u8; 8]);
    let (large, mut large_back) = (vec![1u8; bytes], vec![0u8; bytes]);
    let mut run = || -> Result<(f64, f64), Incomplete> {
        let mut times = Vec::with_capacity(SMALL_ROUNDS);
        for _ in 0..SMALL_ROUNDS {
            times.push(timed(peers, peer, &small, &mut small_back, deadline)?);
        }
        let latency = median(times);
        let mut times = Vec::with_capacity(LARGE_ROUNDS);
        for _ in 0..LARGE_ROUNDS {
            times.push(timed(peers, peer, &large, &mut large_back, deadline)?);
        }
        let large_time = median(times)
            .saturating_sub(latency)
            .max(Duration::from_nanos(1));
        Ok((
            latency.as_secs_f64() * 1e6,
            bytes as f64 / large_time.as_secs_f64() / 1e9,
        ))
    };
    let result = run();
    if result.is_err() {
        std::mem::forget((small, small_back, large, large_back));
    }
    result
}

/// Measures every pair this process belongs to, in the order every process follows,
/// and returns this process's pairs.
pub(crate) fn measure(
    peers: &dyn Peers,
    bytes: usize,
    deadline: Instant,
) -> Result<Vec<Measured>, Incomplete> {
    let (me, n) = (peers.index(), peers.count());
    let mut mine = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            if me != a && me != b {
                continue;
            }
            let other = if me == a { b } else { a };
            let (latency_us, bandwidth_gbps) = pair(peers, other, bytes.max(1), deadline)?;
            mine.push(Measured {
                a,
                b,
                latency_us,
                bandwidth_gbps,
            });
        }
    }
    Ok(mine)
}

/// The bytes of `pairs`, to share: four little-endian words per pair.
pub(crate) fn encode(pairs: &[Measured]) -> Vec<u8> {
    pairs
        .iter()
        .flat_map(|m| {
            [
                m.a as u64,
                m.b as u64,
                m.latency_us.to_bits(),
                m.bandwidth_gbps.to_bits(),
            ]
        })
        .flat_map(u64::to_le_bytes)
        .collect()
}

/// The pairs in bytes from [`encode`]; `None` when they are not such bytes.
pub(crate) fn decode(bytes: &[u8]) -> Option<Vec<Measured>> {
    if !bytes.len().is_multiple_of(32) {
        return None;
    }
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    Some(
        words
            .chunks_exact(4)
            .map(|w| Measured {
                a: w[0] as usize,
                b: w[1] as usize,
                latency_us: f64::from_bits(w[2]),
                bandwidth_gbps: f64::from_bits(w[3]),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_survive_their_bytes() {
        let pairs = vec![
            Measured {
                a: 0,
                b: 1,
                latency_us: 1.25,
                bandwidth_gbps: 7.5,
            },
            Measured {
                a: 1,
                b: 2,
                latency_us: 30.0,
                bandwidth_gbps: 0.9,
            },
        ];
        assert_eq!(decode(&encode(&pairs)), Some(pairs));
        assert_eq!(decode(&[0; 31]), None);
    }
}
