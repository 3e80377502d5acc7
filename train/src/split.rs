//! Sharing a step's micro-batches between the replicas by their speed.

/// `total` micro-batches shared in proportion to `weights` (largest remainders first,
/// ties to the lower rank); equal shares when any weight is missing or not positive.
pub fn proportional(total: u64, weights: &[Option<f64>]) -> Vec<u64> {
    let n = weights.len().max(1);
    let known: Option<Vec<f64>> = weights
        .iter()
        .map(|w| w.filter(|w| w.is_finite() && *w > 0.0))
        .collect();
    let w = known.unwrap_or_else(|| vec![1.0; n]);
    let sum: f64 = w.iter().sum();
    let exact: Vec<f64> = w.iter().map(|x| total as f64 * x / sum).collect();
    let mut shares: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let mut left = total.saturating_sub(shares.iter().sum());
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
}

/// `total` micro-batches shared so that the step ends soonest, given each replica's
/// time for one micro-batch: each goes, in turn, to the replica that would finish it
/// first (ties to the lower rank) — for identical pieces of work on devices of
/// different speeds, this is the shortest step. A replica much slower than the others
/// can get none. Equal shares when any time is missing, not finite or not positive.
pub fn fastest(total: u64, times: &[Option<f64>]) -> Vec<u64> {
    let known: Option<Vec<f64>> = times
        .iter()
        .map(|t| t.filter(|t| t.is_finite() && *t > 0.0))
        .collect();
    let Some(times) = known else {
        return proportional(total, &vec![None; times.len()]);
    };
    let mut shares = vec![0u64; times.len()];
    if times.is_empty() {
        return shares;
    }
    // Whole rounds of the proportional split first (each replica's share of it can
    // only be at most its fastest share), then the rest one at a time.
    let rates: Vec<Option<f64>> = times.iter().map(|t| Some(1.0 / t)).collect();
    for (s, p) in shares.iter_mut().zip(proportional(total, &rates)) {
        *s = p.saturating_sub(1);
    }
    let mut left = total - shares.iter().sum::<u64>();
    while left > 0 {
        let next = (0..times.len())
            .min_by(|&a, &b| {
                let fa = (shares[a] + 1) as f64 * times[a];
                let fb = (shares[b] + 1) as f64 * times[b];
                fa.total_cmp(&fb).then(a.cmp(&b))
            })
            .unwrap_or(0);
        shares[next] += 1;
        left -= 1;
    }
    shares
}

/// `shares` with every share raised to at least `min` where the total allows it,
/// the micro-batches taken one at a time from the largest share (ties to the higher
/// rank); the total is unchanged.
pub fn at_least(mut shares: Vec<u64>, min: u64) -> Vec<u64> {
    let total: u64 = shares.iter().sum();
    if total < min.saturating_mul(shares.len() as u64) {
        return shares;
    }
    while let Some(low) = shares.iter().position(|&s| s < min) {
        let Some(high) = (0..shares.len()).max_by_key(|&i| shares[i]) else {
            break;
        };
        if shares[high] <= min {
            break;
        }
        shares[high] -= 1;
        shares[low] += 1;
    }
    shares
}

/// The micro-batches each replica computes: contiguous ranges in rank order.
pub fn ranges(shares: &[u64]) -> Vec<std::ops::Range<u64>> {
    let mut start = 0;
    shares
        .iter()
        .map(|&s| {
            let r = start..start + s;
            start += s;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_weights_and_add_up() {
        assert_eq!(proportional(8, &[Some(1.0), Some(1.0)]), [4, 4]);
        assert_eq!(proportional(8, &[Some(3.0), Some(1.0)]), [6, 2]);
        assert_eq!(proportional(7, &[Some(1.0), Some(1.0)]), [4, 3]);
        assert_eq!(proportional(8, &[Some(1.0), None]), [4, 4]);
        assert_eq!(
            proportional(3, &[Some(1.0), Some(1.0), Some(1.0), Some(1.0)]),
            [1, 1, 1, 0]
        );
        assert_eq!(proportional(4, &[Some(100.0), Some(1.0)]), [4, 0]);
        for total in 0..20 {
            let s = proportional(total, &[Some(0.3), Some(2.0), Some(1.1)]);
            assert_eq!(s.iter().sum::<u64>(), total);
        }
        // The shortest step: a device 10× slower gets nothing of 8 micro-batches
        // (8 on the fast one take 8 units; one on the slow one alone takes 10).
        assert_eq!(fastest(8, &[Some(1.0), Some(10.0)]), [8, 0]);
        assert_eq!(fastest(8, &[Some(1.0), Some(1.0)]), [4, 4]);
        assert_eq!(fastest(8, &[Some(1.0), Some(2.04)]), [6, 2]);
        assert_eq!(fastest(8, &[Some(1.0), None]), [4, 4]);
        assert_eq!(fastest(3, &[Some(1.0); 4]), [1, 1, 1, 0]);
        for total in 0..40 {
            let times = [Some(0.3), Some(2.0), Some(1.1)];
            let s = fastest(total, &times);
            assert_eq!(s.iter().sum::<u64>(), total);
            // No single move of a micro-batch shortens the step.
            let end = |s: &[u64]| {
                s.iter()
                    .zip(&times)
                    .map(|(&n, t)| n as f64 * t.unwrap())
                    .fold(0.0, f64::max)
            };
            for from in 0..3 {
                for to in 0..3 {
                    if from != to && s[from] > 0 {
                        let mut moved = s.clone();
                        moved[from] -= 1;
                        moved[to] += 1;
                        assert!(end(&moved) >= end(&s) - 1e-12, "{total}: {s:?}");
                    }
                }
            }
        }
        assert_eq!(at_least(vec![4, 0], 1), [3, 1]);
        assert_eq!(at_least(vec![5, 0, 0, 3], 1), [3, 1, 1, 3]);
        assert_eq!(at_least(vec![2, 0, 0], 1), [2, 0, 0]);
        assert_eq!(at_least(vec![1, 1, 0, 0], 1), [1, 1, 0, 0]);
        assert_eq!(at_least(vec![6, 2], 3), [5, 3]);
        assert_eq!(ranges(&[2, 0, 3]), [0..2, 2..2, 2..5]);
    }
}
