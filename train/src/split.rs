//! Sharing a step's micro-batches between the replicas in proportion to their speed.

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
        assert_eq!(at_least(vec![4, 0], 1), [3, 1]);
        assert_eq!(at_least(vec![5, 0, 0, 3], 1), [3, 1, 1, 3]);
        assert_eq!(at_least(vec![2, 0, 0], 1), [2, 0, 0]);
        assert_eq!(at_least(vec![1, 1, 0, 0], 1), [1, 1, 0, 0]);
        assert_eq!(at_least(vec![6, 2], 3), [5, 3]);
        assert_eq!(ranges(&[2, 0, 3]), [0..2, 2..2, 2..5]);
    }
}
