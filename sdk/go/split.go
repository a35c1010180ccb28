package sluice

// The split of the declared capacity across the nodes an instance reaches, in proportion to
// their demand, with hysteresis (protocol/README.md "The split", normative; the vectors'
// splits hold every SDK to it). crates/sluice-session/src/split.rs is the reference; the float
// arithmetic follows it step by step so that ties fall alike in every SDK.

// nodeView is what the split knows of one node.
type nodeView struct {
	// live: the link is up (or within its grace) and the node has not said DRAINING, or it
	// has no control links.
	live bool
	// floor: the node asks this instance for its floor of one session (its last FLOOR was 1,
	// or it sent none).
	floor bool
	// demand is the smoothed demand.
	demand float64
	// held counts sessions held there (registered or being dialed) less those asked to
	// retire.
	held int
}

// smooth is the next smoothed demand after sample: half way from the last value, or the
// sample itself when there was none.
func smooth(last float64, sampled bool, sample float64) float64 {
	if !sampled {
		return sample
	}
	return last + (sample-last)/2
}

// targets is the sessions each node should hold: capacity in all (when any node is live), at
// least one per live node that asks for its floor while capacity allows, the rest by demand.
// Only with rebalance does it move sessions by demand alone (step 5), each move one that
// makes the sum of |t - q| smaller, so that none comes back while the quotas hold still;
// moved says whether it did. quiet (no live node's last sample was above 0) leaves the split
// as it is: step 5 then gives only to a node owed its floor that holds none, and step 4
// gives to such a node first.
func targets(capacity int, nodes []nodeView, rebalance, quiet bool) (t []int, moved bool) {
	q := quotas(capacity, nodes)
	t = make([]int, len(nodes))
	var live, owed []int
	floors := 0
	for i, n := range nodes {
		if n.live {
			t[i] = n.held
			live = append(live, i)
			if n.floor {
				floors++
			}
		}
	}
	for _, i := range live {
		if nodes[i].floor && capacity >= floors {
			owed = append(owed, i)
		}
	}
	// bare: while quiet, the nodes owed their floor that hold none.
	bare := func() []int {
		var out []int
		for _, i := range owed {
			if quiet && t[i] == 0 {
				out = append(out, i)
			}
		}
		return out
	}
	over := func(i int) float64 { return float64(t[i]) - q[i] }
	under := func(i int) float64 { return -over(i) }
	for sum(t) > capacity {
		j, ok := firstMax(holding(t), over)
		if !ok {
			break
		}
		t[j]--
	}
	for sum(t) < capacity {
		takers := bare()
		if len(takers) == 0 {
			takers = live
		}
		i, ok := firstMax(takers, under)
		if !ok {
			break
		}
		t[i]++
	}
	for rebalance {
		takers := live
		if quiet {
			takers = bare()
		}
		i, okShort := firstMax(takers, under)
		j, okLong := firstMax(holding(t), over)
		if !okShort || !okLong || over(j)+under(i) <= 1 {
			break
		}
		t[i]++
		t[j]--
		moved = true
	}
	return t, moved
}

// quotas is each node's real share: a base of one per live node that asks this instance for
// its floor, while capacity allows, and the rest shared among all live nodes by demand
// (evenly without any).
func quotas(capacity int, nodes []nodeView) []float64 {
	q := make([]float64, len(nodes))
	live, floors := 0, 0
	total := 0.0
	for _, n := range nodes {
		if n.live {
			live++
			total += max(n.demand, 0)
			if n.floor {
				floors++
			}
		}
	}
	if live == 0 {
		return q
	}
	base := 0
	if capacity >= floors {
		base = 1
	}
	rest := float64(capacity - base*floors)
	for i, n := range nodes {
		if !n.live {
			continue
		}
		b := 0.0
		if n.floor {
			b = float64(base)
		}
		if total > 0 {
			q[i] = b + (rest*max(n.demand, 0))/total
		} else {
			q[i] = b + rest/float64(live)
		}
	}
	return q
}

// firstMax is the first index with the largest key.
func firstMax(indices []int, key func(int) float64) (int, bool) {
	best, bestKey, found := 0, 0.0, false
	for _, i := range indices {
		if k := key(i); !found || k > bestKey {
			best, bestKey, found = i, k, true
		}
	}
	return best, found
}

// holding is the indices of t above 0.
func holding(t []int) []int {
	var out []int
	for i, v := range t {
		if v > 0 {
			out = append(out, i)
		}
	}
	return out
}

func sum(t []int) int {
	s := 0
	for _, v := range t {
		s += v
	}
	return s
}
