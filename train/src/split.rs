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
/// time for one micro-batch (`times`) and for the work it does once per step whatever
/// its share (`fixed`; a replica without micro-batches does none): each goes, in turn,
/// to the replica that would finish it first (ties to the lower rank) — for identical
/// pieces of work on devices of different speeds, each with a cost that only grows with
/// its share, this is the shortest step. A replica much slower than the others can get
/// none. Equal shares when any time is missing, not finite or not positive; a missing,
/// negative or not finite fixed time counts as none.
pub fn fastest(total: u64, times: &[Option<f64>], fixed: &[f64]) -> Vec<u64> {
    let known: Option<Vec<f64>> = times
        .iter()
        .map(|t| t.filter(|t| t.is_finite() && *t > 0.0))
        .collect();
    let Some(times) = known else {
        return proportional(total, &vec![None; times.len()]);
    };
    let fixed: Vec<f64> = (0..times.len()).map(|i| fixed_time(fixed, i)).collect();
    let mut shares = vec![0u64; times.len()];
    if times.is_empty() {
        return shares;
    }
    // When a replica would finish its work with `n` micro-batches.
    let end = |i: usize, n: u64| fixed[i] + n as f64 * times[i];
    for _ in 0..total {
        let next = (0..times.len())
            .min_by(|&a, &b| {
                end(a, shares[a] + 1)
                    .total_cmp(&end(b, shares[b] + 1))
                    .then(a.cmp(&b))
            })
            .unwrap_or(0);
        shares[next] += 1;
    }
    shares
}

/// Replica `i`'s time for its work once per step: none where it is missing, negative
/// or not finite.
fn fixed_time(fixed: &[f64], i: usize) -> f64 {
    fixed
        .get(i)
        .copied()
        .filter(|f| f.is_finite() && *f > 0.0)
        .unwrap_or(0.0)
}

/// Rebalancings a measured step time is kept for: after that the devices may have
/// changed speed, and it is measured again if the split comes back.
const MEASURED_FOR: u32 = 20;
/// Steps measured before a split's time is trusted.
const MEASURED_STEPS: u32 = 3;

/// The measured step times of the splits used lately, to check the models' choice
/// against: the models predict each micro-batch well but not all the work around it
/// (sums, the update, waits at the all-reduces), so a split they put near another may
/// be clearly slower in fact, and predictions near a boundary would flip between the
/// two at every rebalancing (each flip costing a step submitted task by task).
#[derive(Debug, Default, Clone)]
pub struct Measured {
    /// Per split: the sum of its step times in seconds, their count, and the
    /// rebalancings since the last.
    splits: Vec<(Vec<u64>, f64, u32, u32)>,
}

impl Measured {
    /// Adds a step of `seconds` run with `shares`.
    pub fn add(&mut self, shares: &[u64], seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        match self.splits.iter_mut().find(|e| e.0 == shares) {
            Some(e) => {
                e.1 += seconds;
                e.2 += 1;
                e.3 = 0;
            }
            None => self.splits.push((shares.to_vec(), seconds, 1, 0)),
        }
    }

    /// Forgets every measurement (the devices changed: a straggler, a device left).
    pub fn clear(&mut self) {
        self.splits.clear();
    }

    /// The mean step time of `shares`, once measured enough.
    pub fn mean(&self, shares: &[u64]) -> Option<f64> {
        self.splits
            .iter()
            .find(|e| e.0 == shares && e.2 >= MEASURED_STEPS)
            .map(|e| e.1 / f64::from(e.2))
    }

    /// At a rebalancing: `candidate` (the models' choice) unless the current split is
    /// measured and the candidate too, and the candidate is not faster by `gain` of the
    /// current's time; a candidate not measured yet is tried. Then ages the
    /// measurements, forgetting those not renewed for a few rebalancings.
    pub fn choose(&mut self, current: &[u64], candidate: Vec<u64>, gain: f64) -> Vec<u64> {
        let choice = match (self.mean(current), self.mean(&candidate)) {
            (Some(now), Some(then)) if then > now * (1.0 - gain) => current.to_vec(),
            _ => candidate,
        };
        for e in &mut self.splits {
            e.3 += 1;
        }
        self.splits.retain(|e| e.3 <= MEASURED_FOR);
        choice
    }
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

    /// When the step ends with `shares`, given each replica's time for one micro-batch
    /// and for its work once per step (as [`fastest`] takes them); `None` when a time
    /// is missing.
    fn step_end(shares: &[u64], times: &[Option<f64>], fixed: &[f64]) -> Option<f64> {
        let mut end = 0.0f64;
        for (i, &n) in shares.iter().enumerate() {
            let t = times.get(i).copied().flatten()?;
            if n > 0 {
                end = end.max(fixed_time(fixed, i) + n as f64 * t);
            }
        }
        Some(end)
    }

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
        assert_eq!(fastest(8, &[Some(1.0), Some(10.0)], &[]), [8, 0]);
        assert_eq!(fastest(8, &[Some(1.0), Some(1.0)], &[]), [4, 4]);
        assert_eq!(fastest(8, &[Some(1.0), Some(2.04)], &[]), [6, 2]);
        assert_eq!(fastest(8, &[Some(1.0), None], &[]), [4, 4]);
        assert_eq!(fastest(3, &[Some(1.0); 4], &[]), [1, 1, 1, 0]);
        // Work done once per step moves micro-batches away from the replica that
        // does it slowly: a device at about half speed doing 1 unit per step (the
        // other 0.5) gets 2 of 8 micro-batches (ends 6.5 and 4.8, against 5.5 and 6.7
        // with 3).
        assert_eq!(fastest(8, &[Some(1.0), Some(1.9)], &[0.5, 1.0]), [6, 2]);
        assert_eq!(fastest(8, &[Some(1.0), Some(1.9)], &[]), [5, 3]);
        // Bad fixed times count as none.
        assert_eq!(
            fastest(8, &[Some(1.0), Some(1.9)], &[f64::NAN, -1.0]),
            [5, 3]
        );
        for (total, fixed) in (0..40).flat_map(|t| [(t, [0.0; 3]), (t, [0.5, 3.0, 1.0])]) {
            let times = [Some(0.3), Some(2.0), Some(1.1)];
            let s = fastest(total, &times, &fixed);
            assert_eq!(s.iter().sum::<u64>(), total);
            // No single move of a micro-batch shortens the step.
            let end = |s: &[u64]| step_end(s, &times, &fixed).unwrap();
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
        assert_eq!(
            step_end(&[6, 2], &[Some(1.0), Some(1.9)], &[0.5, 1.0]),
            Some(6.5)
        );
        assert_eq!(
            step_end(&[8, 0], &[Some(1.0), Some(9.0)], &[0.5, 9.0]),
            Some(8.5)
        );
        assert_eq!(step_end(&[4, 4], &[Some(1.0), None], &[]), None);
    }

    #[test]
    fn measured_step_times_overrule_a_choice_they_show_slower() {
        let mut m = Measured::default();
        let (a, b) = (vec![5, 3], vec![6, 2]);
        // Nothing measured: the candidate is tried.
        assert_eq!(m.choose(&a, b.clone(), 0.03), b);
        for _ in 0..3 {
            m.add(&b, 0.009);
        }
        // The current split measured, the candidate not: tried.
        assert_eq!(m.choose(&b, a.clone(), 0.03), a);
        for _ in 0..2 {
            m.add(&a, 0.0105);
        }
        // Too few steps of the current one to judge: the candidate goes.
        assert_eq!(m.choose(&a, b.clone(), 0.03), b);
        m.add(&a, 0.0105);
        // Both measured: the slower candidate is refused, the faster one taken.
        assert_eq!(m.choose(&b, a.clone(), 0.03), b);
        assert_eq!(m.choose(&a, b.clone(), 0.03), b);
        // Within the gain, the current one stays.
        for _ in 0..3 {
            m.add(&[4, 4], 0.0088);
        }
        assert_eq!(m.choose(&b, vec![4, 4], 0.03), b);
        // Measurements not renewed are forgotten: the candidate is tried again.
        for _ in 0..=MEASURED_FOR {
            m.choose(&[7, 1], vec![7, 1], 0.03);
        }
        assert_eq!(m.mean(&a), None);
        assert_eq!(m.choose(&b, a.clone(), 0.03), a);
        // Bad times are not measurements; clearing forgets all.
        m.add(&b, f64::NAN);
        m.add(&b, -1.0);
        m.clear();
        assert_eq!(m.mean(&b), None);
    }
}
