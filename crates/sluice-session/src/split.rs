//! How a service splits its declared capacity across the nodes it reaches, in proportion to
//! their demand, with hysteresis (`protocol/README.md`, "The split"). Every SDK computes the
//! same targets from the same inputs; the vectors' `splits` section holds them to it.

/// What a service knows of one node when it plans.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeView {
    /// The link is up and the node has not said `DRAINING` (or it has no control links).
    pub live: bool,
    /// The smoothed demand ([`smooth`]).
    pub demand: f64,
    /// Sessions held there (registered or being dialed) less those asked to retire.
    pub held: usize,
}

/// The next smoothed demand after a sample: half way from the last value to the sample, or
/// the sample itself when there was none.
pub fn smooth(last: Option<f64>, sample: f64) -> f64 {
    match last {
        Some(d) => d + (sample - d) / 2.0,
        None => sample,
    }
}

/// The sessions each node should hold: `capacity` in all, at least one per live node while
/// `capacity` allows, the rest in proportion to demand, moving a session only when that
/// shrinks the imbalance by more than one (so small swings of demand move nothing).
pub fn targets(capacity: usize, nodes: &[NodeView]) -> Vec<usize> {
    let quotas = quotas(capacity, nodes);
    let mut t: Vec<usize> = nodes
        .iter()
        .map(|n| if n.live { n.held } else { 0 })
        .collect();
    let over = |t: &[usize], i: usize| t[i] as f64 - quotas[i];
    while t.iter().sum::<usize>() > capacity {
        let Some(j) = first_max((0..t.len()).filter(|&i| t[i] > 0), |i| over(&t, i)) else {
            break;
        };
        t[j] -= 1;
    }
    let live: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].live).collect();
    while t.iter().sum::<usize>() < capacity {
        let Some(i) = first_max(live.iter().copied(), |i| -over(&t, i)) else {
            break;
        };
        t[i] += 1;
    }
    loop {
        let short = first_max(live.iter().copied(), |i| -over(&t, i));
        let long = first_max((0..t.len()).filter(|&i| t[i] > 0), |i| over(&t, i));
        match (short, long) {
            (Some(i), Some(j)) if -over(&t, i) > 0.5 && over(&t, j) > 0.5 => {
                t[i] += 1;
                t[j] -= 1;
            }
            _ => return t,
        }
    }
}

/// Each node's real share: a base of one per live node while `capacity` allows, the rest by
/// demand (evenly without any), computed as the protocol writes it so that ties fall alike in
/// every SDK.
fn quotas(capacity: usize, nodes: &[NodeView]) -> Vec<f64> {
    let live = nodes.iter().filter(|n| n.live).count();
    if live == 0 {
        return vec![0.0; nodes.len()];
    }
    let base = usize::from(capacity >= live);
    let rest = (capacity - base * live) as f64;
    let total: f64 = nodes
        .iter()
        .filter(|n| n.live)
        .map(|n| n.demand.max(0.0))
        .sum();
    nodes
        .iter()
        .map(|n| match (n.live, total > 0.0) {
            (false, _) => 0.0,
            (true, true) => base as f64 + (rest * n.demand.max(0.0)) / total,
            (true, false) => base as f64 + rest / live as f64,
        })
        .collect()
}

/// The first index with the largest key.
fn first_max(indices: impl Iterator<Item = usize>, key: impl Fn(usize) -> f64) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for i in indices {
        let k = key(i);
        if best.is_none_or(|(_, b)| k > b) {
            best = Some((i, k));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(demand: f64, held: usize) -> NodeView {
        NodeView {
            live: true,
            demand,
            held,
        }
    }

    #[test]
    fn the_sum_is_the_capacity_and_never_more() {
        for capacity in 0..40 {
            let nodes = [node(3.0, 7), node(0.0, 9), node(11.0, 1)];
            let t = targets(capacity, &nodes);
            assert_eq!(t.iter().sum::<usize>(), capacity, "{capacity}: {t:?}");
        }
    }

    #[test]
    fn settled_targets_stay_settled() {
        let nodes = [node(40.0, 6), node(5.0, 5), node(5.0, 5)];
        let t = targets(16, &nodes);
        let again: Vec<NodeView> = nodes
            .iter()
            .zip(&t)
            .map(|(n, &held)| NodeView { held, ..*n })
            .collect();
        assert_eq!(targets(16, &again), t);
    }

    #[test]
    fn smoothing_goes_half_way() {
        assert_eq!(smooth(None, 8.0), 8.0);
        assert_eq!(smooth(Some(8.0), 0.0), 4.0);
    }
}
