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

/// When the step ends with `shares`, given each replica's time for one micro-batch
/// and for its work once per step (as [`fastest`] takes them); `None` when a time
/// is missing.
pub fn step_end(shares: &[u64], times: &[Option<f64>], fixed: &[f64]) -> Option<f64> {
    let mut end = 0.0f64;
    for (i, &n) in shares.iter().enumerate() {
        let t = times.get(i).copied().flatten()?;
        if n > 0 {
            end = end.max(fixed_time(fixed, i) + n as f64 * t);
        }
    }
    Some(end)
}

/// `best` first, then every split one micro-batch away from it (taken from a replica
/// with more than `min`) whose predicted step ends within `margin` of `best`'s
/// (fastest first): the splits the models cannot tell apart, to be settled by
/// measuring them. Only `best` when a prediction is missing.
pub fn near(
    best: &[u64],
    times: &[Option<f64>],
    fixed: &[f64],
    min: u64,
    margin: f64,
) -> Vec<Vec<u64>> {
    let Some(limit) = step_end(best, times, fixed).map(|e| e * (1.0 + margin)) else {
        return vec![best.to_vec()];
    };
    let mut others: Vec<(f64, Vec<u64>)> = Vec::new();
    for from in 0..best.len() {
        for to in 0..best.len() {
            if from == to || best[from] <= min {
                continue;
            }
            let mut moved = best.to_vec();
            moved[from] -= 1;
            moved[to] += 1;
            if let Some(end) = step_end(&moved, times, fixed).filter(|e| *e <= limit) {
                others.push((end, moved));
            }
        }
    }
    others.sort_by(|a, b| a.0.total_cmp(&b.0));
    std::iter::once(best.to_vec())
        .chain(others.into_iter().map(|(_, s)| s))
        .collect()
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
/// (sums, the update, waits at the all-reduces, what devices running side by side cost
/// each other), so a split they put near another may be clearly slower in fact, and
/// predictions near a boundary would flip between the two at every rebalancing (each
/// flip costing a step submitted task by task).
///
/// A split's time is the mean over the steps since the rebalancing before them: its
/// latest stretch, so that two splits tried one after the other are compared on
/// machines in nearly the same state (a run speeds up over its first tens of steps,
/// and another process may come or go).
#[derive(Debug, Default, Clone)]
pub struct Measured {
    splits: Vec<Stretch>,
}

/// The steps run with one split since the rebalancing before them.
#[derive(Debug, Clone)]
struct Stretch {
    shares: Vec<u64>,
    /// The sum of the step times, in seconds.
    seconds: f64,
    steps: u32,
    /// Rebalancings since the last step.
    age: u32,
}

impl Measured {
    /// Adds a step of `seconds` run with `shares`: the first after a rebalancing
    /// starts the split's stretch anew.
    pub fn add(&mut self, shares: &[u64], seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        match self.splits.iter_mut().find(|e| e.shares == shares) {
            Some(e) if e.age == 0 => {
                e.seconds += seconds;
                e.steps += 1;
            }
            Some(e) => {
                (e.seconds, e.steps, e.age) = (seconds, 1, 0);
            }
            None => self.splits.push(Stretch {
                shares: shares.to_vec(),
                seconds,
                steps: 1,
                age: 0,
            }),
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
            .find(|e| e.shares == shares && e.steps >= MEASURED_STEPS)
            .map(|e| e.seconds / f64::from(e.steps))
    }

    /// At a rebalancing, given `candidates` (the models' choice first, then the splits
    /// they put near it): the first not measured yet is tried; when all are, the
    /// fastest measured, unless the current split is measured and that is not faster
    /// by `gain` of the current's time. Then ages the measurements, forgetting those
    /// not renewed for a few rebalancings.
    pub fn choose(&mut self, current: &[u64], candidates: &[Vec<u64>], gain: f64) -> Vec<u64> {
        let untried = candidates.iter().find(|c| self.mean(c).is_none());
        let fastest = candidates
            .iter()
            .filter_map(|c| self.mean(c).map(|t| (t, c)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let choice = match (untried, fastest, self.mean(current)) {
            (Some(c), _, _) => c.clone(),
            (None, Some((t, _)), Some(now)) if t > now * (1.0 - gain) => current.to_vec(),
            (None, Some((_, c)), _) => c.clone(),
            (None, None, _) => current.to_vec(),
        };
        for e in &mut self.splits {
            e.age += 1;
        }
        self.splits.retain(|e| e.age <= MEASURED_FOR);
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
        assert_eq!(m.choose(&a, std::slice::from_ref(&b), 0.03), b);
        for _ in 0..3 {
            m.add(&b, 0.009);
        }
        // The current split measured, the candidate not: tried.
        assert_eq!(m.choose(&b, std::slice::from_ref(&a), 0.03), a);
        for _ in 0..2 {
            m.add(&a, 0.0105);
        }
        // Too few steps of the current one to judge: the candidate goes.
        assert_eq!(m.choose(&a, std::slice::from_ref(&b), 0.03), b);
        // A step after a rebalancing starts the split's stretch anew.
        m.add(&a, 0.0105);
        assert_eq!(m.mean(&a), None);
        m.add(&a, 0.0105);
        m.add(&a, 0.0105);
        assert!(m.mean(&a).is_some_and(|t| (t - 0.0105).abs() < 1e-12));
        // Both measured: the slower candidate is refused, the faster one taken.
        assert_eq!(m.choose(&b, std::slice::from_ref(&a), 0.03), b);
        assert_eq!(m.choose(&a, std::slice::from_ref(&b), 0.03), b);
        // Within the gain, the current one stays.
        for _ in 0..3 {
            m.add(&[4, 4], 0.0088);
        }
        assert_eq!(m.choose(&b, &[vec![4, 4]], 0.03), b);
        // Measured again, a split's latest stretch is its time.
        for _ in 0..3 {
            m.add(&b, 0.012);
        }
        assert!(m.mean(&b).is_some_and(|t| (t - 0.012).abs() < 1e-12));
        assert_eq!(m.choose(&b, &[vec![4, 4]], 0.03), vec![4, 4]);
        // Measurements not renewed are forgotten: the candidate is tried again.
        for _ in 0..=MEASURED_FOR {
            m.choose(&[7, 1], &[vec![7, 1]], 0.03);
        }
        assert_eq!(m.mean(&a), None);
        assert_eq!(m.choose(&b, std::slice::from_ref(&a), 0.03), a);
        // Bad times are not measurements; clearing forgets all.
        m.add(&b, f64::NAN);
        m.add(&b, -1.0);
        m.clear();
        assert_eq!(m.mean(&b), None);
    }

    #[test]
    fn splits_the_models_cannot_tell_apart_are_measured_and_the_fastest_kept() {
        // A device at about half speed: 5/3 ends at 5.7 units, 6/2 at 6.
        let times = [Some(1.0), Some(1.9)];
        let best = fastest(8, &times, &[]);
        assert_eq!(best, [5, 3]);
        assert_eq!(near(&best, &times, &[], 1, 0.1), [vec![5, 3], vec![6, 2]]);
        // Nothing else within 1% (4/4 ends at 7.6).
        assert_eq!(near(&best, &times, &[], 1, 0.01), [vec![5, 3]]);
        // A share is not taken below `min`; a missing time gives the best alone.
        assert_eq!(
            near(&[7, 1], &[Some(1.0), Some(1.0)], &[], 1, 10.0),
            [vec![7, 1], vec![6, 2]]
        );
        assert_eq!(near(&[4, 4], &[Some(1.0), None], &[], 0, 1.0), [vec![4, 4]]);
        let mut m = Measured::default();
        let (a, b) = (vec![5, 3], vec![6, 2]);
        let both = [a.clone(), b.clone()];
        // Each untried one is tried, the models' choice first.
        assert_eq!(m.choose(&a, &both, 0.03), a);
        for _ in 0..3 {
            m.add(&a, 0.012);
        }
        assert_eq!(m.choose(&a, &both, 0.03), b);
        for _ in 0..3 {
            m.add(&b, 0.010);
        }
        // Both measured: the faster stays, though the models prefer the other.
        assert_eq!(m.choose(&b, &both, 0.03), b);
        // From the slower one, the faster is taken.
        assert_eq!(m.choose(&a, &both, 0.03), b);
        // Within the gain, the current one stays.
        for _ in 0..3 {
            m.add(&[4, 4], 0.0099);
        }
        assert_eq!(m.choose(&b, &[vec![4, 4], b.clone()], 0.03), b);
        // No candidates: the current split.
        assert_eq!(m.choose(&a, &[], 0.03), a);
    }
}
