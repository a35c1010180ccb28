package sluice

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// moveHold is how long after a plan that moved sessions by demand alone no plan does so again
// (protocol/README.md "The split"): an instance moves for demand at most once a second.
const moveHold = time.Second

// clock is the time the bookkeeping of many nodes reads and the timers it sets (NodeGrace,
// the first resolution's wait, backoffs, the rebalance log's second): the real one, or in
// tests a fake one on which the fleet vectors replay step by step, without sockets
// (fleet_vectors_test.go).
type clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func())
}

type realClock struct{}

func (realClock) Now() time.Time                      { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// node is one node of many (protocol/README.md "Many nodes"): an ip:port the acceptor address
// names, its control link, and the sessions this instance holds there. Its fields are guarded
// by the Listener's lock.
type node struct {
	addr   netip.AddrPort
	host   string // the dns: name or the list entry's host it came from
	dialer *dialer
	log    *slog.Logger
	report report
	// stopLink ends the link's goroutine once the node is forgotten.
	stopLink context.CancelFunc

	link      *link     // the control link while it is up
	noControl bool      // the node answered 400: an acceptor without control links
	lostAt    time.Time // when an up link was lost; zero while up, or before the first
	down      bool      // without a link for NodeGrace, or refusing connections since it lost it
	// draining: the node said DRAINING on drainingOn; a DEMAND on a newer link clears it.
	draining   bool
	drainingOn *link
	held       bool  // 410: an operator drained this instance at this node
	refused    error // a refusal of the link that is not retried soon (401, 404)
	gone       bool  // its name no longer lists it

	demand  float64
	sampled bool
	// asking: the last DEMAND's sample was above 0. While no live node's is, the instance is
	// quiet and step 5 moves sessions only to a node owed its floor that holds none.
	asking bool
	// noFloor: the node's last FLOOR on its current link was 0, it counts on another instance
	// for its floor of one session; false until it says so (an older node asks everyone).
	noFloor bool

	sessions int // registered or being dialed
	retiring int // asked to retire with RETIRE, not closed yet
	evicting int // being closed by the SDK itself, not closed yet
	// shrinking counts sessions retired by a shrink (SetCapacity), not closed yet: their
	// slots end, so they are not held for the split.
	shrinking int
	target    int

	// pendingUntil: a node of the first resolution whose first link has neither said its first
	// DEMAND (or DRAINING) nor failed yet; until then (at most HandshakeTimeout) no slot dials, so that the first
	// split covers every node instead of sending every session to the first that answers and
	// moving most of them right after. Nodes that join later never hold the slots up.
	pendingUntil time.Time

	failures int       // session dials (or sessions closed unused) failed in a row
	retryAt  time.Time // no session dial before this
	dialing  int       // session dials under way: one at a time while failures
	members  map[*sessionConn]struct{}
}

// String is the node's address ("" for none: one acceptor), for logs.
func (n *node) String() string {
	if n == nil {
		return ""
	}
	return n.addr.String()
}

// up: the link is up, or the node has no control links and answers.
func (n *node) up() bool { return n.link != nil || n.noControl }

// live: the split gives it sessions. A lost link keeps it live for NodeGrace (a hot restart
// replaces the process behind the link while the sessions stay), unless a refused connect
// takes it down first (refusedLocked).
func (n *node) live() bool {
	reachable := n.up() || (!n.lostAt.IsZero() && !n.down)
	return reachable && !n.draining && !n.held && n.refused == nil && !n.gone
}

// holding is h in the split: sessions held less those on their way out.
func (n *node) holding() int { return n.sessions - n.retiring - n.evicting - n.shrinking }

// splitDemand is d in the split; a node without control links asks for an even share.
func (n *node) splitDemand() float64 {
	if n.noControl {
		return 1
	}
	return n.demand
}

// why says why a node is not live, for its status.
func (n *node) why() string {
	switch {
	case n.gone:
		return "gone"
	case n.held:
		return "drained"
	case n.refused != nil:
		return "refused"
	case n.draining:
		return "draining"
	case n.down:
		return "down"
	case !n.up() && n.lostAt.IsZero():
		return "connecting"
	case !n.up():
		return "reconnecting"
	}
	return ""
}

// NodeStatus is what an instance of many nodes knows of one node.
type NodeStatus struct {
	// Address is the node's ip:port; Host the name or list entry it came from.
	Address, Host string
	// Live: the node gets sessions (its link is up, or lost for less than NodeGrace and not
	// refusing connections).
	Live bool
	// State is "" while live, else why not: "connecting", "reconnecting", "down",
	// "draining", "drained" (an operator's hold, 410), "refused" or "gone" (left DNS).
	State string
	// Demand is the node's smoothed demand (in flight + queued + refused).
	Demand float64
	// Held counts the sessions held there (registered or being dialed) less those retiring;
	// Retiring those asked to close (by RETIRE, or by the SDK for a node that is not live).
	Held, Retiring int
	// Target is the node's share of the capacity.
	Target int
}

func (n *node) status() NodeStatus {
	return NodeStatus{
		Address: n.addr.String(), Host: n.host, Live: n.live(), State: n.why(),
		Demand: n.splitDemand(), Held: n.holding(), Retiring: n.retiring + n.evicting, Target: n.target,
	}
}

// planLocked splits the capacity anew and acts on it: RETIRE to a live node holding more than
// its target, SDK-side closes at a node that is not live, and a wake-up for the slots waiting
// for room. l.mu must be held.
func (l *Listener) planLocked() {
	views := make([]nodeView, len(l.nodes))
	quiet := true
	for i, n := range l.nodes {
		views[i] = nodeView{live: n.live(), floor: !n.noFloor, demand: n.splitDemand(), held: max(n.holding(), 0)}
		quiet = quiet && !(views[i].live && n.asking)
	}
	// The live slots: the capacity once owed retirements are settled, plus those owed, which
	// end their slots (a shrink) rather than move. Moves by demand alone are held for a
	// second after a plan that made one, so that DEMAND every 100 ms cannot move a session
	// every 100 ms; what a node down or a shrink asks for is never held.
	now := l.opts.clock.Now()
	t, moved := targets(l.counts.slots, views, !now.Before(l.movesHeldUntil), quiet)
	if moved {
		l.movesHeldUntil = now.Add(moveHold)
	}
	moves := make(map[*node]int)
	for i, n := range l.nodes {
		n.target = t[i]
		if k := l.settleLocked(n); k > 0 {
			moves[n] = k
		}
	}
	l.forgetGoneLocked()
	l.rebalance.planned(l, moves)
	l.notifyLocked()
}

// settleLocked moves sessions off n if it holds more than it should; it returns how many.
func (l *Listener) settleLocked(n *node) int {
	h := n.holding()
	switch {
	case n.gone && n.link != nil && !n.draining:
		if h <= 0 {
			return 0
		}
		l.retireLocked(n, h) // left DNS with its link up: the node retires every session
		return h
	case n.draining && !n.down:
		// The stopping node closes its sessions itself, once the requests it queued are
		// answered; each one it closes frees a dial elsewhere (README "DRAINING").
		return 0
	case !n.live():
		l.evictLocked(n, -1)
		return max(h, 0)
	case h > n.target && n.link != nil:
		l.retireLocked(n, h-n.target)
		return h - n.target
	case h > n.target && n.noControl:
		return l.evictLocked(n, h-n.target)
	}
	return 0
}

// retireLocked sends RETIRE k on n's link and counts them retiring.
func (l *Listener) retireLocked(n *node, k int) {
	n.retiring += k
	n.link.send(retireLine(k))
	n.log.Debug("asked the node to retire sessions", "retire", k)
}

// evictLocked closes k of n's sessions itself (all when k < 0): idle ones at once, busy ones
// after their response (ln.Handler answers it with Connection: close). A node that is not
// live can retire nothing, so it owes nothing any more. It returns how many it marked.
func (l *Listener) evictLocked(n *node, k int) int {
	if k < 0 {
		n.retiring = 0
	}
	marked := 0
	for _, idleFirst := range []bool{true, false} {
		for c := range n.members {
			if k >= 0 && marked == k {
				return marked
			}
			if c.evicted.Load() || c.retired.Load() || (idleFirst && !c.closableIdle()) {
				continue
			}
			c.evicted.Store(true)
			n.evicting++
			marked++
			if l.wrapped.Load() && c.closableIdle() {
				c.closeIdle()
			}
		}
	}
	return marked
}

// pickLocked chooses the node a slot dials: the live node with the most room (target less
// holding; ties: the first listed) that is not backing off, while the sessions held
// everywhere number fewer than the capacity. Without one, it returns how long until a node
// with room stops backing off (0: wait for a change).
func (l *Listener) pickLocked(now time.Time) (*node, time.Duration) {
	held := 0
	for _, n := range l.nodes {
		held += n.sessions
	}
	if held >= l.counts.target {
		return nil, 0
	}
	var best *node
	var soonest time.Duration
	for _, n := range l.nodes {
		if wait := n.pendingUntil.Sub(now); wait > 0 {
			return nil, wait
		}
	}
	for _, n := range l.nodes {
		room := n.target - n.holding()
		if !n.live() || room <= 0 {
			continue
		}
		if wait := n.retryAt.Sub(now); wait > 0 {
			if soonest == 0 || wait < soonest {
				soonest = wait
			}
			continue
		}
		if n.failures > 0 && n.dialing > 0 {
			continue // one dial at a time at a failing node: its end wakes the others
		}
		if best == nil || room > best.target-best.holding() {
			best = n
		}
	}
	if best != nil {
		best.sessions++
		best.dialing++
		if l.opts.check != nil {
			l.opts.check(l)
		}
	}
	return best, soonest
}

// nodeFailedLocked: a session dial to n failed, or its session closed before serving
// anything; n backs off (per node, not per slot: every slot then picks another node), unless
// it is backing off already (the other failures of one burst extend nothing). Then it takes
// one dial at a time until a session registers there (pickLocked).
func (l *Listener) nodeFailedLocked(n *node) {
	now := l.opts.clock.Now()
	if n.failures > 0 && n.retryAt.After(now) {
		return
	}
	n.retryAt = now.Add(l.opts.Backoff.Delay(n.failures))
	n.failures++
}

// forgetGoneLocked drops the nodes that left DNS and hold nothing any more, with their links.
func (l *Listener) forgetGoneLocked() {
	kept := l.nodes[:0]
	for _, n := range l.nodes {
		if n.gone && n.sessions == 0 {
			n.stopLink()
			if n.link != nil {
				n.link.conn.Close()
			}
			n.log.Info("node left: its sessions are closed and its link too")
			continue
		}
		kept = append(kept, n)
	}
	clear(l.nodes[len(kept):])
	l.nodes = kept
}

// found is one node a resolution found: its address, the host it came from, its order.
type found struct {
	addr netip.AddrPort
	host string
}

// setNodesLocked takes a resolution: new nodes join (their links dialed), known ones stay,
// and those missing leave. Nodes are listed in the order found, then those leaving.
func (l *Listener) setNodesLocked(all []found) {
	known := make(map[netip.AddrPort]*node, len(l.nodes))
	for _, n := range l.nodes {
		known[n.addr] = n
	}
	next := make([]*node, 0, len(all))
	seen := make(map[netip.AddrPort]bool, len(all))
	for _, f := range all {
		if seen[f.addr] {
			continue
		}
		seen[f.addr] = true
		n, ok := known[f.addr]
		switch {
		case !ok:
			n = l.joinLocked(f, l.nodes == nil)
		case n.gone:
			n.gone = false
			n.log.Info("node listed again")
		}
		next = append(next, n)
	}
	for _, n := range l.nodes {
		if !seen[n.addr] {
			if !n.gone {
				n.gone = true
				n.log.Info("node no longer listed: retiring its sessions")
			}
			next = append(next, n)
		}
	}
	l.nodes = next
	l.planLocked()
}

// joinLocked starts tracking a node and dials its control link; first: it is of the first
// resolution.
func (l *Listener) joinLocked(f found, first bool) *node {
	ctx, cancel := context.WithCancel(l.dialCtx)
	n := &node{
		addr: f.addr, host: f.host, dialer: newNodeDialer(&l.opts, f.addr, f.host),
		log: l.log.With("node", f.addr.String()), stopLink: cancel,
		members: make(map[*sessionConn]struct{}),
	}
	if first {
		n.pendingUntil = l.opts.clock.Now().Add(l.opts.HandshakeTimeout)
	}
	n.report.log = n.log
	n.log.Info("node joined")
	go l.runLink(ctx, n)
	return n
}

// capacityChangedLocked tells every node the declared capacity (CAPACITY) and plans anew;
// l.mu must be held.
func (l *Listener) capacityChangedLocked() {
	if l.dialer != nil {
		return
	}
	for _, n := range l.nodes {
		if n.link != nil {
			n.link.send(capacityLine(l.counts.target))
		}
	}
	l.planLocked()
}

// drainNodes sends the drain request to every node holding sessions of this instance, all at
// once. A node that cannot be drained (it is down, say) has its sessions closed by the SDK
// instead: idle ones now, busy ones after their response.
func (l *Listener) drainNodes(ctx context.Context) {
	l.mu.Lock()
	var holding []*node
	for _, n := range l.nodes {
		if n.sessions > 0 {
			holding = append(holding, n)
		}
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range holding {
		wg.Go(func() {
			err := n.dialer.drain(ctx)
			if err == nil {
				return
			}
			n.log.Warn("cannot drain this node; closing its sessions here", "error", err)
			l.mu.Lock()
			defer l.mu.Unlock()
			l.evictLocked(n, -1)
			l.notifyLocked()
		})
	}
	wg.Wait()
}
